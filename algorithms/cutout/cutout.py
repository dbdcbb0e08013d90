"""CutOut: zero one or more square holes of every image in the batch.

As in Composer, each hole's centre is drawn once per batch, so every image of the batch loses
the same square; its side is ``int(length * min(H, W))`` and it is clipped at the borders. The
hole positions are host-side integers from torch's global CPU generator (no device sync); the
zeroing is one batched write on the input's device.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from PIL import Image

from algorithms import images
from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event

Box = tuple[int, int, int, int]  # (top, left, bottom, right): rows top:bottom, columns left:right
ImgT = TypeVar("ImgT", torch.Tensor, Image.Image)


def cutout_batch(input: ImgT, num_holes: int = 1, length: float = 0.5, uniform_sampling: bool = False) -> ImgT:
    """A copy of ``input`` ``(..., H, W)`` or of a PIL image (any mode) with ``num_holes``
    squares of side ``int(length * min(H, W))`` set to zero, at the same place in every image.

    Composer 0.32's signature and types: a PIL image comes back as a PIL image of the same mode
    and size, pixels outside the holes exactly as they were. ``uniform_sampling`` lets a centre fall up to half a side outside
    the image, so every pixel is equally likely to be cut (the default under-cuts the borders).
    """
    if num_holes < 0:
        raise ValueError(f"num_holes {num_holes} must be >= 0")
    if not 0.0 <= length <= 1.0:
        raise ValueError(f"length {length} must lie in [0, 1]")
    if images.is_pil(input):
        array = images.pil_array(input).copy()
        for top, left, bottom, right in cutout_boxes(input.height, input.width, num_holes, length, uniform_sampling):
            array[top:bottom, left:right] = 0
        return images.array_to_pil(array, like=input)
    height, width = input.shape[-2:]
    out = input.clone()  # keeps the memory format
    for top, left, bottom, right in cutout_boxes(height, width, num_holes, length, uniform_sampling):
        out[..., top:bottom, left:right] = 0
    return out


def cutout_boxes(height: int, width: int, num_holes: int = 1, length: float = 0.5,
                 uniform_sampling: bool = False) -> list[Box]:
    """The clipped holes ``cutout_batch`` cuts, drawn from torch's global CPU generator."""
    side = int(min(height, width) * length)
    boxes = []
    for _ in range(num_holes):
        margin = side // 2 if uniform_sampling else 0
        cy = int(torch.randint(-margin, height + margin, (1,)))
        cx = int(torch.randint(-margin, width + margin, (1,)))
        top, bottom = min(max(cy - side // 2, 0), height), min(max(cy + side // 2, 0), height)
        left, right = min(max(cx - side // 2, 0), width), min(max(cx + side // 2, 0), width)
        boxes.append((top, left, bottom, right))
    return boxes


class CutOut(Algorithm):
    """Cuts holes in each training batch at AFTER_DATALOADER; targets are unchanged."""

    name = "cutout"
    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(self, num_holes: int = 1, length: float = 0.5, uniform_sampling: bool = False):
        if num_holes < 1:
            raise ValueError(f"num_holes {num_holes} must be >= 1")
        if not 0.0 < length <= 1.0:
            raise ValueError(f"length {length} must lie in (0, 1]")
        self.num_holes, self.length, self.uniform_sampling = num_holes, length, uniform_sampling

    def apply(self, event: Event, state: AlgorithmState) -> None:
        state.inputs = cutout_batch(state.inputs, self.num_holes, self.length, self.uniform_sampling)
