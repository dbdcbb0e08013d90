"""Logs by byte offset: ``GET /api/v1/runs/{run_id}/logs``, one attempt's worker stdout/stderr,
and ``GET /api/v1/sweeps/{sweep_id}/logs``, one sweep driver attempt's log (read like a run's).

A live attempt is read from Ray's job log (the freshest), falling back to the stored copy when
Ray cannot be asked; an ended attempt is read from storage (``service.log_store``), where the
dispatcher copies it, once the copy there is its finished job's whole log. Until then (a run
ends as its worker reports it, a moment before its job's driver writes its last lines and
exits; or the service was down when it ended) it is read from Ray, stored on the way once the
job has finished, and the page stays ``live`` while the job is still finishing (for
``FINISHING_S`` at most: a driver that hangs): a reader that follows the log until ``live``
turns false gets every line, the failure's traceback included. An attempt's job is found from
its events: its own start, or, for an attempt a Ray Train restart began, the job it restarted
in; an attempt that never started has none.

A sweep's trial has no job of its own: an attempt that started under a sweep driver (its start
event names the driver attempt) shows that driver attempt's log, read as the sweep's own route
reads it: from Ray while the driver runs, else the copy the dispatcher keeps under the sweep
(every few ticks while the driver runs, and once its attempt ends, after which Ray is told to
forget the job). Nothing is stored under a trial: every trial of a driver attempt would hold
its own copy of the same log.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from api.logs import LogsPage, SweepLogsPage
from api.validation_errors import field_error
from api.views import RunStatus
from service.attempt_store import attempt_job_id
from service.access import Role
from service.deps import CallerDep, JobsDep, RepoDep, SweepsDep
from service.errors import VALIDATION_RESPONSES, ErrorBody, validation_response
from service.json_body import ParsedBodyRoute
from service.log_archive import Attempt, save_log
from service.log_store import LogStore, get_log_store
from service.ray_client import FINISHED_JOB_STATES
from service.routes.runs import scoped_run
from service.routes.sweeps import scoped_sweep
from service.sweep_repository import trial_driver_attempt

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api/v1/runs", tags=["runs"], responses=VALIDATION_RESPONSES, route_class=ParsedBodyRoute)
sweep_router = APIRouter(prefix="/api/v1/sweeps", tags=["sweeps"], responses=VALIDATION_RESPONSES,
                         route_class=ParsedBodyRoute)

MAX_PAGE_BYTES = 1 << 20
# How long after its record ended a job may still be writing its log (its driver's last lines and
# exit): a page stays ``live`` that long at most for a job that does not finish (a hung driver).
FINISHING_S = 120.0
# The query of both routes
AttemptQuery = Annotated[int | None, Query(ge=1, description="default: the newest attempt")]
AfterQuery = Annotated[int, Query(ge=0, le=2**62, description="byte offset to read from")]
LimitQuery = Annotated[int, Query(ge=1, le=MAX_PAGE_BYTES, description="most bytes to return")]
StoreDep = Annotated[LogStore, Depends(get_log_store)]


@router.get("/{run_id}/logs", response_model=LogsPage, operation_id="get_run_logs",
            responses={404: {"model": ErrorBody}})
def get_run_logs(run_id: str, repo: RepoDep, sweeps: SweepsDep, caller: CallerDep, jobs: JobsDep, store: StoreDep,
                 attempt: AttemptQuery = None, after: AfterQuery = 0, limit: LimitQuery = 256 * 1024) -> LogsPage:
    """Up to ``limit`` bytes of the attempt's log from byte ``after``; a page ends at a line end
    when it can. Follow a live run by polling with ``after=next_offset`` while ``live``."""
    run = scoped_run(repo, caller, run_id, Role.VIEWER)  # another project's run is a 404
    attempt = run.attempt if attempt is None else attempt
    if attempt > run.attempt:
        return _no_such_attempt(f"run {run_id}", attempt, run.attempt)
    live = attempt == run.attempt and not run.status.is_terminal
    events = repo.events(run.id)
    start = _start_of(events, attempt)
    # Decided per attempt: a trial resumed by hand runs its later attempts as jobs of its own.
    driver_attempt = trial_driver_attempt(start.message) if start is not None and run.sweep_id else None
    if driver_attempt is None:
        job_id = _job_of(events, start, run, attempt)
        data, source, live = _read(Attempt(run_id, attempt, job_id, run.project), live=live,
                                   ended_at=_ended_at(events, run, attempt), jobs=jobs, store=store)
    else:
        sweep = sweeps.get_sweep(run.sweep_id)
        data, source, _ = _read_driver(sweep, driver_attempt, jobs=jobs, store=store)
        live = live and sweep.driver == "service"  # an external driver's trials log nowhere here
        if source == "none":  # a copy stored under the trial itself, by service versions before this one
            stored = store.read(run_id, attempt, project=run.project)
            data, source = (stored, "storage") if stored is not None else (data, source)
    return LogsPage(run_id=run_id, **_page(data, after, limit), attempt=attempt, attempts=run.attempt,
                    live=live, source=source)


@sweep_router.get("/{sweep_id}/logs", response_model=SweepLogsPage, operation_id="get_sweep_logs",
                  responses={404: {"model": ErrorBody}})
def get_sweep_logs(sweep_id: str, sweeps: SweepsDep, caller: CallerDep, jobs: JobsDep, store: StoreDep,
                   attempt: AttemptQuery = None, after: AfterQuery = 0, limit: LimitQuery = 256 * 1024
                   ) -> SweepLogsPage:
    """Up to ``limit`` bytes of the sweep driver attempt's log (the Tune driver's output and
    every trial's) from byte ``after``, as ``get_run_logs`` pages a run's. An external driver
    runs outside Ray's Jobs API: its sweep has no log here (``source`` "none", never ``live``)."""
    sweep = scoped_sweep(sweeps, caller, sweep_id, Role.VIEWER)  # another project's sweep is a 404
    attempt = sweep.attempt if attempt is None else attempt
    if attempt > sweep.attempt:
        return _no_such_attempt(f"sweep {sweep_id}", attempt, sweep.attempt)
    data, source, live = _read_driver(sweep, attempt, jobs=jobs, store=store)
    return SweepLogsPage(sweep_id=sweep_id, **_page(data, after, limit), attempt=attempt, attempts=sweep.attempt,
                         live=live, source=source)


