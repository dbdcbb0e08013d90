"""AugMix: mix each image with blended chains of augmentations. Method card: api/method_cards/augmix.md."""

from algorithms.augmix.augmix import AugMix, AugmentAndMixTransform, augmix_image
from algorithms.augmix.primitives import augmentation_sets

__all__ = ["AugMix", "AugmentAndMixTransform", "augmentation_sets", "augmix_image"]
