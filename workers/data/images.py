"""Small shared steps for image tensors: resizing and normalization."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of ``(N, C, H, W)`` float images to ``size x size`` (no-op if equal)."""
    if images.shape[-2:] == (size, size):
        return images
    # antialias only matters when shrinking; bilinear upsampling is what the catalog promises.
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False,
                         antialias=size < images.shape[-1])


def normalize(images: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """``(images - mean) / std`` as a new contiguous float32 tensor."""
    return ((images - mean) / std).float().contiguous()
