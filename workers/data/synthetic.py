"""Class-conditional Gaussian images: learnable, any shape, no files.

Each class has a fixed mean image (smooth: random 4x4 patterns upsampled) drawn from a fixed
seed, so the task is the same for every run and split; examples add Gaussian noise of std
``noise``. Train and test draw their noise and labels from different seeds, so the splits are
disjoint samples of the same distribution.
"""

from __future__ import annotations

import torch

from workers.data.images import resize

MEANS_SEED = 20_161_201
SPLIT_SEEDS = {"train": 1, "test": 2}


def make_synthetic(split: str = "train", num_samples: int = 1024, num_classes: int = 10, channels: int = 3,
                   image_size: int = 32, noise: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images (N, channels, image_size, image_size) float32, labels (N,) int64)``."""
    means_gen = torch.Generator().manual_seed(MEANS_SEED)
    coarse = torch.randn(num_classes, channels, 4, 4, generator=means_gen)
    means = resize(coarse, image_size)
    split_gen = torch.Generator().manual_seed(MEANS_SEED + SPLIT_SEEDS[split])
    labels = torch.randint(num_classes, (num_samples,), generator=split_gen)
    images = means[labels] + noise * torch.randn(num_samples, channels, image_size, image_size, generator=split_gen)
    return images.contiguous(), labels
