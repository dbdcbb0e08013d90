"""BlurPool: anti-aliased strided convolutions and max-pools. Method card: api/method_cards/blurpool.md."""

from algorithms.blurpool.blurpool import BlurConv2d, BlurMaxPool2d, BlurPool, apply_blurpool, binomial_filter, blur_2d

__all__ = ["BlurConv2d", "BlurMaxPool2d", "BlurPool", "apply_blurpool", "binomial_filter", "blur_2d"]
