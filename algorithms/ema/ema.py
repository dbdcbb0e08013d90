"""EMA: keep an exponential moving average of the weights and evaluate with it.

After each update interval the averaged copy moves towards the training weights,
``ema = smoothing * ema + (1 - smoothing) * weights``. Evaluation swaps the averaged weights into
the model at ``EVAL_START`` and the training weights back at ``EVAL_END``, so training always
continues from its own weights. ``half_life`` sets the smoothing as Composer does:
``smoothing = 2 ** -(update_interval / half_life)``.
"""

from __future__ import annotations

from typing import Any

import torch

from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event
from api.time import Time, TimeUnit


def compute_ema(model: torch.nn.Module, ema_model: torch.nn.Module | dict[str, torch.Tensor],
                smoothing: float = 0.99) -> None:
    """Move ``ema_model``'s parameters and buffers towards ``model``'s, in place:
    ``ema = smoothing * ema + (1 - smoothing) * model``.

    Composer 0.32's signature; ``ema_model`` may also be a ``{name: tensor}`` dict (what the EMA
    algorithm keeps). Tensors are matched by name; floating tensors are averaged with one fused
    ``torch._foreach_lerp_`` per dtype/device group, integer buffers (BatchNorm's
    ``num_batches_tracked``) are copied.
    """
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing {smoothing} must lie in [0, 1]")
    averaged = ema_model.state_dict() if isinstance(ema_model, torch.nn.Module) else ema_model
    current, targets, counters = [], [], []
    with torch.no_grad():
        for name, tensor in _named_tensors(model):
            ema = averaged.get(name)
            if ema is None:
                continue
            if ema.is_floating_point():
                targets.append(ema)
                current.append(tensor.detach())
            else:
                counters.append((ema, tensor))
        if targets:
            torch._foreach_lerp_(targets, current, 1.0 - smoothing)
        for ema, tensor in counters:
            ema.copy_(tensor)


def _named_tensors(model: torch.nn.Module):
    yield from model.named_parameters()
    yield from model.named_buffers()


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    # DDP keeps the user's module in ``.module``; names must match the unwrapped model's.
    return getattr(model, "module", model)


def swap_weights(model: torch.nn.Module, averaged: dict[str, torch.Tensor]) -> None:
    """Exchange ``model``'s parameters and buffers with the tensors of ``averaged``, in place."""
    with torch.no_grad():
        for name, tensor in _named_tensors(model):
            other = averaged.get(name)
            if other is not None:
                kept = tensor.detach().clone()
                tensor.copy_(other)
                other.copy_(kept)


def _batch_or_epoch(value: str | Time, field: str) -> Time:
    time = Time.parse(value)
    if time.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH) or time.value <= 0:
        raise ValueError(f"{field} {time} must be a positive number of batches or epochs, e.g. '100ba' or '1ep'")
    return time


class EMA(Algorithm):
    """Averages weights at BATCH_END (or EPOCH_END, for epoch intervals) from ``ema_start`` on,
    and evaluates with the average (swap at EVAL_START, swap back at EVAL_END)."""

    name = "ema"
    events = frozenset({Event.FIT_START, Event.BATCH_END, Event.EPOCH_END, Event.EVAL_START, Event.EVAL_END})

    def __init__(self, half_life: str | Time | None = "1000ba", smoothing: float | None = None,
                 ema_start: str | Time = "0.0dur", update_interval: str | Time | None = None):
        if half_life is None and smoothing is None:
            raise ValueError("give half_life or smoothing")
        if half_life is not None and smoothing is not None:
            raise ValueError(f"give half_life or smoothing, not both; got {half_life} and {smoothing}")
        self.half_life = None if half_life is None else _batch_or_epoch(half_life, "half_life")
        default_unit = self.half_life.unit if self.half_life is not None else TimeUnit.BATCH
        self.update_interval = (Time(1, default_unit) if update_interval is None
                                else _batch_or_epoch(update_interval, "update_interval"))
        if self.half_life is not None and self.half_life.unit is not self.update_interval.unit:
            raise ValueError(f"half_life {self.half_life} and update_interval {self.update_interval} "
                             "must use the same unit")
        if smoothing is not None and not 0.0 <= smoothing <= 1.0:
            raise ValueError(f"smoothing {smoothing} must lie in [0, 1]")
        self.smoothing = (smoothing if smoothing is not None
                          else 2.0 ** -(self.update_interval.value / self.half_life.value))
        self.ema_start = Time.parse(ema_start)
        self._update_event = Event.BATCH_END if self.update_interval.unit is TimeUnit.BATCH else Event.EPOCH_END
        self._averaged: dict[str, torch.Tensor] | None = None  # None until ema_start
        self._ema_active = False  # True between EVAL_START and EVAL_END

    @property
    def averaged(self) -> dict[str, torch.Tensor] | None:
        """The averaged parameters and buffers by name (None before ``ema_start``)."""
        return self._averaged

    def _started(self, state: AlgorithmState) -> bool:
        if self.ema_start.unit is TimeUnit.DURATION:
            return state.progress >= self.ema_start.value
        return state.timestamp.get(self.ema_start.unit) >= self.ema_start.value

    def apply(self, event: Event, state: AlgorithmState) -> None:
        model = _unwrapped(state.model)
        if event is Event.FIT_START and self._averaged is not None:
            # After a resume, keep the averaged tensors on the model's device.
            device = next(model.parameters()).device
            self._averaged = {k: v.to(device) for k, v in self._averaged.items()}
        elif event is self._update_event:
            if self._averaged is None:
                if not self._started(state):
                    return
                self._averaged = {name: t.detach().clone() for name, t in _named_tensors(model)}
            if state.timestamp.get(self.update_interval.unit) % int(self.update_interval.value) == 0:
                compute_ema(model, self._averaged, self.smoothing)
        elif event is Event.EVAL_START and self._averaged is not None and not self._ema_active:
            swap_weights(model, self._averaged)
            self._ema_active = True
        elif event is Event.EVAL_END and self._ema_active:
            swap_weights(model, self._averaged)
            self._ema_active = False

    def state_dict(self) -> dict[str, Any]:
        if self._ema_active:
            raise RuntimeError("EMA state saved during evaluation; save between EVAL_END and EVAL_START")
        return {"averaged": dict(self._averaged) if self._averaged is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        averaged = state.get("averaged")
        self._averaged = None if averaged is None else {k: v.clone() for k, v in averaged.items()}
        self._ema_active = False
