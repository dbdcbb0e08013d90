"""SqueezeExcite (Hu et al. 2018): rescale each channel of a convolution's output by a gate
computed from the whole image.

After every ``Conv2d`` with ``min(in_channels, out_channels) >= min_channels`` a
Squeeze-and-Excitation block is inserted: global average pool -> Linear(C, latent) -> ReLU ->
Linear(latent, C) -> sigmoid, and the output channels are multiplied by those C gates. Module
and parameter names match Composer's (``conv``, ``se.pool_and_mlp.{2,4}.weight``), so state
dicts move between the two.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import torch
import torch.nn as nn

from algorithms.base import Algorithm, AlgorithmState, NoEffectWarning
from algorithms.events import Event
from algorithms.surgery import replace_modules


def latent_size(num_features: int, latent_channels: float) -> int:
    """``latent_channels`` itself if >= 1, else that fraction of ``num_features``; at least 1."""
    return max(1, int(latent_channels if latent_channels >= 1 else latent_channels * num_features))


class SqueezeExcite2d(nn.Module):
    """Multiplies each channel of ``x`` (N, C, H, W) by a gate in (0, 1) from the pooled image."""

    def __init__(self, num_features: int, latent_channels: float = 0.125):
        super().__init__()
        self.latent_channels = latent_size(num_features, latent_channels)
        self.pool_and_mlp = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(num_features, self.latent_channels, bias=False), nn.ReLU(),
            nn.Linear(self.latent_channels, num_features, bias=False), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c = x.shape[:2]
        return x * self.pool_and_mlp(x).reshape(n, c, 1, 1)


class SqueezeExciteConv2d(nn.Module):
    """A convolution (the original module, same ``Parameter`` objects) followed by an SE block."""

    def __init__(self, conv: nn.Conv2d, latent_channels: float = 0.125):
        super().__init__()
        self.conv = conv
        self.se = SqueezeExcite2d(conv.out_channels, latent_channels).to(device=conv.weight.device,
                                                                         dtype=conv.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se(self.conv(x))


def apply_squeeze_excite(model: nn.Module, latent_channels: float = 64, min_channels: int = 128,
                         optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None
                         ) -> nn.Module:
    """Add an SE block after every ``Conv2d`` with at least ``min_channels`` input and output channels.

    Composer's name and signature (Composer returns None; this returns the model). In place;
    new parameters join ``optimizers``' group of the convolution they follow. A second call
    changes nothing. Warns ``NoEffectWarning`` if no convolution qualifies.
    """
    if not latent_channels > 0:
        raise ValueError(f"latent_channels {latent_channels} must be > 0 (a count >= 1 or a fraction < 1)")
    if min_channels < 1:
        raise ValueError(f"min_channels {min_channels} must be >= 1")
    done = {id(m.conv) for m in model.modules() if isinstance(m, SqueezeExciteConv2d)}

    def convert(conv: nn.Module) -> nn.Module | None:
        if id(conv) in done or min(conv.in_channels, conv.out_channels) < min_channels:
            return None
        return SqueezeExciteConv2d(conv, latent_channels)
    replaced = replace_modules(model, {nn.Conv2d: convert}, optimizers=optimizers)
    if not replaced:
        warnings.warn(NoEffectWarning(
            f"SqueezeExcite found no Conv2d with >= {min_channels} input and output channels in "
            f"{type(model).__name__}; it changes nothing"))
    return model


class SqueezeExcite(Algorithm):
    """Adds SE blocks after the wide convolutions at INIT, before wrapping."""

    name = "squeeze_excite"
    events = frozenset({Event.INIT})
    changes_model = True

    def __init__(self, latent_channels: float = 64, min_channels: int = 128):
        if not latent_channels > 0:
            raise ValueError(f"latent_channels {latent_channels} must be > 0")
        self.latent_channels, self.min_channels = latent_channels, min_channels

    def apply(self, event: Event, state: AlgorithmState) -> None:
        apply_squeeze_excite(state.model, self.latent_channels, self.min_channels,
                             optimizers=getattr(state, "optimizer", None))
