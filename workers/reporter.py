"""Where the trainer's metrics and status go: the ``MetricSink`` protocol and its sinks.

- ``ServiceReporter`` posts to the Tessera service over HTTP, in batches from a background
  thread, retrying through a service restart.
- ``ConsoleReporter`` prints one line per evaluation or epoch, for local runs.
- ``MemorySink`` keeps everything in memory (tests, notebooks); ``NullSink`` drops everything
  (ranks other than 0).
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Protocol, TextIO, TypeVar

import httpx

from api.client import Client
from api.errors import ApiError
from api.views import CheckpointReport, MetricsReport, ReportedMetric, RunStatus, StatusReport

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_BUDGET_S = 120.0  # long enough to outlive a service restart
MAX_POINTS_PER_POST = 5000  # the service accepts up to 10k per report


class MetricSink(Protocol):
    """What the trainer reports to; every sink implements all of it. ``checkpoint`` gets the
    fields of ``api.views.CheckpointReport`` for every commit and every failed save (from the
    checkpoint writer's thread with ``async_save``). ``flush`` marks a natural boundary (an
    evaluation, the end of an epoch): push what is buffered; it may return before delivery.
    ``close`` delivers everything and releases resources."""

    def add(self, step: int, key: str, value: float) -> None: ...

    def status(self, status: RunStatus, *, error: str | None = None, message: str | None = None) -> None: ...

    def checkpoint(self, report: dict[str, Any]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def is_retryable(exc: BaseException) -> bool:
    """Connection problems and 5xx/429 answers are worth retrying; other 4xx answers are not."""
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, ApiError) and (exc.status_code >= 500 or exc.status_code == 429)


def call_with_retries(fn: Callable[[], T], *, what: str, budget_s: float = RETRY_BUDGET_S,
                      first_delay_s: float = 0.5, max_delay_s: float = 10.0) -> T:
    """``fn()``, retried with exponential backoff on retryable errors for up to ``budget_s``."""
    deadline = time.monotonic() + budget_s
    delay = first_delay_s
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_retryable(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("%s failed (%s: %s); retrying in %.1fs", what, type(exc).__name__, exc, delay)
            time.sleep(delay)
            delay = min(2 * delay, max_delay_s)


class ServiceReporter:
    """A ``MetricSink`` over ``api.client.Client``: buffers points, posts them every
    ``interval_s`` from a background thread, retries connection errors and 5xx answers with
    backoff for up to ``budget_s``, and drops (and logs) batches the service refuses with 4xx."""

    def __init__(self, client: Client, run_id: str, token: str, *, interval_s: float = 1.0,
                 budget_s: float = RETRY_BUDGET_S, first_delay_s: float = 0.5):
        self.client, self.run_id = client, run_id
        self._token = token  # never logged
        self.interval_s, self.budget_s, self.first_delay_s = interval_s, budget_s, first_delay_s
        self.posted = 0
        self.dropped = 0
        self._pending: list[ReportedMetric] = []
        self._lock = threading.Lock()        # guards _pending
        self._post_lock = threading.Lock()   # one poster at a time: keeps points in order
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tessera-metrics", daemon=True)
        self._thread.start()

    def add(self, step: int, key: str, value: float) -> None:
        value = float(value)
        if not math.isfinite(value):  # JSON has no NaN/inf; say so instead of failing a batch
            log.warning("not reporting %s=%s at step %d: not a finite number", key, value, step)
            return
        point = ReportedMetric(step=step, key=key, value=value, time=datetime.now(timezone.utc))
        with self._lock:
            self._pending.append(point)

    def status(self, status: RunStatus, *, error: str | None = None, message: str | None = None) -> None:
        """Post a status change now (with retries), after pending metrics. A refused or
        undeliverable report is logged, not raised: training goes on, and the launcher reports
        the final status itself."""
        self._post_pending()
        report = StatusReport(status=status, error=error, message=message)
        self._deliver(lambda: self.client.report_status(self.run_id, self._token, report),
                      f"status {status.value}")

    def checkpoint(self, report: dict[str, Any]) -> None:
        """Tell the service about a committed or failed checkpoint (with retries; called from the
        checkpoint writer's thread with ``async_save``). Failures are logged, never raised."""
        body = CheckpointReport.model_validate(report)
        self._deliver(lambda: self.client.report_checkpoint(self.run_id, self._token, body),
                      f"checkpoint {body.url}")

    def _deliver(self, call, what: str) -> None:
        """Run one report call with retries; log (never raise) if it still fails."""
        try:
            self._retry(call, f"reporting {what}")
        except Exception as exc:
            log.error("could not report %s for run %s: %s: %s", what, self.run_id, type(exc).__name__, exc)

    def flush(self) -> None:
        self._wake.set()

    def close(self) -> None:
        """Stop the thread and deliver everything still buffered (retrying as usual)."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self._post_pending()

    def _retry(self, fn: Callable[[], T], what: str) -> T:
        return call_with_retries(fn, what=what, budget_s=self.budget_s, first_delay_s=self.first_delay_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self._post_pending()

    def _post_pending(self) -> None:
        with self._post_lock:
            with self._lock:
                points, self._pending = self._pending, []
            for start in range(0, len(points), MAX_POINTS_PER_POST):
                chunk = points[start:start + MAX_POINTS_PER_POST]
                try:
                    self._retry(lambda: self.client.report_metrics(
                        self.run_id, self._token, MetricsReport(points=chunk)), f"posting {len(chunk)} metrics")
                    self.posted += len(chunk)
                except Exception as exc:  # refused (4xx) or retries exhausted: drop, don't kill training
                    self.dropped += len(chunk)
                    log.error("dropped %d metric points for run %s: %s: %s",
                              len(chunk), self.run_id, type(exc).__name__, exc)


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

    def add(self, step: int, key: str, value: float) -> None:
        self.latest[key] = float(value)
        self._step = max(self._step, step)
        self._fresh = True

    def status(self, status: RunStatus, *, error: str | None = None, message: str | None = None) -> None:
        detail = error or message
        print(f"{self.prefix}status {status.value}" + (f": {detail}" if detail else ""), file=self.stream, flush=True)

    def checkpoint(self, report: dict[str, Any]) -> None:
        outcome = "committed" if report["committed"] else f"NOT committed: {report.get('error')}"
        print(f"{self.prefix}checkpoint {report['url']} {outcome}", file=self.stream, flush=True)

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
        print(self.prefix + " | ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        self.flush()


class MemorySink:
    """Keeps every point and status in memory: ``points`` is ``[(step, key, value), ...]``."""

    def __init__(self) -> None:
        self.points: list[tuple[int, str, float]] = []
        self.statuses: list[dict[str, Any]] = []
        self.checkpoints: list[dict[str, Any]] = []
        self.flushes = 0
        self.closed = False

    def add(self, step: int, key: str, value: float) -> None:
        self.points.append((step, key, float(value)))

    def status(self, status: RunStatus, *, error: str | None = None, message: str | None = None) -> None:
        self.statuses.append({"status": status, "error": error, "message": message})

    def checkpoint(self, report: dict[str, Any]) -> None:
        self.checkpoints.append(dict(report))

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True

    def values(self, key: str) -> list[tuple[int, float]]:
        """``[(step, value), ...]`` reported for ``key``, in order."""
        return [(step, value) for step, k, value in self.points if k == key]


class NullSink:
    """Drops everything: the sink of ranks other than 0."""

    def add(self, step: int, key: str, value: float) -> None:
        pass

    def status(self, status: RunStatus, *, error: str | None = None, message: str | None = None) -> None:
        pass

    def checkpoint(self, report: dict[str, Any]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
