"""RandAugment: a few random augmentations per image. Method card: api/method_cards/randaugment.md."""

from algorithms.randaugment.randaugment import RandAugment, RandAugmentTransform, randaugment_image

__all__ = ["RandAugment", "RandAugmentTransform", "randaugment_image"]
