"""A run's logs: ``GET /api/v1/runs/{run_id}/logs``, one attempt's worker stdout/stderr by byte offset.

A live attempt is read from Ray's job log (the freshest), falling back to the stored copy when
Ray cannot be asked; an ended attempt is read from storage (``service.log_store``), where the
dispatcher copies it. An ended attempt not copied yet (the service was down when it ended) is
read from Ray and stored on the way.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from api.logs import LogsPage
from service.attempt_store import attempt_job_id
from service.access import Role
from service.deps import CallerDep, JobsDep, RepoDep
from service.errors import VALIDATION_RESPONSES, ErrorBody, field_error, validation_response
from service.json_body import ParsedBodyRoute
from service.log_archive import Attempt, archive_final_log
from service.log_store import LogStore, get_log_store
from service.routes.runs import scoped_run

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api/v1/runs", tags=["runs"], responses=VALIDATION_RESPONSES, route_class=ParsedBodyRoute)

MAX_PAGE_BYTES = 1 << 20


@router.get("/{run_id}/logs", response_model=LogsPage, operation_id="get_run_logs",
            responses={404: {"model": ErrorBody}})
def get_run_logs(run_id: str, repo: RepoDep, caller: CallerDep, jobs: JobsDep, store: Annotated[LogStore, Depends(get_log_store)],
                 attempt: Annotated[int | None, Query(ge=1, description="default: the newest attempt")] = None,
                 after: Annotated[int, Query(ge=0, le=2**62, description="byte offset to read from")] = 0,
                 limit: Annotated[int, Query(ge=1, le=MAX_PAGE_BYTES, description="most bytes to return")] = 256 * 1024,
                 ) -> LogsPage:
    """Up to ``limit`` bytes of the attempt's log from byte ``after``; a page ends at a line end
    when it can. Follow a live run by polling with ``after=next_offset`` while ``live``."""
    run = scoped_run(repo, caller, run_id, Role.VIEWER)  # another project's run is a 404
    attempt = run.attempt if attempt is None else attempt
    if attempt > run.attempt:
        return validation_response([field_error(
            "attempt", ["query", "attempt"], f"run {run_id} has attempts 1..{run.attempt}", attempt)])
    live = attempt == run.attempt and not run.status.is_terminal
    job_id = run.ray_job_id if run.driven_by_sweep else attempt_job_id("run", run_id, attempt)
    data, source = _read(Attempt(run_id, attempt, job_id, run.project), live=live, jobs=jobs, store=store)
    chunk = data[after:after + limit]
    if len(chunk) == limit and b"\n" in chunk:
        chunk = chunk[:chunk.rfind(b"\n") + 1]  # whole lines: never split a UTF-8 character
    return LogsPage(run_id=run_id, attempt=attempt, attempts=run.attempt, text=chunk.decode(errors="replace"),
                    offset=after, next_offset=after + len(chunk), size=len(data), live=live, source=source)


def _read(attempt: Attempt, *, live: bool, jobs, store: LogStore) -> tuple[bytes, str]:
    """The attempt's whole log and where it came from (see the module docstring for the order)."""
    if live and attempt.job_id:
        text = _from_ray(jobs, attempt.job_id)
        if text is not None:
            return text.encode(), "ray"
    stored = store.read(attempt.run_id, attempt.attempt, project=attempt.project)
    if stored is not None:
        return stored, "storage"
    if not live and attempt.job_id:
        text = _from_ray(jobs, attempt.job_id)
        if text is not None:
            try:  # an attempt that ended while the service was down: store it now
                archive_final_log(jobs, store, attempt, text)
            except Exception as exc:  # the reader still gets the log; a later read stores it
                log.info("could not store the log of %s: %s", attempt.job_id, exc)
            return text.encode(), "ray"
    return b"", "none"


def _from_ray(jobs, job_id: str) -> str | None:
    try:
        return jobs.job_logs(job_id)
    except Exception as exc:  # Ray unreachable: the stored copy (or nothing) is the answer
        log.info("could not read Ray's log of %s: %s", job_id, exc)
        return None
