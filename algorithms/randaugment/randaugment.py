"""RandAugment (Cubuk et al. 2020): apply ``depth`` operations drawn uniformly from a set, each
at strength ``severity``, to every training image.

Two hyperparameters replace AutoAugment's learned policies. The operations are AugMix's
primitives (``algorithms.augmix.primitives``: the same sets ``all``, ``safe``, ``original``), as
in Composer. A per-example augmentation: the Algorithm installs the transform in the training
data's per-sample transforms at ``FIT_START``; draws come from torch's RNG, which the checkpoint
holds, so resumed runs augment identically.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import torch
from PIL import Image

from algorithms import images
from algorithms.augmix.primitives import augmentation_sets
from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event

AugmentationFn = Callable[[torch.Tensor, float], torch.Tensor]
ImgT = TypeVar("ImgT", torch.Tensor, Image.Image)


def randaugment_image(img: ImgT, severity: int = 9, depth: int = 2,
                      augmentation_set: Sequence[AugmentationFn] = augmentation_sets["all"]) -> ImgT:
    """``depth`` random operations of ``augmentation_set`` at ``severity`` on one image ``(C, H, W)``
    (float in [0, 1] or uint8) or PIL image (mode ``L`` or ``RGB``), or on each image of a batch
    ``(N, C, H, W)``.

    Composer's signature and types: PIL in, PIL of the same mode and size out; tensor in, tensor
    of the same shape and dtype out. ``depth = 0`` returns the image unchanged, as Composer's.
    """
    if images.is_pil(img):
        pixels = images.pil_to_uint8(img, "randaugment_image img")
        return images.uint8_to_pil(randaugment_image(pixels, severity, depth, augmentation_set), img.mode)
    if img.dim() == 4:
        return torch.stack([randaugment_image(i, severity, depth, augmentation_set) for i in img])
    for _ in range(depth):
        op = augmentation_set[int(torch.randint(len(augmentation_set), (1,)))]
        img = op(img, severity)
    return img


def _check(severity: int, depth: int, augmentation_set: str) -> None:
    if not 0 <= severity <= 10:
        raise ValueError(f"severity {severity} must lie in [0, 10]")
    if depth < 0:
        raise ValueError(f"depth {depth} must be >= 0")
    if augmentation_set not in augmentation_sets:
        raise ValueError(f"augmentation_set {augmentation_set!r} must be one of {sorted(augmentation_sets)}")


class RandAugmentTransform(torch.nn.Module):
    """A torchvision-style transform applying ``randaugment_image``; usable in ``transforms.Compose``."""

    def __init__(self, severity: int = 9, depth: int = 2, augmentation_set: str = "all"):
        super().__init__()
        _check(severity, depth, augmentation_set)
        self.severity, self.depth = severity, depth
        self.augmentation_set = augmentation_sets[augmentation_set]

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return randaugment_image(img, self.severity, self.depth, self.augmentation_set)


class _Rescaled:
    """For normalized images (Tessera's data sets): map each image to [0, 1] by its own min and
    max, augment, map back, so the primitives see the range they expect."""

    def __init__(self, transform: RandAugmentTransform):
        self.transform = transform

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        low, high = image.min(), image.max()
        span = (high - low).clamp_min(1e-12)
        return self.transform((image - low) / span) * span + low


class RandAugment(Algorithm):
    """Installs a RandAugment transform in the training data's per-sample transforms at FIT_START."""

    name = "randaugment"
    events = frozenset({Event.FIT_START})

    def __init__(self, severity: int = 9, depth: int = 2, augmentation_set: str = "all"):
        _check(severity, depth, augmentation_set)
        self.severity, self.depth, self.augmentation_set = severity, depth, augmentation_set
        self._transform = _Rescaled(RandAugmentTransform(severity, depth, augmentation_set))

    def apply(self, event: Event, state: AlgorithmState) -> None:
        if self._transform not in state.sample_transforms:  # a second fit must not add it twice
            state.sample_transforms.append(self._transform)