def _no_such_attempt(what: str, attempt: int, newest: int):
    return validation_response([field_error("attempt", ["query", "attempt"], f"{what} has attempts 1..{newest}", attempt)])


def _page(data: bytes, after: int, limit: int) -> dict:
    """The page of ``data`` from byte ``after``: up to ``limit`` bytes, ending at a line end
    when one is in it (a line longer than ``limit`` is cut, and a UTF-8 character with it);
    its text, offsets and the log's size."""
    chunk = data[after:after + limit]
    if len(chunk) == limit and b"\n" in chunk:
        chunk = chunk[:chunk.rfind(b"\n") + 1]
    return {"text": chunk.decode(errors="replace"), "offset": after, "next_offset": after + len(chunk),
            "size": len(data)}


def _start_of(events: list, attempt: int):
    """The event that started the Ray job the run's ``attempt`` ran in: the attempt's own
    QUEUED → STARTING, or, for an attempt a Ray Train restart began (RESTARTING), that of the
    attempt it restarted, which goes on in the same job; None for an attempt that never started
    (queued, or canceled while queued)."""
    while attempt >= 1:
        own = [event for event in events if event.attempt == attempt]
        started = [event for event in own if event.to_status is RunStatus.STARTING]
        if started:
            return started[-1]
        if not any(event.to_status is RunStatus.RESTARTING for event in own):
            return None
        attempt -= 1
    return None


def _job_of(events: list, start, run, attempt: int) -> str:
    """The run's job that ``attempt`` ran in (``start``: ``_start_of``), or "" when it has none
    of its own to read: it never started, or a later attempt (a Ray Train restart) goes on in
    the same job, whose log in Ray is then the later one's too, and the attempt's own log is the
    copy stored under it."""
    if start is None or (attempt < run.attempt and _start_of(events, attempt + 1) is start):
        return ""
    return attempt_job_id("run", run.id, start.attempt)


