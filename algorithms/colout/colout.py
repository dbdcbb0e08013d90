"""ColOut: drop a random fraction of the rows and columns of each image.

Dropping ``p_row`` of the rows and ``p_col`` of the columns shrinks the image (a cheaper forward
and backward pass) while keeping the content's extent, unlike a crop. In batch mode (the
default) one set of rows and columns is drawn per batch and dropped on the device; in sample
mode a ``ColOutTransform`` is installed in the training data at ``FIT_START`` and each example
gets its own rows and columns (same counts, so examples still stack into a batch).
"""

from __future__ import annotations

from typing import Any, Union

import torch
from PIL import Image

from algorithms import images
from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event

Img = Union[torch.Tensor, Image.Image]
Sample = Union[Img, tuple[Img, Img]]


def colout_batch(sample: Sample, p_row: float = 0.15, p_col: float = 0.15,
                 resize_target: bool | str = "auto") -> Sample:
    """Drop the same random ``p_row`` of the rows and ``p_col`` of the columns from every image.

    Composer 0.32's signature and types: ``sample`` is images ``(..., H, W)``, a PIL image (any
    mode), or a pair (tuple or list) ``(images, target)`` of either; each part comes back as the
    type it went in as (a PIL image keeps its mode and palette). ``int((1 - p_row) * H)`` rows
    and ``int((1 - p_col) * W)`` columns are kept, in their order, drawn as Composer draws them
    (one ``torch.randperm`` for the rows, then one for the columns), so the same seed drops the
    same rows. With ``resize_target`` (``"auto"``: when the target has the images' spatial size,
    e.g. segmentation masks) the same rows and columns are dropped from the target and the pair
    is returned; otherwise only the images.
    """
    parts = tuple(sample) if isinstance(sample, (tuple, list)) else (sample,)
    if not 1 <= len(parts) <= 2:
        raise ValueError(f"colout_batch sample must be one image or an (images, target) pair; got {len(parts)} items")
    input, target = parts[0], (parts[1] if len(parts) == 2 else None)
    if not (0.0 <= p_row <= 1.0 and 0.0 <= p_col <= 1.0):
        raise ValueError(f"p_row {p_row} and p_col {p_col} must lie in [0, 1]")
    height, width = _spatial_size(input)
    device = input.device if isinstance(input, torch.Tensor) else torch.device("cpu")
    rows = _kept(height, p_row, device)
    cols = _kept(width, p_col, device)
    out = _select(input, rows, cols)
    if _should_resize_target(input, target, resize_target):
        return out, _select(target, rows, cols)
    return out


def _spatial_size(image: Any) -> tuple[int, int]:
    if images.is_pil(image):
        return image.height, image.width
    if not isinstance(image, torch.Tensor) or image.dim() < 2:
        raise ValueError(f"colout_batch images must be tensors (..., H, W) or PIL images; got {type(image).__name__}"
                         + (f" of shape {tuple(image.shape)}" if isinstance(image, torch.Tensor) else ""))
    return tuple(image.shape[-2:])


def _select(image: Img, rows: torch.Tensor, cols: torch.Tensor) -> Img:
    if images.is_pil(image):
        array = images.pil_array(image)
        return images.array_to_pil(array[rows.cpu().numpy()][:, cols.cpu().numpy()], like=image)
    return image.index_select(-2, rows.to(image.device)).index_select(-1, cols.to(image.device))


def _kept(size: int, p_drop: float, device: torch.device) -> torch.Tensor:
    # A random subset of int((1 - p) * size) indices, kept in increasing order, drawn on the
    # device (no host round trip).
    keep = int((1.0 - p_drop) * size)
    return torch.randperm(size, device=device)[:keep].sort().values


def _should_resize_target(input: Img, target: Img | None, resize_target: bool | str) -> bool:
    if isinstance(resize_target, bool):
        if resize_target and target is None:
            raise ValueError("resize_target=True needs a (images, target) pair")
        return resize_target
    if resize_target != "auto":
        raise ValueError(f"resize_target must be a bool or 'auto'; got {resize_target!r}")
    if target is None:
        return False
    if images.is_pil(target):
        return _spatial_size(target) == _spatial_size(input)
    return target.dim() > 2 and tuple(target.shape[-2:]) == _spatial_size(input)


class ColOutTransform:
    """A torchvision-style transform: ``ColOutTransform(p_row, p_col)(image)`` drops rows and
    columns of one image ``(C, H, W)`` or PIL image (or an ``(image, target)`` pair); usable in
    ``transforms.Compose``."""

    def __init__(self, p_row: float = 0.15, p_col: float = 0.15, resize_target: bool | str = "auto"):
        self.p_row, self.p_col, self.resize_target = p_row, p_col, resize_target

    def __call__(self, sample: Sample) -> Sample:
        return colout_batch(sample, self.p_row, self.p_col, self.resize_target)

    def __repr__(self) -> str:
        return f"ColOutTransform(p_row={self.p_row}, p_col={self.p_col})"


class ColOut(Algorithm):
    """Batch mode: drops rows/columns of each training batch at AFTER_DATALOADER. Sample mode
    (``batch=False``): installs a ``ColOutTransform`` in the training data at FIT_START."""

    name = "colout"

    def __init__(self, p_row: float = 0.15, p_col: float = 0.15, batch: bool = True,
                 resize_target: bool | str = "auto"):
        if not (0.0 <= p_row < 1.0 and 0.0 <= p_col < 1.0):
            raise ValueError(f"p_row {p_row} and p_col {p_col} must lie in [0, 1)")
        if resize_target is True and not batch:
            raise ValueError("resize_target=True needs batch mode (the per-sample hook sees images only)")
        self.p_row, self.p_col, self.batch, self.resize_target = p_row, p_col, batch, resize_target
        self.events = frozenset({Event.AFTER_DATALOADER if batch else Event.FIT_START})
        self._transform = ColOutTransform(p_row, p_col, resize_target=False)

    def apply(self, event: Event, state: AlgorithmState) -> None:
        if event is Event.FIT_START:
            if self._transform not in state.sample_transforms:  # a second fit must not add it twice
                state.sample_transforms.append(self._transform)
            return
        result = colout_batch((state.inputs, state.targets), self.p_row, self.p_col, self.resize_target)
        if isinstance(result, tuple):
            state.inputs, state.targets = result
        else:
            state.inputs = result
