"""MixUp: convex combinations of pairs of examples and their targets. See README.md."""

from algorithms.mixup.mixup import MixUp, mixup_batch, mixup_targets

__all__ = ["MixUp", "mixup_batch", "mixup_targets"]
