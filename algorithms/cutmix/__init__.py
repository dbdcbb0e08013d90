"""CutMix: paste a box from another image, mix targets by area. Method card: api/method_cards/cutmix.md."""

from algorithms.cutmix.cutmix import CutMix, cutmix_batch, mix_targets

__all__ = ["CutMix", "cutmix_batch", "mix_targets"]
