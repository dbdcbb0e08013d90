"""Optimizers and per-batch learning-rate schedules from the run spec.

Schedules are ``LambdaLR`` multipliers of the base lr, stepped once per optimizer step:
linear warmup from 0 over ``warmup`` batches, then constant, cosine or linear decay to
``alpha_f * lr`` at ``max_batches``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

from api.specs import SchedulerSpec


def build_optimizer(params: Iterable[torch.nn.Parameter], spec: Any) -> torch.optim.Optimizer:
    """SGD, Adam or AdamW per ``api.specs.OptimizerSpec``."""
    if spec.name == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay,
                               nesterov=spec.nesterov and spec.momentum > 0)
    if spec.name in ("adam", "adamw"):
        cls = torch.optim.AdamW if spec.name == "adamw" else torch.optim.Adam
        return cls(params, lr=spec.lr, betas=tuple(spec.betas), eps=spec.eps, weight_decay=spec.weight_decay)
    raise ValueError(f"unknown optimizer {spec.name!r}; known: sgd, adam, adamw")


def lr_multiplier(step: int, *, schedule: str, warmup_batches: int, max_batches: int, alpha_f: float) -> float:
    """The factor applied to the base lr before optimizer step ``step`` (0-based)."""
    if step < warmup_batches:
        return step / warmup_batches
    if schedule == "constant":
        return 1.0
    decay_batches = max(1, max_batches - warmup_batches)
    t = min(1.0, (step - warmup_batches) / decay_batches)
    if schedule == "cosine":
        return alpha_f + (1.0 - alpha_f) * 0.5 * (1.0 + math.cos(math.pi * t))
    if schedule == "linear":
        return 1.0 - (1.0 - alpha_f) * t
    raise ValueError(f"unknown schedule {schedule!r}; known: constant, cosine, linear")


class BatchLambdaLR(LambdaLR):
    """``LambdaLR`` with a lean ``step()``, which the loop calls after every optimizer step.

    The same learning rates (``base_lr * lambda(step)``, bit for bit), the same counters and the
    same ``state_dict``, so checkpoints of either load into the other. What it leaves out of
    ``LRScheduler.step``: the warnings about the call order (the loop's order is fixed), the
    deprecated ``epoch`` argument, tensor learning rates (the optimizers here are built with
    float ones) and the context that lets ``get_lr`` know it is called from ``step``: ten fewer
    Python calls a step. Torch's ``step`` cost 1.5% of a tiny CNN's step here (``bench/loop.py``).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, lr_lambda: Callable[[int], float]):
        super().__init__(optimizer, lr_lambda)
        # ``LRScheduler`` wraps the optimizer's ``step`` in a closure that only marks it called,
        # for the order warnings left out above; undone, each step is one Python call shorter.
        if getattr(vars(optimizer).get("step"), "_wrapped_by_lr_sched", False):
            del optimizer.step

    def step(self, epoch: None = None) -> None:
        if epoch is not None:
            raise TypeError("BatchLambdaLR.step takes no epoch; it counts optimizer steps itself")
        self._step_count += 1
        self.last_epoch = step = self.last_epoch + 1
        groups = self.optimizer.param_groups
        for group, lmbda, base_lr in zip(groups, self.lr_lambdas, self.base_lrs):
            group["lr"] = base_lr * lmbda(step)
        self._last_lr = [group["lr"] for group in groups]


def build_scheduler(optimizer: torch.optim.Optimizer, spec: SchedulerSpec, *, warmup_batches: int,
                    max_batches: int) -> LambdaLR:
    """A per-batch ``LambdaLR`` for ``spec`` (warmup already converted to batches)."""
    return BatchLambdaLR(optimizer, lambda step: lr_multiplier(
        step, schedule=spec.name, warmup_batches=warmup_batches, max_batches=max_batches, alpha_f=spec.alpha_f))
