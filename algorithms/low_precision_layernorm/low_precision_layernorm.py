"""LowPrecisionLayerNorm: run LayerNorm in the autocast dtype (bf16/fp16) instead of fp32.

Autocast runs ``layer_norm`` in fp32 for accuracy; on GPUs the normalization is memory-bound,
so running it on 16-bit inputs, weights and bias (with autocast off inside) halves its memory
traffic. Each ``nn.LayerNorm`` becomes an ``LPLayerNorm`` in place (a subclass: parameters and
names unchanged); outside autocast it is a plain LayerNorm.

The Algorithm acts only where it can help: on a CUDA device with ``amp_bf16``/``amp_fp16``.
On CPU or in fp32 it changes nothing and says so in a "no effect" note on the run (a
``NoEffectWarning``), so one spec runs anywhere. The shared ``LowPrecisionNorm`` below also
serves LowPrecisionGroupNorm.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from algorithms.base import Algorithm, AlgorithmState, NoEffectWarning
from algorithms.events import Event

LOW_PRECISIONS = ("amp_bf16", "amp_fp16")


def _low(tensor: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(dtype)


class LPLayerNorm(nn.LayerNorm):
    """LayerNorm computed in the autocast dtype when autocast is on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        if not torch.is_autocast_enabled(device):
            return super().forward(x)
        dtype = torch.get_autocast_dtype(device)
        with torch.autocast(device, enabled=False):
            return F.layer_norm(x.to(dtype), self.normalized_shape, _low(self.weight, dtype),
                                _low(self.bias, dtype), self.eps)


def low_precision_effective(precision: Any, device: torch.device | str) -> bool:
    """Whether low-precision normalization can speed anything up: 16-bit autocast on CUDA."""
    value = getattr(precision, "value", precision)
    return value in LOW_PRECISIONS and torch.device(device).type == "cuda"


def convert_norms(model: nn.Module, norm_type: type[nn.Module], lp_type: type[nn.Module], precision: Any,
                  what: str) -> nn.Module:
    """Turn every module of exactly ``norm_type`` into ``lp_type`` in place (class swap), if
    ``precision`` is a 16-bit autocast precision; warn ``NoEffectWarning`` when nothing changes
    (no such norm, or precision None -- Composer's default -- or fp32)."""
    value = getattr(precision, "value", precision)
    if value is not None and value not in LOW_PRECISIONS and value != "fp32":
        raise ValueError(f"precision {value!r} is not one of None, fp32, {', '.join(LOW_PRECISIONS)}")
    norms = [m for m in model.modules() if type(m) is norm_type]
    if value not in LOW_PRECISIONS or not norms:
        why = (f"found no {norm_type.__name__} in {type(model).__name__}" if not norms
               else f"precision {value} is not one of {', '.join(LOW_PRECISIONS)}")
        warnings.warn(NoEffectWarning(f"{what} {why}; it changes nothing"))
        return model
    for norm in norms:
        norm.__class__ = lp_type
    return model


def apply_low_precision_layernorm(model: nn.Module, precision: Any = None,
                                  optimizers: Any = None) -> nn.Module:
    """Make every ``nn.LayerNorm`` run in the autocast dtype when ``precision`` is amp_bf16/amp_fp16.

    Composer's name and signature (``optimizers`` is accepted for parity: parameters do not change).
    ``precision`` None (Composer's default) or fp32 changes nothing and warns ``NoEffectWarning``.
    """
    return convert_norms(model, nn.LayerNorm, LPLayerNorm, precision, "LowPrecisionLayerNorm")


class LowPrecisionNorm(Algorithm):
    """Surgery at INIT, only on CUDA with 16-bit autocast; elsewhere a "no effect" note."""

    changes_model = True
    events = frozenset({Event.INIT})
    title = ""
    convert: Callable[..., nn.Module]

    def apply(self, event: Event, state: AlgorithmState) -> None:
        precision = getattr(state, "precision", "fp32")
        if not low_precision_effective(precision, state.device):
            warnings.warn(NoEffectWarning(
                f"{self.title} is a no-op here: it needs amp_bf16 or amp_fp16 on a CUDA device, and this run "
                f"uses {getattr(precision, 'value', precision)} on {state.device.type}"))
            return
        type(self).convert(state.model, precision)


class LowPrecisionLayerNorm(LowPrecisionNorm):
    """Runs the model's LayerNorms in the autocast dtype (CUDA, amp_bf16/amp_fp16)."""

    name = "low_precision_layernorm"
    title = "LowPrecisionLayerNorm"
    convert = staticmethod(apply_low_precision_layernorm)
