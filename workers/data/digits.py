"""scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes).

A fixed stratified 80/20 split gives 1437 training and 360 test images on every machine.
Pixels (0..16) are scaled to [0, 1], upsampled (bilinear) to ``image_size`` so CIFAR-sized
models apply, and normalized with the training split's mean and std.
"""

from __future__ import annotations

import torch

from workers.data.images import normalize, resize

SPLIT_SEED = 0  # fixed: the train/test split must not depend on the run's seed


def load_digits(split: str = "train", image_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images (N, 1, image_size, image_size) float32, labels (N,) int64)`` of ``split``."""
    from sklearn.datasets import load_digits as sk_load_digits  # import lazily: sklearn is slow to import
    from sklearn.model_selection import train_test_split

    bunch = sk_load_digits()
    images = torch.from_numpy(bunch.images).float().div_(16.0).unsqueeze(1)
    labels = torch.from_numpy(bunch.target).long()
    index = torch.arange(len(labels)).numpy()
    train_index, test_index = train_test_split(index, test_size=0.2, random_state=SPLIT_SEED,
                                               stratify=bunch.target)
    images = resize(images, image_size)
    # Statistics of the training split at the chosen size (upsampling smooths, so the std
    # depends on image_size); test images use the same pair.
    train_images = images[torch.from_numpy(train_index)]
    mean, std = train_images.mean().item(), train_images.std().item()
    chosen = torch.from_numpy(train_index if split == "train" else test_index)
    return normalize(images[chosen], mean, std), labels[chosen]
