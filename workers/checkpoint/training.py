"""The trainer's side of checkpoints: when to save, and the state gathered from its owners.

Model and optimizer are saved sharded, as the run holds them, with DCP (``Checkpointer``);
every other part of the run's state comes from the object that owns it through one protocol,
``state_dict()`` / ``load_state_dict(state)``: the train loader (its data position), the LR
scheduler, the grad scaler, the algorithms, the loop's progress. They go to ``trainer.pt``
(written by rank 0, the same for every rank). Per-rank parts (the RNG streams) go to
``rank{r}.pt`` and are restored only on the same world size; on another, a part is loaded
with ``None`` and must start afresh (still deterministically).

A new piece of state joins checkpoints by implementing the protocol and being named in the
trainer's parts; nothing here changes.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

import torch

from workers.checkpoint.contents import rng_state, set_rng_state
from workers.checkpoint.manager import CheckpointInfo, Checkpointer
from workers.parallel import average_buffers
from workers.state import State
from workers.timekeeping import Timestamp

if TYPE_CHECKING:
    from algorithms.base import Algorithm


class Stateful(Protocol):
    """A part of the run's state that saves and restores itself."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


@dataclasses.dataclass(frozen=True)
class StateOf:
    """``Stateful`` from two functions, for state that lives in a field of another object."""

    save: Callable[[], Any]
    load: Callable[[Any], None]

    def state_dict(self) -> Any:
        return self.save()

    def load_state_dict(self, state: Any) -> None:
        self.load(state)


class TimestampState:
    """Where the loop is: ``state.timestamp``."""

    def __init__(self, state: State):
        self.state = state

    def state_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self.state.timestamp)

    def load_state_dict(self, saved: dict[str, int]) -> None:
        self.state.timestamp = Timestamp(**saved)


class AlgorithmStates:
    """Every algorithm's own state, by name; an algorithm absent from the checkpoint starts fresh."""

    def __init__(self, algorithms: Sequence["Algorithm"]):
        self.algorithms = algorithms

    def state_dict(self) -> dict[str, Any]:
        return {a.name: a.state_dict() for a in self.algorithms}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        for algorithm in self.algorithms:
            if algorithm.name in saved:
                algorithm.load_state_dict(saved[algorithm.name])


def scaler_state(scaler: torch.amp.GradScaler) -> StateOf:
    """A disabled scaler saves ``{}``, which ``load_state_dict`` refuses: nothing to restore then."""
    return StateOf(scaler.state_dict, lambda saved: scaler.load_state_dict(saved) if saved else None)


class RankRng:
    """This rank's random streams (augmentations draw from them). Checkpointed per rank; on
    another world size they restart from ``seed``, the rank and the batch reached, so a resumed
    run stays deterministic."""

    def __init__(self, state: State, seed: int):
        self.state, self.seed = state, seed

    def state_dict(self) -> dict[str, Any]:
        return rng_state(self.state.device)

    def load_state_dict(self, saved: dict[str, Any] | None) -> None:
        if saved is not None:
            set_rng_state(saved)
        else:
            torch.manual_seed(self.seed + self.state.rank + 1_000_003 * self.state.timestamp.batch)


class TrainingCheckpoints:
    """Decides when to save (every ``every`` batches and once at the end) and gathers what a
    checkpoint holds: ``state``'s model and optimizer, the ``shared`` parts (``trainer.pt``) and
    the ``per_rank`` parts. Parts load in the order given. Without a ``checkpointer``
    (no checkpoint URL) it neither saves nor resumes."""

    def __init__(self, checkpointer: Checkpointer | None, state: State, *, every: int | None,
                 shared: Mapping[str, Stateful], per_rank: Mapping[str, Stateful]):
        self.checkpointer, self.state, self.every = checkpointer, state, every
        self.shared, self.per_rank = dict(shared), dict(per_rank)
        self.last_saved_batch = -1

    def due(self, step: int) -> bool:
        """Whether a checkpoint is due once ``step`` is done (every ``every`` batches); the loop
        then calls ``save`` on every rank."""
        return self.checkpointer is not None and bool(self.every) and step % self.every == 0

    def save_final(self, step: int) -> None:
        """Save the final state unless ``step`` is saved already (collective)."""
        if self.checkpointer is not None and step != self.last_saved_batch:
            self.save()

    def save(self, *, epoch_done: bool = False) -> None:
        """Save this rank's part of a checkpoint now (collective). ``epoch_done``: the save falls
        on the epoch's last batch, before the trainer moves the state past the epoch's end; it is
        labelled with the epochs done (``ep1-ba22`` for the end of the first, as Composer names
        it, and as the final save after that epoch is), not the one in progress."""
        if self.checkpointer is None:
            return
        state = self.state
        self.last_saved_batch = state.timestamp.batch
        # BatchNorm statistics are per rank and neither DDP nor FSDP syncs them; average them so
        # the checkpoint (which keeps one copy) is the model every rank would evaluate.
        average_buffers(state.model)
        self.checkpointer.save(model=state.model, optimizer=state.optimizer,
                               trainer_state={name: part.state_dict() for name, part in self.shared.items()},
                               rank_state={name: part.state_dict() for name, part in self.per_rank.items()},
                               epoch=state.timestamp.epoch + (1 if epoch_done else 0), step=state.timestamp.batch)

    def resume(self) -> CheckpointInfo | None:
        """Load the newest committed checkpoint, if any (the same one on every rank), into the
        model, optimizer and every part; returns it. A part absent from an older checkpoint
        keeps its state."""
        if self.checkpointer is None:
            return None
        info = self.checkpointer.agreed_latest()
        if info is None:
            return None
        shared, per_rank = self.checkpointer.load(info, model=self.state.model, optimizer=self.state.optimizer)
        for name, part in self.shared.items():
            if name in shared:
                part.load_state_dict(shared[name])
        for name, part in self.per_rank.items():  # None: written by another world size
            part.load_state_dict(per_rank[name] if per_rank is not None else None)
        self.last_saved_batch = self.state.timestamp.batch
        return info

    def final_saved(self) -> bool | None:
        """Whether the last state saved (or resumed from) is committed, after waiting for the
        write: rank 0's word (None without checkpoints or on other ranks)."""
        if self.checkpointer is None or self.state.rank != 0:
            return None
        self.wait()
        return self.checkpointer.outcomes.get(self.last_saved_batch, True)  # absent: resumed from a commit

    def wait(self) -> None:
        """Block until an asynchronous save in flight has been written."""
        if self.checkpointer is not None:
            self.checkpointer.wait()
