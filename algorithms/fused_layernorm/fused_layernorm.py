"""FusedLayerNorm: replace ``nn.LayerNorm`` with NVIDIA apex's ``FusedLayerNorm`` on CUDA.

apex's kernel computes the statistics and the affine transform in one pass and can beat
PyTorch's for some shapes. apex is optional (not a Tessera dependency): without it, or off
CUDA, the Algorithm accepts the spec and does nothing, with a "no effect" note on the run.
State-dict names (``weight``, ``bias``) and shapes are unchanged, so checkpoints move freely
between runs with and without it.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import torch
import torch.nn as nn

from algorithms.base import Algorithm, AlgorithmState, NoEffectWarning
from algorithms.events import Event
from algorithms.surgery import replace_modules


def apex_fused_layernorm() -> type[nn.Module] | None:
    """apex's ``FusedLayerNorm`` class, or None when apex is not installed."""
    try:
        from apex.normalization import FusedLayerNorm as ApexFusedLayerNorm  # type: ignore[import-not-found]
    except ImportError:
        return None
    return ApexFusedLayerNorm


def apply_fused_layernorm(model: nn.Module, optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer]
                          | None = None) -> nn.Module:
    """Replace every ``nn.LayerNorm`` on a CUDA device by apex's ``FusedLayerNorm`` (same values).

    Composer's name and signature; returns the model. New parameters replace the old ones in
    ``optimizers``. Warns ``NoEffectWarning`` (and changes nothing) without apex or without a
    CUDA LayerNorm.
    """
    fused = apex_fused_layernorm()
    if fused is None:
        warnings.warn(NoEffectWarning("FusedLayerNorm needs NVIDIA apex, which is not installed; it changes nothing"))
        return model

    def convert(norm: nn.Module) -> nn.Module | None:
        if norm.weight is None or not norm.weight.is_cuda:
            return None
        new = fused(norm.normalized_shape, eps=norm.eps, elementwise_affine=True).to(norm.weight.device)
        new.load_state_dict(norm.state_dict())
        return new
    if not replace_modules(model, {nn.LayerNorm: convert}, optimizers=optimizers):
        warnings.warn(NoEffectWarning(f"FusedLayerNorm found no affine LayerNorm on a CUDA device in "
                                      f"{type(model).__name__}; it changes nothing"))
    return model


class FusedLayerNorm(Algorithm):
    """Swaps in apex's LayerNorm at INIT when the run is on CUDA and apex is installed; a noted no-op otherwise."""

    name = "fused_layernorm"
    events = frozenset({Event.INIT})
    changes_model = True

    def apply(self, event: Event, state: AlgorithmState) -> None:
        if state.device.type != "cuda":
            warnings.warn(NoEffectWarning(f"FusedLayerNorm is a no-op here: it needs a CUDA device and NVIDIA apex, "
                                          f"and this run is on {state.device.type}"))
            return
        # INIT runs before the model moves to the device: move LayerNorms there first so the
        # conversion sees CUDA weights (wrap_model's .to(device) is then a no-op for them).
        for module in state.model.modules():
            if type(module) is nn.LayerNorm:
                module.to(state.device)
        apply_fused_layernorm(state.model, optimizers=getattr(state, "optimizer", None))

    def state_dict(self) -> dict[str, Any]:
        return {}
