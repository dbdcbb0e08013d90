"""Test-only faults, asked for through the environment: slow batches and a worker SIGKILL.

Tests reach training that runs in other processes (a Ray job, Ray Train workers, the CLI) only
through the environment, which the dispatcher and ``fit_with_ray`` forward (``TESSERA_TEST_*``):

- ``TESSERA_TEST_BATCH_DELAY_S``: sleep this long after each batch, so a test can act on a
  running run;
- ``TESSERA_TEST_KILL_AT_BATCH=B`` with ``TESSERA_TEST_KILL_MARKER=path``: the rank
  ``TESSERA_TEST_KILL_RANK`` (default: the last) SIGKILLs itself at the end of batch B, before
  an evaluation or checkpoint due at B, once (the marker file records that it happened, so the
  restarted worker trains on). An asynchronous checkpoint still being written is finished first.
  ``B1,B2,...`` kills once at each of these batches, in the order training first reaches them,
  so that one run (with as many restarts allowed) is killed and resumed several times: a
  batch trained again after a resume is not killed again. The marker gets a line ``B pid`` for
  each kill (``killed_at`` reads them), so a test can check where each kill happened.
  ``TESSERA_TEST_KILL_DURING`` moves the kill: ``eval`` kills as the evaluation at batch B
  starts; ``save`` kills at the end of batch B without waiting for an asynchronous checkpoint
  in flight (a torn write, never loaded).

``install_fault_injection`` adds the ``FaultInjection`` callback to a trainer only when one of
these is set; otherwise the loop runs without it.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from workers.events import Event
from workers.state import State

if TYPE_CHECKING:
    from workers.trainer import Trainer

DELAY_ENV = "TESSERA_TEST_BATCH_DELAY_S"
KILL_AT_ENV = "TESSERA_TEST_KILL_AT_BATCH"
KILL_MARKER_ENV = "TESSERA_TEST_KILL_MARKER"
KILL_RANK_ENV = "TESSERA_TEST_KILL_RANK"
KILL_DURING_ENV = "TESSERA_TEST_KILL_DURING"
KILL_DURING = ("batch", "eval", "save")


class FaultInjection:
    """A ``Callback`` that acts at ``BATCH_END``: sleeps ``delay_s``, and SIGKILLs this process
    after each batch of ``kill_at_batch`` (one batch or several) on rank ``kill_rank`` (None: the
    last), once a batch: not where ``marker`` records a kill already."""

    def __init__(self, *, delay_s: float = 0.0, kill_at_batch: int | Iterable[int] | None = None,
                 marker: str | None = None, kill_rank: int | None = None,
                 before_kill: Callable[[], None] = lambda: None, during: str = "batch"):
        if during not in KILL_DURING:
            raise ValueError(f"{KILL_DURING_ENV}={during!r}: use one of {', '.join(KILL_DURING)}")
        batches = () if kill_at_batch is None else (kill_at_batch,) if isinstance(kill_at_batch, int) else kill_at_batch
        self.kill_at_batches = frozenset(batches)
        self.delay_s, self.marker, self.kill_rank = delay_s, marker, kill_rank
        self.during = during
        self.before_kill = before_kill if during != "save" else (lambda: None)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, before_kill: Callable[[], None] = lambda: None,
                 ) -> "FaultInjection | None":
        """The faults ``environ`` asks for, or None when it asks for none."""
        delay, at, marker = environ.get(DELAY_ENV), environ.get(KILL_AT_ENV), environ.get(KILL_MARKER_ENV)
        kill = bool(at and marker)
        if not delay and not kill:
            return None
        rank = environ.get(KILL_RANK_ENV)
        return cls(delay_s=float(delay or 0.0), kill_at_batch=_batches(at) if kill else None,
                   marker=marker if kill else None, kill_rank=int(rank) if rank else None,
                   before_kill=before_kill, during=environ.get(KILL_DURING_ENV) or "batch")

    def run_event(self, event: Event, state: State) -> None:
        if event is Event.BATCH_END and self.delay_s:
            time.sleep(self.delay_s)
        kill_event = Event.EVAL_START if self.during == "eval" else Event.BATCH_END
        batch = state.timestamp.batch
        if event is not kill_event or batch not in self.kill_at_batches:
            return
        kill_rank = self.kill_rank if self.kill_rank is not None else state.world_size - 1
        if state.rank != kill_rank or batch in (at for at, _ in killed_at(self.marker)):
            return
        with open(self.marker, "a") as f:  # the restarted worker reads it: written before the kill
            f.write(f"{batch} {os.getpid()}\n")
        self.before_kill()
        os.kill(os.getpid(), signal.SIGKILL)


def killed_at(marker: str | os.PathLike) -> list[tuple[int, int]]:
    """The kills ``marker`` records, in the order they happened: (batch, pid of the killed process)."""
    if not os.path.exists(marker):
        return []
    with open(marker) as f:
        return [(int(batch), int(pid)) for batch, pid in (line.split() for line in f if line.strip())]


def _batches(value: str) -> tuple[int, ...]:
    """``TESSERA_TEST_KILL_AT_BATCH``: one batch (``5``) or several (``4,5,7``)."""
    try:
        return tuple(int(part) for part in value.split(","))
    except ValueError:
        raise ValueError(f"{KILL_AT_ENV}={value!r}: use a batch number, or several separated by commas") from None


def install_fault_injection(trainer: "Trainer", environ: Mapping[str, str] | None = None) -> None:
    """Add ``FaultInjection`` to ``trainer``'s callbacks if the environment asks for a fault."""
    faults = FaultInjection.from_env(os.environ if environ is None else environ,
                                     before_kill=trainer.checkpoints.wait)
    if faults is not None:
        trainer.engine.callbacks.append(faults)
