"""The ``Algorithm`` base class and the ``AlgorithmState`` it reads and writes.

An algorithm declares the events it acts on (``events``), decides whether to run with
``match(event, state)`` -- which must never change anything -- and does its work in
``apply(event, state)``. Algorithms that change the model (``changes_model = True``) act at
``Event.INIT``, before the runtime wraps the model for DDP/FSDP, and are replayed on resume
before a checkpoint is loaded. Algorithms with state save it through ``state_dict()``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import torch

from algorithms.events import Event


class NoEffectWarning(UserWarning):
    """An algorithm found nothing to change (e.g. ChannelsLast on a model without conv layers)."""


class AlgorithmState(Protocol):
    """The part of the runtime's state (``workers.state.State``) that algorithms may use.

    Algorithms see this structural type only, so they never import the runtime.
    """

    model: torch.nn.Module
    inputs: Any
    targets: Any
    outputs: Any
    loss: Any
    num_classes: int
    device: torch.device
    max_batches: int
    timestamp: Any  # workers.timekeeping.Timestamp: epoch, batch, sample, token; .get(unit)
    optimizer: Any
    scheduler: Any
    sample_transforms: list  # per-sample callables the train loader applies (AugMix, ColOut sample mode)
    scaler: Any  # torch.amp.GradScaler (enabled for fp16 only)
    recompute_gradients: Any  # during AFTER_TRAIN_BATCH: rerun the batch's forward/backward (SAM)
    train_batches: Any  # () -> a fresh pass over this rank's training batches of the epoch, or None (SWA)
    loads_weights: bool  # at INIT: saved weights overwrite the model right after (a replay of the surgery)

    @property
    def progress(self) -> float: ...  # fraction of max_batches done; moves every batch


class Algorithm:
    """A speedup method wired to the loop's events.

    Subclasses set ``name`` (the key in ``api.catalog.ALGORITHMS``) and ``events``, implement
    ``apply``, and build themselves from their spec with ``from_spec``.
    """

    name: ClassVar[str] = ""
    events: ClassVar[frozenset[Event]] = frozenset()
    changes_model: ClassVar[bool] = False  # surgery: runs at INIT, before wrapping

    @classmethod
    def from_spec(cls, spec: Any) -> "Algorithm":
        """Build from the method's pydantic spec (``api.algorithm_specs``); fields are kwargs."""
        return cls(**spec.model_dump(exclude={"name"}))

    def match(self, event: Event, state: AlgorithmState) -> bool:
        """Whether to run at ``event``. Must not change ``state`` or ``self``."""
        return event in self.events

    def apply(self, event: Event, state: AlgorithmState) -> None:
        """Do the work for ``event``; called only when ``match`` returned True."""
        raise NotImplementedError(f"{type(self).__name__}.apply")

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to resume this algorithm exactly (nothing by default)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"
