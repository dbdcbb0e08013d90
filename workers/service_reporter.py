"""``ServiceReporter``: rank 0's reports to the Tessera service, through the service's outages.

Every report goes to the run's spool on local disk first (``workers.spool``); one sender thread
delivers the spool's head, oldest first, and removes it once the service answered. So:

- nothing measured is dropped while the service (or its database) is down: reports wait in the
  spool and are replayed in order when it answers again, also by the next reporter of the run
  on this machine if this one is killed;
- a replayed metric batch is stored once (it carries this reporter's ``session`` and its batch
  number; the service remembers the last one stored), and status reports are idempotent;
- when the service has not answered for ``patience_s`` (``TESSERA_REPORT_PATIENCE_S``, 30 min),
  or the spool is full (``TESSERA_SPOOL_MAX_BYTES``) for that long, the next call from the
  training loop raises ``ReportsUndeliverable``: the run fails, saying so, and the spool keeps
  what was measured;
- a report the service refuses (a 4xx: the run was canceled meanwhile, or its token revoked)
  is logged and removed: retrying it cannot succeed;
- a service older than this worker refuses a report that carries a field it does not know (its
  report models forbid unknown fields: 422). When all it refused are fields the report may do
  without (``StatusReport.omittable_for_older_services``: RUNNING's ``started_at``, the end's
  ``ended_at``), it is sent once more without them, and the first time per field a warning says
  the service is older (``send_status``, also for the end ``workers.outcome`` reports).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel

from api.client import Client
from api.errors import ApiError
from api.views import CheckpointReport, MetricsReport, NoteReport, ReportedMetric, RunStatus, StatusReport
from workers.retry import PATIENCE_ENV, is_retryable, report_patience_s
from workers.spool import Entry, Spool, SpoolFull

log = logging.getLogger(__name__)

MAX_POINTS_PER_POST = 5000  # the service accepts up to 10k per report
MAX_NOTE_CHARS = 2_000


class ReportsUndeliverable(RuntimeError):
    """The service did not take this run's reports for longer than the run's patience."""


def fields_unknown_to_service(exc: BaseException, sent: BaseModel) -> frozenset[str]:
    """The fields of ``sent`` that the service refused (``exc``, a 422) as unknown to it, when
    they are all it refused and each is one that ``sent``'s model may do without
    (``omittable_for_older_services``); else empty, and the refusal stands.

    Read from the 422's structure, not its wording: the service names each refused field by its
    location, ``["body", name]`` for a top-level one (``service.errors``); an item that also says
    its ``type`` (FastAPI's own 422 body does) must say ``extra_forbidden``. The service's items
    carry no type (``api.validation_errors``), so a service that knew such a field and refused
    its value would read the same: the field, a time that only refines the report, goes then too.
    """
    omittable = getattr(type(sent), "omittable_for_older_services", frozenset())
    detail = exc.detail if isinstance(exc, ApiError) and exc.status_code == 422 else None
    if not omittable or not isinstance(detail, list) or not detail:
        return frozenset()
    names = set()
    for item in detail:
        loc = item.get("loc") if isinstance(item, dict) else None
        if not (isinstance(loc, list) and len(loc) == 2 and loc[0] == "body" and isinstance(loc[1], str)):
            return frozenset()
        name = loc[1]
        sent_it = name in omittable and getattr(sent, name, None) is not None
        if not sent_it or item.get("type", "extra_forbidden") != "extra_forbidden":
            return frozenset()
        names.add(name)
    return frozenset(names)


# (report, field) the service refused as unknown: warned about once per process, then left out up
# front, so an older service gets one request per report, not a refused one and its retry.
_unknown_to_service: set[tuple[str, str]] = set()
_unknown_lock = threading.Lock()


def warn_once_unknown_fields(report: str, names: frozenset[str]) -> None:
    """Log, once per process for each of ``names``, that the service is older than this worker
    and ``report`` reports go without that field."""
    with _unknown_lock:
        new = sorted(name for name in names if (report, name) not in _unknown_to_service)
        _unknown_to_service.update((report, name) for name in new)
    for name in new:
        log.warning("the Tessera service is older than this worker: it does not know the %s report field %r, so "
                    "%s reports are sent without it (the service times them by their arrival); upgrade the "
                    "service to record it", report, name, report)


def send_status(client: Client, run_id: str, token: str | None, report: StatusReport) -> None:
    """Deliver ``report``; refused for fields the service does not know and the report may do
    without, once more without them (a 422 of anything else, or of the second try, raises). Every
    status a worker sends goes through here: this reporter's and the run's end (``workers.outcome``).
    A field the service refused once is left out of every later report at once."""
    with _unknown_lock:
        known = {name for kind, name in _unknown_to_service if kind == "status"}
    if left_out := known & report.omittable_for_older_services:
        report = report.model_copy(update=dict.fromkeys(left_out))
    try:
        client.report_status(run_id, token, report)
    except ApiError as exc:
        unknown = fields_unknown_to_service(exc, report)
        if not unknown:
            raise
        warn_once_unknown_fields("status", unknown)
        # report_status sends no unset field (exclude_none): None leaves the field out.
        client.report_status(run_id, token, report.model_copy(update=dict.fromkeys(unknown)))


class ServiceReporter:
    """A ``MetricSink`` over ``api.client.Client`` and a ``Spool`` (see the module docstring).
    Points are buffered in memory and spooled as one batch every ``interval_s`` (and at each
    ``flush``, ``status`` and ``close``)."""

    def __init__(self, client: Client, run_id: str, token: str, *, interval_s: float = 1.0,
                 patience_s: float | None = None, first_delay_s: float = 0.5, max_delay_s: float = 10.0,
                 spool: Spool | None = None):
        self.client, self.run_id = client, run_id
        self._token = token  # never logged
        self.interval_s, self.first_delay_s, self.max_delay_s = interval_s, first_delay_s, max_delay_s
        self.patience_s = report_patience_s() if patience_s is None else patience_s
        self.spool = spool if spool is not None else Spool.for_run(run_id)
        self.session = uuid.uuid4().hex
        self.posted = 0   # points the service stored
        self.refused = 0  # reports the service refused (4xx)
        self.failure: ReportsUndeliverable | None = None
        self._batch = 0
        self._pending: list[ReportedMetric] = []
        self._lock = threading.Lock()        # guards _pending
        self._spooling = threading.Lock()    # one mover at a time: batches enter the spool in order
        self._wake = threading.Event()
        self._answered = threading.Condition()  # notified as the sender removes a report or fails to send one
        self.retrying = False  # the sender's last try failed (the service is unreachable or answers 5xx)
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._send_loop, name="tessera-reports", daemon=True)
        self._thread.start()

    # --- the MetricSink protocol (training thread; checkpoint writer for ``checkpoint``) ---
    def add(self, step: int, key: str, value: float) -> None:
        self._raise_if_failed()
        value = float(value)
        if not math.isfinite(value):  # JSON has no NaN/inf; say so instead of failing a batch
            log.warning("not reporting %s=%s at step %d: not a finite number", key, value, step)
            return
        point = ReportedMetric(step=step, key=key, value=value, time=datetime.now(timezone.utc))
        with self._lock:
            self._pending.append(point)

    def status(self, status: RunStatus, *, error: str | None = None, message: str | None = None,
               step: int | None = None) -> None:
        """Queue a status change after the pending metrics; returns without waiting for it.
        RUNNING says when it was made (``started_at``: training begins), which stays the attempt's
        start however late the spool delivers it."""
        started_at = datetime.now(timezone.utc) if status is RunStatus.RUNNING else None
        self._spool_pending(wait=True)
        self._put("status", StatusReport(status=status, error=error, message=message, step=step,
                                         started_at=started_at))

    def checkpoint(self, report: dict[str, Any]) -> None:
        self._put("checkpoint", CheckpointReport.model_validate(report))

    def note(self, message: str) -> None:
        """A run event saying ``message`` (from the checkpoint writer: retention failed)."""
        self._put("note", NoteReport(message=message[:MAX_NOTE_CHARS]))

    def flush(self) -> None:
        """Spool what is pending and wake the sender; holds training while the spool is full."""
        self._spool_pending(wait=True)
        self._wake.set()

    def deliver(self, timeout_s: float) -> bool:
        """``flush``, then wait up to ``timeout_s`` until the service has answered every report
        spooled so far (stored it, or refused it: logged). False if it has not by then, or as soon
        as a try fails (the service is down: the reports wait in the spool, and training does not
        wait out ``timeout_s`` at every evaluation of an outage). Raises ``ReportsUndeliverable``
        as ``flush`` does once the sender has given up."""
        self.flush()
        target = self.spool.last_put()  # the spool's, not the caller's: the checkpoint writer puts too
        deadline = time.monotonic() + timeout_s
        with self._answered:
            while self.spool.holds_through(target):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.retrying or self.failure is not None or not self._thread.is_alive():
                    return False
                self._answered.wait(remaining)
        return True

    def close(self) -> None:
        """Deliver everything spooled; raises ``ReportsUndeliverable`` past the patience."""
        try:
            self._spool_pending(wait=True)
        finally:
            self._closing.set()
            self._wake.set()
            self._thread.join()
        self._raise_if_failed()
        self.spool.remove_if_empty()

    # --- spooling -----------------------------------------------------------------------
    def _raise_if_failed(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _put(self, kind: str, body: Any, *, wait: bool = True) -> bool:
        """Spool one report; with ``wait``, hold the caller while the spool is full (the
        sender makes room, or fails the run past the patience)."""
        payload = body.model_dump(mode="json")
        while True:
            self._raise_if_failed()
            try:
                self.spool.put(kind, payload)
                self._wake.set()
                return True
            except SpoolFull:
                if not wait:
                    return False
                log.warning("report spool full; training waits for the service to take reports")
                time.sleep(min(1.0, self.interval_s))

    def _spool_pending(self, *, wait: bool) -> None:
        """Move buffered points into the spool as numbered batches, in order. The sender thread
        (``wait=False``) skips this while the training thread is at it, so it never blocks the
        deliveries that make room in a full spool."""
        if not self._spooling.acquire(blocking=wait):
            return
        try:
            with self._lock:
                points, self._pending = self._pending, []
            while points:
                chunk, points = points[:MAX_POINTS_PER_POST], points[MAX_POINTS_PER_POST:]
                report = MetricsReport(points=chunk, session=self.session, batch=self._batch + 1)
                if not self._put("metrics", report, wait=wait):
                    with self._lock:  # spool full: keep them, in order, for the next try
                        self._pending = chunk + points + self._pending
                    return
                self._batch += 1
        finally:
            self._spooling.release()

    # --- delivering (the sender thread) ---------------------------------------------------
    def _send_loop(self) -> None:
        down_since: float | None = None
        delay = self.first_delay_s
        while True:
            entry = self.spool.head()
            if entry is None:
                if self._closing.is_set():
                    return
                self._wake.wait(self.interval_s)
                self._wake.clear()
                self._spool_pending(wait=False)
                continue
            try:
                self._deliver(entry)
            except Exception as exc:
                if not is_retryable(exc):
                    self.refused += 1
                    self.retrying = False
                    log.error("the service refused %s report of run %s: %s: %s", entry.kind, self.run_id,
                              type(exc).__name__, exc)
                    self._answer(entry.seq)
                    continue
                now = time.monotonic()
                down_since = down_since if down_since is not None else now
                if now - down_since > self.patience_s:
                    self._fail(exc)
                    self._answer(None)
                    return
                log.warning("reporting to the service failed (%s: %s); %d report(s) spooled, retrying in %.1fs",
                            type(exc).__name__, exc, len(self.spool), delay)
                self.retrying = True
                self._answer(None)
                time.sleep(delay)
                delay = min(2 * delay, self.max_delay_s)
                continue
            self.retrying = False
            self._answer(entry.seq)
            down_since, delay = None, self.first_delay_s

    def _answer(self, seq: int | None) -> None:
        """The service answered report ``seq`` (None: a try failed, or the sender gave up): wake
        ``deliver``."""
        if seq is not None:
            self.spool.pop(seq)
        with self._answered:
            self._answered.notify_all()

    def _deliver(self, entry: Entry) -> None:
        if entry.kind == "metrics":
            report = MetricsReport.model_validate(entry.body)
            stored = self.client.report_metrics(self.run_id, self._token, report)
            self.posted += stored
        elif entry.kind == "status":
            self._report_status(StatusReport.model_validate(entry.body))
        elif entry.kind == "checkpoint":
            self.client.report_checkpoint(self.run_id, self._token, CheckpointReport.model_validate(entry.body))
        elif entry.kind == "note":
            self.client.report_note(self.run_id, self._token, NoteReport.model_validate(entry.body))
        else:
            log.error("skipping a spooled report of unknown kind %r", entry.kind)

    def _report_status(self, report: StatusReport) -> None:
        send_status(self.client, self.run_id, self._token, report)

    def _fail(self, exc: BaseException) -> None:
        self.failure = ReportsUndeliverable(
            f"the Tessera service did not take reports of run {self.run_id} for {self.patience_s:.0f}s "
            f"({PATIENCE_ENV}); last error {type(exc).__name__}: {exc}; {len(self.spool)} report(s) are kept in "
            f"{self.spool.directory}")
        log.error("%s", self.failure)
