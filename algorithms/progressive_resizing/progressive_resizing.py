"""ProgressiveResizing: train on downscaled images first, growing them to full size.

The scale follows Composer's schedule of training progress ``t``: ``initial_scale`` until
``delay_fraction``, then a linear ramp reaching 1 at ``1 - finetune_fraction``, then full size.
The width is rounded to a multiple of ``size_increment`` pixels. Unlike Composer's (which reads
the elapsed fraction of ``max_duration`` and so, with an ``"Nep"`` duration, only moves at epoch
boundaries), progress here is counted in batches, so the scale moves every batch whatever the
unit of ``max_duration``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event

MODES = ("resize", "crop")


def resize_batch(input: torch.Tensor, target: torch.Tensor, scale_factor: float, mode: str = "resize",
                 resize_targets: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Shrink images ``(N, C, H, W)`` to ``floor(scale_factor * H) x floor(scale_factor * W)``.

    Composer 0.32's signature and results: ``mode="resize"`` is nearest-neighbour downsampling
    (``F.interpolate(..., mode="nearest")``), ``mode="crop"`` one random crop for the whole
    batch. ``resize_targets`` applies the same to dense (e.g. segmentation) targets. A factor
    >= 1 returns the inputs unchanged.
    """
    if input.dim() < 3:
        raise ValueError(f"resize_batch needs images of shape (N, C, H, W); got shape {tuple(input.shape)}")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} must be one of {MODES}")
    if resize_targets and target.dim() < 3:
        raise ValueError(f"resize_targets needs targets with spatial dims; got shape {tuple(target.shape)}")
    if scale_factor >= 1:
        return input, target
    if mode == "crop":
        height, width = input.shape[-2:]
        crop_h, crop_w = int(scale_factor * height), int(scale_factor * width)
        top = int(torch.randint(0, height - crop_h + 1, (1,)))
        left = int(torch.randint(0, width - crop_w + 1, (1,)))
        cropped = input[..., top:top + crop_h, left:left + crop_w]
        if resize_targets:
            t_h, t_w = target.shape[-2:]
            t_top, t_left = int(t_h / height * top), int(t_w / width * left)
            target = target[..., t_top:t_top + int(scale_factor * t_h), t_left:t_left + int(scale_factor * t_w)]
        return cropped, target
    resized = _nearest(input, scale_factor)
    return resized, (_nearest(target, scale_factor) if resize_targets else target)


def _nearest(x: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """Nearest-neighbour downsampling, equal to ``F.interpolate(x, scale_factor=s, mode="nearest",
    recompute_scale_factor=False)``: output pixel ``i`` reads input pixel ``floor(i / s)``."""
    inverse = 1.0 / scale_factor
    if x.is_floating_point() and not float(inverse).is_integer():
        return F.interpolate(x, scale_factor=scale_factor, mode="nearest", recompute_scale_factor=False)
    if float(inverse).is_integer():
        # An integer ratio picks every k-th pixel: a strided copy, no index arithmetic; the copy
        # keeps the input's memory format, like interpolate.
        step = int(inverse)
        out_h, out_w = int(x.shape[-2] * scale_factor), int(x.shape[-1] * scale_factor)
        return x[..., :out_h * step:step, :out_w * step:step].clone(memory_format=torch.preserve_format)
    # Integer targets (segmentation masks) with a non-integer ratio: gather rows and columns.
    height, width = x.shape[-2:]
    rows = (torch.arange(int(height * scale_factor), device=x.device) * inverse).long().clamp_(max=height - 1)
    cols = (torch.arange(int(width * scale_factor), device=x.device) * inverse).long().clamp_(max=width - 1)
    return x.index_select(-2, rows).index_select(-1, cols)


def scale_at(progress: float, initial_scale: float = 0.5, delay_fraction: float = 0.5,
             finetune_fraction: float = 0.2) -> float:
    """Composer's schedule: the image scale at training progress ``progress`` in [0, 1]."""
    if progress < delay_fraction:
        return initial_scale
    ramp = 1.0 - finetune_fraction - delay_fraction
    done = 1.0 if ramp <= 0 else min((progress - delay_fraction) / ramp, 1.0)
    return initial_scale + (1.0 - initial_scale) * done


def pinned_scale(scale: float, width: int, size_increment: int) -> float:
    """``scale`` rounded so the scaled width is a multiple of ``size_increment`` (at least one)."""
    pinned_width = max(round(width * scale / size_increment) * size_increment, min(size_increment, width))
    return pinned_width / width


class ProgressiveResizing(Algorithm):
    """Shrinks each training batch at AFTER_DATALOADER by the schedule's scale for the current
    batch. Evaluation sees full-size images, so the model must accept any input size."""

    name = "progressive_resizing"
    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(self, mode: str = "resize", initial_scale: float = 0.5, finetune_fraction: float = 0.2,
                 delay_fraction: float = 0.5, size_increment: int = 4, resize_targets: bool = False):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} must be one of {MODES}")
        if not 0.0 < initial_scale <= 1.0:
            raise ValueError(f"initial_scale {initial_scale} must lie in (0, 1]")
        if not (0.0 <= finetune_fraction <= 1.0 and 0.0 <= delay_fraction <= 1.0
                and delay_fraction + finetune_fraction <= 1.0):
            raise ValueError(f"delay_fraction {delay_fraction} + finetune_fraction {finetune_fraction} must lie in [0, 1]")
        if size_increment < 1:
            raise ValueError(f"size_increment {size_increment} must be >= 1")
        self.mode, self.initial_scale = mode, initial_scale
        self.finetune_fraction, self.delay_fraction = finetune_fraction, delay_fraction
        self.size_increment, self.resize_targets = size_increment, resize_targets

    def scale_for(self, progress: float, width: int) -> float:
        """The (pinned) scale applied to a batch of images ``width`` pixels wide at ``progress``."""
        scale = scale_at(progress, self.initial_scale, self.delay_fraction, self.finetune_fraction)
        return pinned_scale(scale, width, self.size_increment)

    def apply(self, event: Event, state: AlgorithmState) -> None:
        scale = self.scale_for(state.progress, state.inputs.shape[-1])
        state.inputs, state.targets = resize_batch(state.inputs, state.targets, scale, self.mode,
                                                   self.resize_targets)
