"""WeightStandardization (Qiao et al. 2019): every convolution uses its weights standardized per
output filter, ``(W - mean) / sqrt(var + eps)`` over each filter's inputs and kernel.

Standardized weights smooth the loss landscape; with GroupNorm (or small-batch BatchNorm) it
trains like large-batch BatchNorm. Implemented with ``torch.nn.utils.parametrize`` as Composer
does, so the trained tensor is ``weight``'s ``parametrizations.weight.original`` (Composer's
state-dict names) and every forward standardizes it. ``n_last_layers_ignore`` skips the last
convolutions in execution order (from ``torch.fx`` tracing; definition order if the model
cannot be traced).
"""

from __future__ import annotations

import logging
import warnings

import torch
import torch.nn as nn
import torch.nn.utils.parametrize as parametrize

from algorithms.base import Algorithm, AlgorithmState, NoEffectWarning
from algorithms.events import Event

log = logging.getLogger(__name__)

CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
EPS = 1e-5  # the paper's code; Composer uses 1e-10, which blows up filters of equal weights


def standardize_weights(weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``weight`` with each output filter (dim 0) standardized to mean 0 and variance ~1."""
    dims = tuple(range(1, weight.dim()))
    var, mean = torch.var_mean(weight, dim=dims, keepdim=True, unbiased=False)
    return (weight - mean) / torch.sqrt(var + eps)


class WeightStandardizer(nn.Module):
    """The parametrization: standardizes the stored weight at every use."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return standardize_weights(weight)


def _convs_in_execution_order(model: nn.Module) -> list[nn.Module]:
    definition_order = [m for m in model.modules() if isinstance(m, CONVS)]
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception:  # noqa: BLE001 -- any untraceable forward falls back to definition order
        log.info("weight standardization: %s cannot be traced; using definition order", type(model).__name__)
        return definition_order
    ordered: list[nn.Module] = []
    for node in graph.nodes:
        if node.op == "call_module":
            module = model.get_submodule(node.target)
            if isinstance(module, CONVS) and all(module is not m for m in ordered):
                ordered.append(module)
    # Convolutions the trace did not reach (called inside leaf modules) keep definition order, last.
    return ordered + [m for m in definition_order if all(m is not o for o in ordered)]


def apply_weight_standardization(module: nn.Module, n_last_layers_ignore: int = 0) -> int:
    """Standardize the weights of every Conv1d/2d/3d of ``module`` but the last ``n_last_layers_ignore``.

    Composer's name, signature and return value: the number of convolutions parametrized.
    Convolutions already standardized are left alone. Warns ``NoEffectWarning`` if none is.
    """
    if n_last_layers_ignore < 0:
        raise ValueError(f"n_last_layers_ignore {n_last_layers_ignore} must be >= 0")
    convs = _convs_in_execution_order(module)
    targets = convs[:max(len(convs) - n_last_layers_ignore, 0)]
    count = 0
    for conv in targets:
        if not parametrize.is_parametrized(conv, "weight"):
            parametrize.register_parametrization(conv, "weight", WeightStandardizer())
            count += 1
    if not targets:
        warnings.warn(NoEffectWarning(
            f"WeightStandardization found {len(convs)} convolution(s) in {type(module).__name__} and ignores the "
            f"last {n_last_layers_ignore}; it changes nothing"))
    return count


class WeightStandardization(Algorithm):
    """Parametrizes the convolutions at INIT, before wrapping."""

    name = "weight_standardization"
    events = frozenset({Event.INIT})
    changes_model = True

    def __init__(self, n_last_layers_ignore: int = 0):
        if n_last_layers_ignore < 0:
            raise ValueError(f"n_last_layers_ignore {n_last_layers_ignore} must be >= 0")
        self.n_last_layers_ignore = n_last_layers_ignore

    def apply(self, event: Event, state: AlgorithmState) -> None:
        apply_weight_standardization(state.model, self.n_last_layers_ignore)
