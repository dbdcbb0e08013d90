"""scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes).

A fixed stratified 80/20 split gives 1437 training and 360 test images on every machine.
Pixels (0..16) are scaled to [0, 1], upsampled (bilinear) to ``image_size`` so CIFAR-sized
models apply, and normalized with the training split's mean and std.
"""

from __future__ import annotations

import torch

from workers.data.images import normalize, resize

SPLIT_SEED = 0  # fixed: the train/test split must not depend on the run's seed
PIXEL_MAX = 16.0  # scikit-learn's digits are 0..16


def load_digits(split: str = "train", image_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images (N, 1, image_size, image_size) float32, labels (N,) int64)`` of ``split``."""
    images, labels, train_index, test_index = _scaled(image_size)
    mean, std = _statistics(images, train_index)
    chosen = train_index if split == "train" else test_index
    return normalize(images[chosen], mean, std), labels[chosen]


def digits_statistics(image_size: int) -> tuple[float, float]:
    """The (mean, std) ``load_digits`` normalizes with at ``image_size``: what a model trained on
    it expects of new images (``workers.data.inference``)."""
    images, _, train_index, _ = _scaled(image_size)
    return _statistics(images, train_index)


def _scaled(image_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every image scaled to [0, 1] and resized, the labels, and the split's indices."""
    from sklearn.datasets import load_digits as sk_load_digits  # import lazily: sklearn is slow to import
    from sklearn.model_selection import train_test_split

    bunch = sk_load_digits()
    images = torch.from_numpy(bunch.images).float().div_(PIXEL_MAX).unsqueeze(1)
    labels = torch.from_numpy(bunch.target).long()
    index = torch.arange(len(labels)).numpy()
    train_index, test_index = train_test_split(index, test_size=0.2, random_state=SPLIT_SEED,
                                               stratify=bunch.target)
    return resize(images, image_size), labels, torch.from_numpy(train_index), torch.from_numpy(test_index)


def _statistics(images: torch.Tensor, train_index: torch.Tensor) -> tuple[float, float]:
    # Statistics of the training split at the chosen size (upsampling smooths, so the std
    # depends on image_size); test images use the same pair.
    train_images = images[train_index]
    return train_images.mean().item(), train_images.std().item()
