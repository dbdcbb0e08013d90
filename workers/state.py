"""``State``: what the loop, the algorithms and the callbacks share.

Deliberately small: the model and what optimizes it, the current (micro)batch and what was
computed from it, where the loop is, and the run's fixed facts. Everything else (data loaders,
metrics, reporting) belongs to the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from api.specs import Precision
from workers.timekeeping import Timestamp

if TYPE_CHECKING:
    from algorithms.base import Algorithm


@dataclass
class State:
    """Mutable training state; algorithms read and replace its fields at events.

    ``inputs``/``targets`` hold the full per-worker batch at ``AFTER_DATALOADER`` and the
    current microbatch from ``BEFORE_FORWARD`` to ``AFTER_BACKWARD``. ``loss`` is the current
    microbatch's unscaled loss.
    """

    model: torch.nn.Module
    num_classes: int
    max_batches: int
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    precision: Precision = Precision.FP32
    rank: int = 0
    world_size: int = 1
    algorithms: list["Algorithm"] = field(default_factory=list)
    optimizer: torch.optim.Optimizer | None = None
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    scaler: torch.amp.GradScaler | None = None
    timestamp: Timestamp = field(default_factory=Timestamp)
    inputs: Any = None
    targets: Any = None
    outputs: Any = None
    loss: torch.Tensor | None = None
    # Per-sample transforms the train loader applies (installed at FIT_START by AugMix and
    # ColOut's sample mode); the trainer hands this same list to its TensorLoader.
    sample_transforms: list[Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=list)
    # Set only during AFTER_TRAIN_BATCH: reruns the batch's forward and backward (SAM's second pass).
    recompute_gradients: Callable[[], None] | None = None
    # A fresh pass over this rank's training batches ``(inputs, targets)`` of the current epoch,
    # leaving the train loader where it is (the trainer's ``train_loader.fresh_epoch``; SWA's
    # BatchNorm statistics). None outside a Trainer.
    train_batches: Callable[[], Iterator[tuple[Any, Any]]] | None = None
    # True at an INIT whose surgery is a replay: saved weights are loaded right after (a resume,
    # a fork from its parent's checkpoint, an export rebuilt by ``load_model``), so surgery
    # need not compute how new tensors start (factorize's ``init``).
    loads_weights: bool = False

    @property
    def progress(self) -> float:
        """Fraction of ``max_batches`` done; advances every batch."""
        return self.timestamp.progress(self.max_batches)

    @property
    def done(self) -> bool:
        return self.timestamp.batch >= self.max_batches
