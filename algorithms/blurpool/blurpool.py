"""BlurPool: anti-aliased downsampling (Zhang 2019).

A strided convolution or a max-pool samples its input at a lower rate without low-pass
filtering it first, so small shifts of the input change the output a lot (aliasing). BlurPool
inserts a fixed 3x3 binomial blur, ``[1 2 1]^T [1 2 1] / 16`` per channel:

- a strided ``Conv2d`` (with at least ``min_channels`` input channels) becomes blur -> conv
  (``blur_first``, the cheap order) or conv at stride 1 -> blur with the stride (the paper's
  order, about stride^2 times the convolution's cost);
- ``MaxPool2d(k, s)`` becomes max over k x k at stride 1 -> blur with stride s.

The replaced convolutions keep their ``Parameter`` objects, so an optimizer built before the
surgery still optimizes them (``optimizers=`` is accepted for API parity and to be safe).
"""

from __future__ import annotations

import warnings
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.utils import _pair

from algorithms.base import Algorithm, AlgorithmState, NoEffectWarning
from algorithms.events import Event
from algorithms.surgery import replace_modules


def binomial_filter(channels: int, *, device: torch.device | None = None, dtype: torch.dtype | None = None
                    ) -> torch.Tensor:
    """The depthwise 3x3 blur ``(channels, 1, 3, 3)``: outer product of [1, 2, 1] / 4 with itself."""
    row = torch.tensor([1.0, 2.0, 1.0], device=device, dtype=dtype or torch.float32) / 4.0
    return (row[:, None] * row[None, :]).expand(channels, 1, 3, 3).contiguous()


def blur_2d(x: torch.Tensor, filt: torch.Tensor | None = None, *, stride: int | tuple[int, int] = 1) -> torch.Tensor:
    """Blur each channel of ``x`` (N, C, H, W) with ``filt`` (C, 1, 3, 3), zero-padded to keep the size at stride 1."""
    if filt is None:
        filt = binomial_filter(x.shape[1], device=x.device, dtype=x.dtype)
    return F.conv2d(x, filt.to(x.dtype), stride=_pair(stride), padding=1, groups=x.shape[1])


class BlurMaxPool2d(nn.Module):
    """Max over each ``kernel_size`` window at stride 1, then a blur that downsamples by ``stride``."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.dilation, self.ceil_mode = padding, dilation, ceil_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        maxes = F.max_pool2d(x, self.kernel_size, stride=1, padding=self.padding, dilation=self.dilation,
                             ceil_mode=self.ceil_mode)
        return blur_2d(maxes, stride=self.stride)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"

    @classmethod
    def from_maxpool2d(cls, pool: nn.MaxPool2d) -> "BlurMaxPool2d":
        if pool.return_indices:
            raise ValueError("BlurPool cannot replace a MaxPool2d with return_indices=True")
        return cls(pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)


class BlurConv2d(nn.Module):
    """A strided convolution with a blur before it (``blur_first``) or after it at stride 1.

    ``conv`` shares the original layer's weight and bias ``Parameter`` objects.
    """

    def __init__(self, conv: nn.Conv2d, *, blur_first: bool = True):
        super().__init__()
        self.blur_first = blur_first
        self.stride = conv.stride
        if blur_first:
            self.conv = conv
            channels = conv.in_channels
        else:
            # Same parameters, stride 1: the blur does the downsampling.
            self.conv = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, stride=1,
                                  padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                                  bias=conv.bias is not None, padding_mode=conv.padding_mode, device="meta")
            self.conv.weight, self.conv.bias = conv.weight, conv.bias
            channels = conv.out_channels
        # Not persistent: a constant, so checkpoints carry only the convolution's parameters.
        self.register_buffer("blur_filter", binomial_filter(channels, device=conv.weight.device,
                                                            dtype=conv.weight.dtype), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.blur_first:
            return self.conv(blur_2d(x, self.blur_filter))
        return blur_2d(self.conv(x), self.blur_filter, stride=self.stride)


def apply_blurpool(model: nn.Module, replace_convs: bool = True, replace_maxpools: bool = True,
                   blur_first: bool = True, min_channels: int = 16,
                   optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None) -> nn.Module:
    """Replace strided ``Conv2d`` (``in_channels >= min_channels``) and ``MaxPool2d`` with blurred versions.

    Same name and signature as Composer's ``apply_blurpool`` (which returns None; this returns
    the model). Works in place; warns ``NoEffectWarning`` if nothing qualifies.
    """
    policies: dict[type[nn.Module], object] = {}
    if replace_maxpools:
        policies[nn.MaxPool2d] = BlurMaxPool2d.from_maxpool2d
    if replace_convs:
        # A second application must not wrap the convolutions inside BlurConv2d again.
        done = {id(m.conv) for m in model.modules() if isinstance(m, BlurConv2d)}

        def blur_conv(conv: nn.Module) -> nn.Module | None:
            eligible = max(_pair(conv.stride)) > 1 and conv.in_channels >= min_channels and id(conv) not in done
            return BlurConv2d(conv, blur_first=blur_first) if eligible else None
        policies[nn.Conv2d] = blur_conv
    replaced = replace_modules(model, policies, optimizers=optimizers)  # type: ignore[arg-type]
    if not replaced:
        warnings.warn(NoEffectWarning(
            f"BlurPool found no strided Conv2d with >= {min_channels} input channels and no MaxPool2d in "
            f"{type(model).__name__} (replace_convs={replace_convs}, replace_maxpools={replace_maxpools}); "
            "it changes nothing"))
    return model


class BlurPool(Algorithm):
    """Blurs the model's strided convolutions and max-pools at INIT, before wrapping."""

    name = "blurpool"
    events = frozenset({Event.INIT})
    changes_model = True

    def __init__(self, replace_convs: bool = True, replace_maxpools: bool = True, blur_first: bool = True,
                 min_channels: int = 16):
        if not (replace_convs or replace_maxpools):
            raise ValueError("replace_convs and replace_maxpools are both False: BlurPool would change nothing")
        self.replace_convs, self.replace_maxpools = replace_convs, replace_maxpools
        self.blur_first, self.min_channels = blur_first, min_channels

    def apply(self, event: Event, state: AlgorithmState) -> None:
        apply_blurpool(state.model, replace_convs=self.replace_convs, replace_maxpools=self.replace_maxpools,
                       blur_first=self.blur_first, min_channels=self.min_channels,
                       optimizers=getattr(state, "optimizer", None))


__all__ = ["BlurConv2d", "BlurMaxPool2d", "BlurPool", "apply_blurpool", "binomial_filter", "blur_2d"]
