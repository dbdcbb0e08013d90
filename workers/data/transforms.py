"""Decoding image bytes with torchvision and the per-sample transforms of a ``TransformsSpec``.

Random choices (crop offsets, flips) come from a ``numpy`` generator passed in by the loader,
which seeds it from the run's seed and the sample's place in the epoch, so the same sample in
the same epoch is transformed the same way on a resumed run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.io import ImageReadMode, decode_image

from workers.data.errors import DataError

_MODES = {1: ImageReadMode.GRAY, 3: ImageReadMode.RGB}


def decode(data: bytes, *, channels: int, where: str) -> torch.Tensor:
    """``(channels, H, W)`` uint8 from encoded bytes (PNG, JPEG, GIF, WebP); ``where`` names the
    sample in the error."""
    try:
        return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=_MODES[channels])
    except Exception as exn:  # torchvision raises RuntimeError with a codec message
        raise DataError(f"{where}: cannot decode the image ({len(data)} bytes): {exn}; expected PNG, JPEG, GIF "
                        "or WebP bytes") from None


class SampleTransform:
    """uint8 ``(C, H, W)`` → float32, resized, cropped, flipped and normalized as the spec says."""

    def __init__(self, spec: Any, *, train: bool):
        self.resize, self.crop = spec.resize, spec.crop
        self.hflip = spec.hflip and train
        self.train = train
        norm = spec.normalize
        self.mean = None if norm is None else torch.tensor(norm.mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = None if norm is None else torch.tensor(norm.std, dtype=torch.float32).view(-1, 1, 1)

    @staticmethod
    def draws() -> int:
        """Random numbers each sample consumes (a fixed count, so skipping samples stays cheap)."""
        return 3

    def __call__(self, image: torch.Tensor, rng: np.random.Generator | None) -> torch.Tensor:
        u = rng.random(self.draws()) if rng is not None else np.full(self.draws(), 0.5)
        x = image.float().div_(255.0).unsqueeze(0)
        if self.resize is not None:
            h, w = x.shape[-2:]
            scale = self.resize / min(h, w)
            size = (max(1, round(h * scale)), max(1, round(w * scale)))
            if size != (h, w):
                x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=scale < 1)
        if self.crop is not None:
            x = self._crop(x, u[0], u[1])
        if self.hflip and u[2] < 0.5:
            x = x.flip(-1)
        x = x.squeeze(0)
        if self.mean is not None:
            x = (x - self.mean) / self.std
        return x.contiguous()

    def _crop(self, x: torch.Tensor, uy: float, ux: float) -> torch.Tensor:
        size = self.crop
        h, w = x.shape[-2:]
        if h < size or w < size:  # pad small images (zeros) up to the crop
            x = F.pad(x, (0, max(0, size - w), 0, max(0, size - h)))
            h, w = x.shape[-2:]
        if self.train:
            top, left = int(uy * (h - size + 1)), int(ux * (w - size + 1))
        else:
            top, left = (h - size) // 2, (w - size) // 2
        return x[..., top:top + size, left:left + size]


def collate(images: list[torch.Tensor], labels: list[int], *, where: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack one batch; images of different sizes get an error naming two of them."""
    first = images[0].shape
    for image, name in zip(images, where):
        if image.shape != first:
            raise DataError(f"{name} is {tuple(image.shape)} after transforms but {where[0]} is {tuple(first)}; "
                            "images in a batch must have one size: set data.*.transforms.resize and crop")
    return torch.stack(images), torch.tensor(labels, dtype=torch.int64)
