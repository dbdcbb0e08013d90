"""MixUp: convex combinations of pairs of examples and their targets. Method card: api/method_cards/mixup.md."""

from algorithms.mixup.mixup import MixUp, mixup_batch, mixup_targets

__all__ = ["MixUp", "mixup_batch", "mixup_targets"]
