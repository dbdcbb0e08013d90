"""Data written by tests: image folders whose pixels encode each image's index, and a reader of
that index back from a loaded batch (so a test can tell exactly which samples a loader served)."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from torchvision.io import encode_png

SIZE = 8


def indexed_image(index: int, label: int) -> torch.Tensor:
    """A uint8 ``(1, 8, 8)`` image: pixels (0, 0) and (0, 1) hold ``index``, the rest its label."""
    image = torch.full((1, SIZE, SIZE), 20 * label, dtype=torch.uint8)
    image[0, 0, 0], image[0, 0, 1] = index // 256, index % 256
    return image


def write_indexed_folder(root: Path, num_images: int, num_classes: int = 4) -> Path:
    """``root/class_k/img_i.png`` for i < num_images, class i % num_classes."""
    for index in range(num_images):
        label = index % num_classes
        folder = root / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img_{index:05d}.png").write_bytes(encode_png(indexed_image(index, label)).numpy().tobytes())
    return root


def indices_of(images: torch.Tensor) -> list[int]:
    """The indices encoded in a batch of unnormalized ``(N, 1, H, W)`` images in [0, 1]."""
    pixels = (images[:, 0, 0, :2] * 255).round().long()
    return (pixels[:, 0] * 256 + pixels[:, 1]).tolist()


def served(loader, limit: int | None = None) -> list[int]:
    """Indices of the samples the loader hands out (all remaining batches, or ``limit`` of them)."""
    out: list[int] = []
    for images, _ in itertools.islice(loader, limit):  # as the trainer stops: no batch taken beyond
        out.extend(indices_of(images))
    return out
