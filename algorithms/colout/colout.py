"""ColOut: drop a random fraction of the rows and columns of each image.

Dropping ``p_row`` of the rows and ``p_col`` of the columns shrinks the image (a cheaper forward
and backward pass) while keeping the content's extent, unlike a crop. In batch mode (the
default) one set of rows and columns is drawn per batch and dropped on the device; in sample
mode a ``ColOutTransform`` is installed in the training data at ``FIT_START`` and each example
gets its own rows and columns (same counts, so examples still stack into a batch).
"""

from __future__ import annotations

from typing import Union

import torch

from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event

Sample = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]


def colout_batch(sample: Sample, p_row: float = 0.15, p_col: float = 0.15,
                 resize_target: bool | str = "auto") -> Sample:
    """Drop the same random ``p_row`` of the rows and ``p_col`` of the columns from every image.

    Composer 0.32's signature: ``sample`` is images ``(..., H, W)`` or a pair ``(images,
    target)``. ``int((1 - p_row) * H)`` rows and ``int((1 - p_col) * W)`` columns are kept, in
    their order. With ``resize_target`` (``"auto"``: when the target has the images' spatial
    size, e.g. segmentation masks) the same rows and columns are dropped from the target and
    the pair is returned; otherwise only the images.
    """
    input, target = (sample if isinstance(sample, tuple) else (sample, None))
    if not (0.0 <= p_row <= 1.0 and 0.0 <= p_col <= 1.0):
        raise ValueError(f"p_row {p_row} and p_col {p_col} must lie in [0, 1]")
    height, width = input.shape[-2:]
    rows = _kept(height, p_row, input.device)
    cols = _kept(width, p_col, input.device)
    out = input.index_select(-2, rows).index_select(-1, cols)
    if _should_resize_target(input, target, resize_target):
        return out, target.index_select(-2, rows).index_select(-1, cols)
    return out


def _kept(size: int, p_drop: float, device: torch.device) -> torch.Tensor:
    # A random subset of int((1 - p) * size) indices, kept in increasing order, drawn on the
    # device (no host round trip).
    keep = int((1.0 - p_drop) * size)
    return torch.randperm(size, device=device)[:keep].sort().values


def _should_resize_target(input: torch.Tensor, target: torch.Tensor | None, resize_target: bool | str) -> bool:
    if isinstance(resize_target, bool):
        if resize_target and target is None:
            raise ValueError("resize_target=True needs a (images, target) pair")
        return resize_target
    if resize_target != "auto":
        raise ValueError(f"resize_target must be a bool or 'auto'; got {resize_target!r}")
    return target is not None and target.dim() > 2 and target.shape[-2:] == input.shape[-2:]


class ColOutTransform:
    """A torchvision-style transform: ``ColOutTransform(p_row, p_col)(image)`` drops rows and
    columns of one image ``(C, H, W)`` (or an ``(image, target)`` pair); usable in
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
