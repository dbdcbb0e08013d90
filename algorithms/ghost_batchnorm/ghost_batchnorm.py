"""GhostBatchNorm (Hoffer et al. 2017): normalize each ``ghost_batch_size`` slice of the batch
with its own statistics while training.

Small-batch statistics are noisier, which regularizes like a small batch while the optimizer
still takes large-batch steps. Each ``BatchNorm{1,2,3}d`` is wrapped (``batchnorm`` holds the
original module and its ``Parameter`` objects; names as in Composer: ``bn.batchnorm.weight``).
In training the batch is split into ``ceil(N / ghost_batch_size)`` chunks, each normalized by
the wrapped layer; its momentum is divided by the number of chunks meanwhile, so the running
statistics move about as much per step as without ghost batches. Evaluation is plain BatchNorm.
A batch (or microbatch) no larger than ``ghost_batch_size`` is normalized whole, where Composer
raises: microbatches and the last, smaller batch of an epoch keep working.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import torch
import torch.nn as nn

from algorithms.base import Algorithm, AlgorithmState, NoEffectWarning
from algorithms.events import Event
from algorithms.surgery import replace_modules


class GhostBatchNormBase(nn.Module):
    """Runs ``batchnorm`` on each ghost batch of the input separately while training."""

    def __init__(self, batchnorm: nn.modules.batchnorm._BatchNorm, ghost_batch_size: int = 32):
        super().__init__()
        if ghost_batch_size < 1:
            raise ValueError(f"ghost_batch_size {ghost_batch_size} must be >= 1")
        self.batchnorm, self.ghost_batch_size = batchnorm, ghost_batch_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = math.ceil(x.shape[0] / self.ghost_batch_size)
        if not self.training or chunks <= 1:
            return self.batchnorm(x)
        momentum = self.batchnorm.momentum
        if momentum is not None:  # None: a cumulative average, which needs no correction
            self.batchnorm.momentum = momentum / chunks
        try:
            return torch.cat([self.batchnorm(chunk) for chunk in x.chunk(chunks, dim=0)], dim=0)
        finally:
            self.batchnorm.momentum = momentum

    def extra_repr(self) -> str:
        return f"ghost_batch_size={self.ghost_batch_size}"


class GhostBatchNorm1d(GhostBatchNormBase):
    """Ghost version of ``BatchNorm1d``."""


class GhostBatchNorm2d(GhostBatchNormBase):
    """Ghost version of ``BatchNorm2d``."""


class GhostBatchNorm3d(GhostBatchNormBase):
    """Ghost version of ``BatchNorm3d``."""


_GHOST_TYPES = {nn.BatchNorm1d: GhostBatchNorm1d, nn.BatchNorm2d: GhostBatchNorm2d, nn.BatchNorm3d: GhostBatchNorm3d}


def apply_ghost_batchnorm(model: nn.Module, ghost_batch_size: int = 32,
                          optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None
                          ) -> nn.Module:
    """Wrap every ``BatchNorm{1,2,3}d`` of ``model`` in a ghost version, in place.

    Composer's name and signature; returns the model. Parameters stay the same objects, so
    ``optimizers`` need no change (accepted for parity). A second call changes nothing; warns
    ``NoEffectWarning`` if the model has no BatchNorm.
    """
    if ghost_batch_size < 1:
        raise ValueError(f"ghost_batch_size {ghost_batch_size} must be >= 1")
    done = {id(m.batchnorm) for m in model.modules() if isinstance(m, GhostBatchNormBase)}

    def policy(ghost_type):
        return lambda bn: None if id(bn) in done else ghost_type(bn, ghost_batch_size)
    replaced = replace_modules(model, {t: policy(g) for t, g in _GHOST_TYPES.items()}, optimizers=optimizers)
    if not replaced and not done:
        warnings.warn(NoEffectWarning(f"GhostBatchNorm found no BatchNorm layer in {type(model).__name__}; "
                                      "it changes nothing"))
    return model


class GhostBatchNorm(Algorithm):
    """Wraps every BatchNorm layer in a ghost version at INIT, before wrapping."""

    name = "ghost_batchnorm"
    events = frozenset({Event.INIT})
    changes_model = True

    def __init__(self, ghost_batch_size: int = 32):
        if ghost_batch_size < 1:
            raise ValueError(f"ghost_batch_size {ghost_batch_size} must be >= 1")
        self.ghost_batch_size = ghost_batch_size

    def apply(self, event: Event, state: AlgorithmState) -> None:
        apply_ghost_batchnorm(state.model, self.ghost_batch_size, optimizers=getattr(state, "optimizer", None))
