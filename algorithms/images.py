"""PIL images in, PIL images out, for the functional forms Composer also lets take PIL images.

Data read from an image folder arrives as ``PIL.Image.Image`` objects, and Composer's
``augmix_image``, ``randaugment_image``, ``colout_batch`` and ``cutout_batch`` accept them and
return them. Ours do the same through these helpers: a PIL image becomes an array or tensor of
its pixels, the same code as for tensors runs, and the result goes back to a PIL image of the
same mode (and palette). The pixels keep their own representation (no float round trip), so
untouched pixels come back exactly. Tensors never pass through here: the tensor path costs
nothing extra.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

# Modes whose pixels are 8-bit channels, so the augmentation primitives (written for uint8 or
# [0, 1] float images of 1 or 3 channels) mean the same on them as on tensors.
AUGMENTABLE_MODES = ("L", "RGB")


def is_pil(image: Any) -> bool:
    return isinstance(image, Image.Image)


def pil_to_uint8(image: Image.Image, field: str) -> torch.Tensor:
    """The pixels of an ``L`` or ``RGB`` image as a ``(C, H, W)`` uint8 tensor (a copy)."""
    if image.mode not in AUGMENTABLE_MODES:
        raise ValueError(f"{field}: a PIL image of mode {image.mode!r} cannot be augmented; allowed modes are "
                         f"{list(AUGMENTABLE_MODES)} (convert it first, e.g. image.convert('RGB'))")
    pixels = torch.from_numpy(np.array(image, dtype=np.uint8))
    return pixels[None] if pixels.dim() == 2 else pixels.permute(2, 0, 1).contiguous()


def uint8_to_pil(pixels: torch.Tensor, mode: str) -> Image.Image:
    """The inverse of ``pil_to_uint8``: a ``(C, H, W)`` uint8 tensor as a PIL image of ``mode``."""
    array = pixels.permute(1, 2, 0).numpy()
    return Image.fromarray(np.ascontiguousarray(array[..., 0] if mode == "L" else array))


def pil_array(image: Image.Image) -> np.ndarray:
    """Any PIL image's pixels as an ``(H, W)`` or ``(H, W, C)`` array (rows and columns only are
    touched by ColOut and CutOut, so every mode works, palette images included)."""
    return np.asarray(image)


def array_to_pil(array: np.ndarray, like: Image.Image) -> Image.Image:
    """``array`` (rows/columns of ``like``'s pixels) as a PIL image of ``like``'s mode and palette."""
    array = np.ascontiguousarray(array)
    if like.mode == "1":  # numpy sees a bilevel image as bool; PIL stores it packed
        return Image.fromarray(array.astype(np.uint8) * 255).convert("1")
    height, width = array.shape[:2]
    out = Image.frombytes(like.mode, (width, height), array.tobytes())
    if like.mode in ("P", "PA"):
        out.putpalette(like.getpalette())
        if "transparency" in like.info:
            out.info["transparency"] = like.info["transparency"]
    return out
