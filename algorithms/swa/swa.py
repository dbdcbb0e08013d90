"""SWA: average the weights visited late in training, then recompute BatchNorm statistics.

From ``swa_start`` on, every ``update_interval`` the current weights join an equal-weight
running average (``torch.optim.swa_utils.AveragedModel``'s rule). At ``swa_end`` the model's
weights are replaced by the average and its BatchNorm running statistics are recomputed, because
the averaged weights never produced the statistics the model holds: a separate forward pass over
the training data (``state.train_batches``: this rank's shard of the current epoch, from its
first batch, leaving the training loader where it is), as ``torch.optim.swa_utils.update_bn``
does, bounded by ``bn_update_batches``. Under several ranks each rank passes over its own shard
and the statistics are then averaged across ranks, which is ``update_bn`` over all ranks'
batches together. Optionally the learning rate is annealed to ``swa_lr`` with
``torch.optim.swa_utils.SWALR`` while averaging.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Iterable

import torch
from torch.optim.swa_utils import SWALR, update_bn

from algorithms.base import Algorithm, AlgorithmState
from algorithms.distributed import average_across_ranks
from algorithms.events import Event
from api.time import Time, TimeUnit


def update_swa(averaged: torch.nn.Module | dict[str, torch.Tensor], model: torch.nn.Module,
               num_averaged: int) -> int:
    """Add ``model``'s parameters to the equal-weight average of ``num_averaged`` snapshots held in
    ``averaged`` (a module or ``{name: tensor}``), in place; returns the new count.

    ``avg += (p - avg) / (n + 1)`` (one fused lerp per dtype/device group), which after ``k``
    calls from ``num_averaged=0`` is the mean of the ``k`` snapshots. Buffers are not averaged:
    BatchNorm statistics are recomputed afterwards with ``recompute_bn_stats``.
    """
    held = dict(averaged.named_parameters()) if isinstance(averaged, torch.nn.Module) else averaged
    pairs = [(held[name], p.detach()) for name, p in model.named_parameters() if name in held]
    with torch.no_grad():
        if num_averaged == 0:
            for avg, p in pairs:
                avg.copy_(p)
        elif pairs:
            torch._foreach_lerp_([a for a, _ in pairs], [p for _, p in pairs], 1.0 / (num_averaged + 1))
    return num_averaged + 1


def _batchnorms(model: torch.nn.Module) -> list[torch.nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None]


def recompute_bn_stats(model: torch.nn.Module, loader: Iterable[Any], num_batches: int | None = None,
                       device: torch.device | str | None = None, sync_ranks: bool = False) -> int:
    """Reset ``model``'s BatchNorm running statistics and recompute them as the plain average over
    the batches of ``loader`` (at most ``num_batches``; None: all of them); returns how many
    batches were used.

    ``torch.optim.swa_utils.update_bn(loader, model, device)`` on those batches: items are input
    tensors or ``(inputs, targets, ...)`` sequences (the first element is the input), moved to
    ``device`` if given; the model runs in train mode and gets its mode back.

    ``sync_ranks`` (default False, so it is safe to call on one rank only, as Composer's is):
    with an initialized process group of several ranks, each rank's statistics (from its own
    batches) are then averaged across ranks -- a collective, so every rank must call it, with as
    many batches each, and the result is ``update_bn`` over all ranks' batches. The ``SWA``
    algorithm, which runs on every rank, passes True.
    """
    if num_batches is not None and num_batches < 1:
        raise ValueError(f"num_batches {num_batches} must be >= 1, or None for the whole loader")
    used = 0

    def counted():
        nonlocal used
        for batch in loader if num_batches is None else itertools.islice(loader, num_batches):
            used += 1
            yield batch

    update_bn(counted(), model, device)
    if sync_ranks:
        average_bn_stats_across_ranks(model)
    return used


def average_bn_stats_across_ranks(model: torch.nn.Module) -> None:
    """Average every BatchNorm's running mean and variance over the ranks of the default process
    group, in place (nothing without one, or with one rank). Each is a plain average over batches
    after ``update_bn``, so with equal batch counts the mean of the ranks' averages is the
    average over all their batches."""
    average_across_ranks(stat for module in _batchnorms(model) for stat in (module.running_mean, module.running_var))


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


class SWA(Algorithm):
    """Averages weights at BATCH_END or EPOCH_END between ``swa_start`` and ``swa_end``, then
    loads the average into the model and recomputes its BatchNorm statistics over
    ``bn_update_batches`` training batches (None: a whole epoch of this rank's shard)."""

    name = "swa"
    events = frozenset({Event.BATCH_END, Event.EPOCH_END})

    def __init__(self, swa_start: str | Time = "0.7dur", swa_end: str | Time = "0.97dur",
                 update_interval: str | Time = "1ep", schedule_swa_lr: bool = False,
                 anneal_strategy: str = "linear", anneal_steps: int = 10, swa_lr: float | None = None,
                 bn_update_batches: int | None = None):
        self.swa_start, self.swa_end = Time.parse(swa_start), Time.parse(swa_end)
        self.update_interval = Time.parse(update_interval)
        if self.swa_start.unit is not self.swa_end.unit or self.swa_start.unit not in (TimeUnit.DURATION,
                                                                                       TimeUnit.EPOCH):
            raise ValueError(f"swa_start {self.swa_start} and swa_end {self.swa_end} must both be in 'dur' or 'ep'")
        if not self.swa_start < self.swa_end:
            raise ValueError(f"swa_end {self.swa_end} must come after swa_start {self.swa_start}")
        if self.update_interval.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH) or self.update_interval.value < 1:
            raise ValueError(f"update_interval {self.update_interval} must be a positive number of 'ba' or 'ep'")
        strategy = {"lin": "linear", "linear": "linear", "cos": "cos", "cosine": "cos"}.get(anneal_strategy)
        if strategy is None:
            raise ValueError(f"anneal_strategy {anneal_strategy!r} must be 'linear' or 'cos'")
        anneal_strategy = strategy
        if anneal_steps < 1:
            raise ValueError(f"anneal_steps {anneal_steps} must be >= 1")
        if bn_update_batches is not None and bn_update_batches < 1:
            raise ValueError(f"bn_update_batches {bn_update_batches} must be >= 1, or None for a whole epoch")
        self.schedule_swa_lr, self.anneal_strategy, self.anneal_steps = schedule_swa_lr, anneal_strategy, anneal_steps
        self.swa_lr, self.bn_update_batches = swa_lr, bn_update_batches
        self._update_event = Event.BATCH_END if self.update_interval.unit is TimeUnit.BATCH else Event.EPOCH_END
        self._averaged: dict[str, torch.Tensor] | None = None  # the running average, by parameter name
        self.num_averaged = 0
        self.step_counter = 0
        self.completed = False
        self._scheduler: SWALR | None = None
        self._scheduler_state: dict[str, Any] | None = None  # loaded before the optimizer is known

    @property
    def averaged(self) -> dict[str, torch.Tensor] | None:
        """The averaged parameters by name (None before ``swa_start`` and after ``swa_end``)."""
        return self._averaged

    def _time(self, state: AlgorithmState) -> float:
        return state.progress if self.swa_start.unit is TimeUnit.DURATION else state.timestamp.epoch

    def apply(self, event: Event, state: AlgorithmState) -> None:
        if self.completed:
            return
        if event is not self._update_event or self._time(state) < self.swa_start.value:
            return
        model = _unwrapped(state.model)
        if self._averaged is None:
            self._averaged = {name: p.detach().clone() for name, p in model.named_parameters()}
        if self.schedule_swa_lr and self._scheduler is None:
            self._build_scheduler(state)
        if self.step_counter % int(self.update_interval.value) == 0:
            self.num_averaged = update_swa(self._averaged, model, self.num_averaged)
            if self._scheduler is not None:
                self._scheduler.step()
        self.step_counter += 1
        if self._time(state) >= self.swa_end.value:
            self._finish(model, state)

    def _build_scheduler(self, state: AlgorithmState) -> None:
        if self.swa_lr is None:
            self.swa_lr = state.optimizer.param_groups[0]["lr"]
        self._scheduler = SWALR(state.optimizer, swa_lr=self.swa_lr, anneal_epochs=self.anneal_steps,
                                anneal_strategy=self.anneal_strategy)
        if self._scheduler_state is not None:
            self._scheduler.load_state_dict(self._scheduler_state)
            self._scheduler_state = None

    def _finish(self, model: torch.nn.Module, state: AlgorithmState) -> None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(self._averaged[name])
        if _batchnorms(model):
            train_batches = getattr(state, "train_batches", None)
            if train_batches is None:
                warnings.warn("SWA: no training data to recompute BatchNorm statistics with "
                              "(state.train_batches is None); the averaged weights keep the last statistics")
            else:
                # The unwrapped model: DDP would broadcast rank 0's buffers on every forward.
                recompute_bn_stats(model, train_batches(), num_batches=self.bn_update_batches, sync_ranks=True)
        self.completed = True
        self._averaged = None  # the model now holds the average

    def state_dict(self) -> dict[str, Any]:
        scheduler = self._scheduler_state
        if self._scheduler is not None:
            # SWALR keeps its anneal function as an attribute; it is rebuilt from anneal_strategy.
            scheduler = {k: v for k, v in self._scheduler.state_dict().items() if k != "anneal_func"}
        return {"averaged": None if self._averaged is None else dict(self._averaged),
                "num_averaged": self.num_averaged, "step_counter": self.step_counter,
                "completed": self.completed, "swa_lr": self.swa_lr, "swa_scheduler": scheduler}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        averaged = state["averaged"]
        self._averaged = None if averaged is None else {k: v.clone() for k, v in averaged.items()}
        self.num_averaged, self.step_counter = int(state["num_averaged"]), int(state["step_counter"])
        self.completed, self.swa_lr = bool(state["completed"]), state["swa_lr"]
        self._scheduler, self._scheduler_state = None, state["swa_scheduler"]
        # Checkpoints written before the BatchNorm pass read the training data held
        # "recent_inputs" (the last batches); nothing needs them now.
