"""LayerFreezing: stop training the earliest layers, more of them as training goes on.

From ``freeze_start`` (a fraction of training) on, the fraction of layers frozen grows linearly
to ``freeze_level`` at the end of training. "Layers" are the leaf modules that hold parameters,
in definition order; the last one (the classifier head) is never frozen. Freezing is monotone:
a frozen layer stays frozen.

The Algorithm form keeps the optimizer's structure as it is (Composer removes frozen parameters
from the optimizer, which is why its checkpoints cannot resume: issue mosaicml/composer#1002).
Instead, every step it drops the frozen parameters' gradients after backward and before the
step -- optimizers skip parameters without a gradient, so they get no momentum and no weight
decay -- and, on an unwrapped model, also sets ``requires_grad = False`` so their gradients are
never computed. Under DDP and FSDP2 ``requires_grad`` is left alone: DDP's reducer and FSDP's
reduce-scatter expect every parameter they were built with to get a gradient. The number of
frozen layers is the algorithm's checkpointed state and is re-applied on resume.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event


def parameter_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The leaf modules that hold parameters, depth first in definition order."""
    return [m for m in model.modules() if not list(m.children()) and any(True for _ in m.parameters(recurse=False))]


def freeze_schedule(current_duration: float, freeze_start: float = 0.5, freeze_level: float = 1.0) -> float:
    """The fraction of layers frozen at ``current_duration``: 0 until ``freeze_start``, then
    linear up to ``freeze_level`` at the end of training (duration 1)."""
    if current_duration <= freeze_start:
        return 0.0
    return freeze_level * (current_duration - freeze_start) / (1.0 - freeze_start)


def _check(freeze_start: float, freeze_level: float) -> None:
    if not 0.0 <= freeze_start < 1.0:
        raise ValueError(f"freeze_start {freeze_start} must lie in [0, 1)")
    if not 0.0 < freeze_level <= 1.0:
        raise ValueError(f"freeze_level {freeze_level} must lie in (0, 1]")


def freeze_layers(model: torch.nn.Module, optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None,
                  current_duration: float, freeze_start: float = 0.5, freeze_level: float = 1.0
                  ) -> tuple[int, float]:
    """Freeze the first layers of ``model`` in place for ``current_duration`` (a fraction in [0, 1]).

    Composer's name and signature: frozen parameters get ``requires_grad = False`` and are
    removed from ``optimizers`` (None: optimizers are left alone). Returns the number of layers
    frozen and the fraction of freezable layers that is.
    """
    _check(freeze_start, freeze_level)
    layers = parameter_layers(model)[:-1]
    fraction = freeze_schedule(current_duration, freeze_start, freeze_level)
    depth = int(fraction * len(layers))
    frozen = [p for layer in layers[:depth] for p in layer.parameters()]
    for p in frozen:
        p.requires_grad_(False)
    if optimizers is not None and frozen:
        ids = {id(p) for p in frozen}
        for optimizer in [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else optimizers:
            for group in optimizer.param_groups:
                group["params"] = [p for p in group["params"] if id(p) not in ids]
            for p in frozen:
                optimizer.state.pop(p, None)
    return depth, fraction


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # DDP keeps the user's module in .module


def _is_distributed(model: torch.nn.Module) -> bool:
    return hasattr(model, "module") or any(hasattr(p, "to_local") for p in model.parameters())  # DDP; FSDP2 DTensors


class LayerFreezing(Algorithm):
    """Advances the frozen depth at EPOCH_END (as Composer does); drops the frozen layers'
    gradients at AFTER_TRAIN_BATCH, before every optimizer step."""

    name = "layer_freezing"
    events = frozenset({Event.EPOCH_END, Event.AFTER_TRAIN_BATCH})

    def __init__(self, freeze_start: float = 0.5, freeze_level: float = 1.0):
        _check(freeze_start, freeze_level)
        self.freeze_start, self.freeze_level = freeze_start, freeze_level
        self.frozen_layers = 0  # the checkpointed schedule position

    def apply(self, event: Event, state: AlgorithmState) -> None:
        layers = parameter_layers(_unwrapped(state.model))[:-1]
        if event is Event.EPOCH_END:
            fraction = freeze_schedule(state.progress, self.freeze_start, self.freeze_level)
            self.frozen_layers = max(self.frozen_layers, int(fraction * len(layers)))
        freeze_grads = not _is_distributed(state.model)
        for layer in layers[:self.frozen_layers]:
            for p in layer.parameters():
                p.grad = None
                if freeze_grads:
                    p.requires_grad_(False)

    def state_dict(self) -> dict[str, Any]:
        return {"frozen_layers": self.frozen_layers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.frozen_layers = int(state.get("frozen_layers", 0))