def _ended_at(events: list, run, attempt: int) -> datetime | None:
    """When the service learned that the run's ``attempt`` ended: for its current attempt, its
    last event (the end; None while it runs), not ``finished_at``, the worker's own time, which
    after an outage its report waited out is long before the report came and the job's last
    lines with it; for an earlier attempt, when the next one began."""
    if attempt == run.attempt:
        if run.finished_at is None:
            return None
        return max((event.time for event in events if event.attempt == attempt), default=run.finished_at)
    return min((event.time for event in events if event.attempt > attempt), default=None)


def _read(attempt: Attempt, *, live: bool, ended_at: datetime | None, jobs, store: LogStore
          ) -> tuple[bytes, str, bool]:
    """A run attempt's or sweep driver attempt's whole log, where it came from, and whether more
    may come: ``live`` (the record's status says the attempt runs), or its record ended at
    ``ended_at`` and its job is still finishing, for ``FINISHING_S`` at most (see the module
    docstring for the order)."""
    if live and attempt.job_id:
        text = _from_ray(jobs, attempt.job_id)
        if text is not None:
            return text.encode(), "ray", True
    where = {"project": attempt.project, "kind": attempt.kind}
    # The marker first: it is written after the log, so a log read after it is the final one.
    final = not live and bool(attempt.job_id) and store.is_final(attempt.record_id, attempt.attempt, **where)
    stored = store.read(attempt.record_id, attempt.attempt, **where)
    if live or final or not attempt.job_id:
        return _stored(stored, live)
    try:
        state = jobs.status(attempt.job_id)
    except Exception as exc:  # Ray cannot be asked: the stored copy is the answer for now
        log.info("could not ask Ray about %s: %s", attempt.job_id, exc)
        return _stored(stored, False)
    if state is None:  # Ray has forgotten the job (after its final copy): nothing more will come
        if stored is not None:
            _mark_final(store, attempt)  # a copy stored before there were markers: read as final from now on
        return _stored(stored, False)
    text = _from_ray(jobs, attempt.job_id)
    if text is None:
        return _stored(stored, False)
    if state in FINISHED_JOB_STATES:
        try:  # its finished job's whole log: stored (if the archiver has not yet) and marked final
            save_log(store, attempt, text, final=True)
        except Exception as exc:  # the reader still gets the log; a later read stores it
            log.info("could not store the log of %s: %s", attempt.job_id, exc)
        return text.encode(), "ray", False
    # Still running after its record ended: its driver writing its last lines, unless it hangs.
    return text.encode(), "ray", ended_at is None or _seconds_since(ended_at) < FINISHING_S


def _stored(stored: bytes | None, live: bool) -> tuple[bytes, str, bool]:
    return (stored, "storage", live) if stored is not None else (b"", "none", live)


def _mark_final(store: LogStore, attempt: Attempt) -> None:
    try:
        store.mark_final(attempt.record_id, attempt.attempt, project=attempt.project, kind=attempt.kind)
    except Exception as exc:  # the next read tries again
        log.info("could not mark the log of %s final: %s", attempt.job_id, exc)


def _seconds_since(moment: datetime) -> float:
    return (datetime.now(timezone.utc) - moment).total_seconds()  # stored times read back aware, in UTC


def _read_driver(sweep, attempt: int, *, jobs, store: LogStore) -> tuple[bytes, str, bool]:
    """A sweep driver attempt's whole log, where it came from, and whether it is live (read as a
    run attempt's is). An external driver runs outside Ray's Jobs API: no log, never live."""
    if sweep.driver != "service":
        return b"", "none", False
    live = attempt == sweep.attempt and not sweep.status.is_terminal
    # The current attempt's job is the sweep's (none while it is queued); an earlier one's, by its id.
    job_id = sweep.ray_job_id if attempt == sweep.attempt else attempt_job_id("sweep", sweep.id, attempt)
    ended_at = sweep.updated_at if sweep.status.is_terminal else None  # a terminal sweep was last updated as it ended
    return _read(Attempt(sweep.id, attempt, job_id, sweep.project, "sweep"), live=live, ended_at=ended_at,
                 jobs=jobs, store=store)


def _from_ray(jobs, job_id: str) -> str | None:
    try:
        return jobs.job_logs(job_id)
    except Exception as exc:  # Ray unreachable: the stored copy (or nothing) is the answer
        log.info("could not read Ray's log of %s: %s", job_id, exc)
        return None
