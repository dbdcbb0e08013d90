"""Test-only faults, asked for through the environment: slow batches and a worker SIGKILL.

Tests reach training that runs in other processes (a Ray job, Ray Train workers, the CLI) only
through the environment, which the dispatcher and ``fit_with_ray`` forward (``TESSERA_TEST_*``):

- ``TESSERA_TEST_BATCH_DELAY_S``: sleep this long after each batch, so a test can act on a
  running run;
- ``TESSERA_TEST_KILL_AT_BATCH=B`` with ``TESSERA_TEST_KILL_MARKER=path``: the rank
  ``TESSERA_TEST_KILL_RANK`` (default: the last) SIGKILLs itself at the end of batch B, before
  an evaluation or checkpoint due at B, once (the marker file records that it happened, so the
  restarted worker trains on). An asynchronous checkpoint still being written is finished first.
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
from typing import TYPE_CHECKING, Callable, Mapping

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
    after batch ``kill_at_batch`` on rank ``kill_rank`` (None: the last) unless ``marker`` exists."""

    def __init__(self, *, delay_s: float = 0.0, kill_at_batch: int | None = None, marker: str | None = None,
                 kill_rank: int | None = None, before_kill: Callable[[], None] = lambda: None,
                 during: str = "batch"):
        if during not in KILL_DURING:
            raise ValueError(f"{KILL_DURING_ENV}={during!r}: use one of {', '.join(KILL_DURING)}")
        self.delay_s, self.kill_at_batch, self.marker, self.kill_rank = delay_s, kill_at_batch, marker, kill_rank
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
        return cls(delay_s=float(delay or 0.0), kill_at_batch=int(at) if kill else None,
                   marker=marker if kill else None, kill_rank=int(rank) if rank else None,
                   before_kill=before_kill, during=environ.get(KILL_DURING_ENV) or "batch")

    def run_event(self, event: Event, state: State) -> None:
        if event is Event.BATCH_END and self.delay_s:
            time.sleep(self.delay_s)
        kill_event = Event.EVAL_START if self.during == "eval" else Event.BATCH_END
        if event is not kill_event or self.kill_at_batch is None or state.timestamp.batch != self.kill_at_batch:
            return
        kill_rank = self.kill_rank if self.kill_rank is not None else state.world_size - 1
        if state.rank != kill_rank or os.path.exists(self.marker):
            return
        with open(self.marker, "w") as f:
            f.write(str(os.getpid()))
        self.before_kill()
        os.kill(os.getpid(), signal.SIGKILL)


def install_fault_injection(trainer: "Trainer", environ: Mapping[str, str] | None = None) -> None:
    """Add ``FaultInjection`` to ``trainer``'s callbacks if the environment asks for a fault."""
    faults = FaultInjection.from_env(os.environ if environ is None else environ,
                                     before_kill=trainer.checkpoints.wait)
    if faults is not None:
        trainer.engine.callbacks.append(faults)
