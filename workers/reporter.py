"""Where the trainer's metrics and status go: the ``MetricSink`` protocol and its sinks.

- ``ServiceReporter`` (``workers.service_reporter``) posts to the Tessera service over HTTP,
  spooling to local disk what the service cannot take yet and replaying it in order.
- ``ConsoleReporter`` prints one line per evaluation or epoch, for local runs.
- ``MemorySink`` keeps everything in memory (tests, notebooks); ``NullSink`` drops everything
  (ranks other than 0).
"""

from __future__ import annotations

import sys
from typing import Any, Protocol, TextIO

from api.views import RunStatus


class MetricSink(Protocol):
    """What the trainer reports to; every sink implements all of it. ``checkpoint`` gets the
    fields of ``api.views.CheckpointReport`` for every commit and every failed save (from the
    checkpoint writer's thread with ``async_save``). ``status`` with RUNNING may carry ``step``,
    the step the attempt resumes from (0: a fresh start). ``flush`` marks a natural boundary (an
    evaluation, the end of an epoch): push what is buffered; it may return before delivery.
    ``deliver(timeout_s)`` waits up to that long until what was flushed has been delivered and
    says whether it was (a sweep trial's evaluation reaches the service before Tune's scheduler
    sees it); a sink that writes as it is called returns True at once.
    ``note`` is something the run's owner must see that is not a status change (retention of
    old checkpoints failed): a run event on the service. ``close`` delivers everything and
    releases resources. Rank 0 reports no terminal status itself: the service hears the end from
    ``workers.outcome``, and the spec's loggers from ``workers.loggers.closed_at_end``."""

    def add(self, step: int, key: str, value: float) -> None: ...

    def status(self, status: RunStatus, *, error: str | None = None, message: str | None = None,
               step: int | None = None) -> None: ...

    def checkpoint(self, report: dict[str, Any]) -> None: ...

    def note(self, message: str) -> None: ...

    def flush(self) -> None: ...

    def deliver(self, timeout_s: float) -> bool: ...

    def close(self) -> None: ...


class ConsoleReporter:
    """Prints one line per ``flush`` that brings new values (the trainer flushes after each
    evaluation and at each epoch's end): step, epoch, progress and the latest metrics."""

    KEYS = ("train/loss", "eval/loss", "eval/accuracy", "lr", "throughput/samples_per_sec")

    def __init__(self, stream: TextIO | None = None, prefix: str = ""):
        self.stream = stream or sys.stdout
        self.prefix = prefix
        self.latest: dict[str, float] = {}
        self._step = 0
        self._fresh = False

    SHOWN = frozenset({*KEYS, "time/epoch", "time/progress"})

    def add(self, step: int, key: str, value: float) -> None:
        self.latest[key] = float(value)
        self._step = max(self._step, step)
        # A key the line does not show (checkpoint/final_saved, after the last flush) prints nothing new.
        self._fresh = self._fresh or key in self.SHOWN

    def status(self, status: RunStatus, *, error: str | None = None, message: str | None = None,
               step: int | None = None) -> None:
        detail = error or message
        self._line(f"status {status.value}" + (f": {detail}" if detail else ""))

    def checkpoint(self, report: dict[str, Any]) -> None:
        outcome = "committed" if report["committed"] else f"NOT committed: {report.get('error')}"
        self._line(f"checkpoint {report['url']} {outcome}")

    def note(self, message: str) -> None:
        self._line(f"note: {message}")

    def flush(self) -> None:
        if not self._fresh:
            return
        self._fresh = False
        parts = [f"step {self._step}"]
        if "time/epoch" in self.latest:
            parts.append(f"epoch {int(self.latest['time/epoch'])}")
        if "time/progress" in self.latest:
            parts.append(f"{100 * self.latest['time/progress']:.0f}%")
        parts += [f"{key} {self.latest[key]:.4g}" for key in self.KEYS if key in self.latest]
        self._line(" | ".join(parts))

    def deliver(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        self.flush()

    def _line(self, text: str) -> None:
        # Written, not print()ed: in a Ray Train worker print is Ray's (ray/train/v2/_internal/
        # logging/patch_print.py), which sends a line for a wrapped sys.stdout both to the
        # stream and to the root logger, and every line then showed twice in the worker's output.
        self.stream.write(f"{self.prefix}{text}\n")
        self.stream.flush()


class MemorySink:
    """Keeps every point and status in memory: ``points`` is ``[(step, key, value), ...]``."""

    def __init__(self) -> None:
        self.points: list[tuple[int, str, float]] = []
        self.statuses: list[dict[str, Any]] = []
        self.checkpoints: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.flushes = 0
        self.closed = False

    def add(self, step: int, key: str, value: float) -> None:
        self.points.append((step, key, float(value)))

    def status(self, status: RunStatus, *, error: str | None = None, message: str | None = None,
               step: int | None = None) -> None:
        self.statuses.append({"status": status, "error": error, "message": message, "step": step})

    def checkpoint(self, report: dict[str, Any]) -> None:
        self.checkpoints.append(dict(report))

    def note(self, message: str) -> None:
        self.notes.append(message)

    def flush(self) -> None:
        self.flushes += 1

    def deliver(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        self.closed = True

    def values(self, key: str) -> list[tuple[int, float]]:
        """``[(step, value), ...]`` reported for ``key``, in order."""
        return [(step, value) for step, k, value in self.points if k == key]


class NullSink:
    """Drops everything: the sink of ranks other than 0."""

    def add(self, step: int, key: str, value: float) -> None:
        pass

    def status(self, status: RunStatus, *, error: str | None = None, message: str | None = None,
               step: int | None = None) -> None:
        pass

    def checkpoint(self, report: dict[str, Any]) -> None:
        pass

    def note(self, message: str) -> None:
        """Dropped: this sink keeps no run events."""

    def flush(self) -> None:
        pass

    def deliver(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass


# At the end: the service reporter implements the protocol above.
from workers.retry import call_with_retries, is_retryable  # noqa: E402,F401  (re-exported)
from workers.service_reporter import ReportsUndeliverable, ServiceReporter  # noqa: E402,F401
