"""CutOut: zero square holes of the images. Method card: api/method_cards/cutout.md."""

from algorithms.cutout.cutout import CutOut, cutout_batch, cutout_boxes

__all__ = ["CutOut", "cutout_batch", "cutout_boxes"]
