"""Make the database agree with Ray: nothing stays RUNNING that is not running, nothing runs twice.

``sync_run`` compares one active run with its Ray job and applies the one fix that follows;
the dispatcher calls it on every tick and ``reconcile`` calls it for every active run once at
startup, before the dispatcher submits anything. Each fix is a state-machine transition whose
event message says why. Only an answer from Ray leads to a fix: when Ray cannot be asked, the
run is left as it is and looked at again later.
"""

from __future__ import annotations

import logging

from api.views import RunStatus
from service.ray_jobs import FINISHED_JOB_STATES, LIVE_JOB_STATES, JobsClient, failure_from_logs, stop_and_check
from service.repository import Repository, RunRecord
from service.state_machine import IllegalTransition

log = logging.getLogger(__name__)

S = RunStatus
RUNNING_STATUSES = (S.STARTING, S.RUNNING, S.RESTARTING)
SYNCED_STATUSES = (*RUNNING_STATUSES, S.CANCELING)

STOPPED_OUTSIDE = "Ray job was stopped outside Tessera"
ENDED_WITHOUT_RESULT = "Ray job ended without reporting a result"


def sync_run(repo: Repository, jobs: JobsClient, run: RunRecord, *, context: str = "dispatcher") -> str | None:
    """Apply the fix that Ray's view of ``run``'s job calls for; return its message, or None.

    Raises what the Jobs client raises when Ray cannot be asked (the run stays as it is), and
    ``IllegalTransition`` when the run changed since ``run`` was read (nothing is written).
    """
    job_id = run.ray_job_id
    if run.status is S.CANCELING:
        live, state = stop_and_check(jobs, job_id)
        if live:
            return None
        message = f"{context}: Ray job {job_id} is {state or 'gone'}; cancel complete"
        _change(repo, run, S.CANCELED, message=message)
        return message

    if run.status not in RUNNING_STATUSES:
        return None
    state = jobs.status(job_id) if job_id else None
    if state in LIVE_JOB_STATES:
        return None
    if state is None:
        why = "not found after a service restart" if context == "reconciler" else "not found"
        message = f"{context}: Ray job {job_id} {why}; re-queued as attempt {run.attempt + 1}"
        _change(repo, run, S.QUEUED, message=message)
        return message
    if state == "FAILED":
        error = run.error or failure_from_logs(jobs, job_id)
        _change(repo, run, S.FAILED, message=f"{context}: Ray job {job_id} failed", error=error)
        return error
    if state == "STOPPED":
        _change(repo, run, S.FAILED, message=f"{context}: Ray job {job_id} was stopped", error=STOPPED_OUTSIDE)
        return STOPPED_OUTSIDE
    assert state in FINISHED_JOB_STATES, state  # SUCCEEDED, but the worker never said how it ended
    _change(repo, run, S.FAILED, message=f"{context}: Ray job {job_id} succeeded without a result",
            error=ENDED_WITHOUT_RESULT)
    return ENDED_WITHOUT_RESULT


def _change(repo: Repository, run: RunRecord, target: RunStatus, *, message: str, error: str | None = None) -> None:
    # Compare-and-set on the snapshot we decided from: a worker's report may have landed since.
    repo.transition(run.id, target, message=message, error=error, only_from=[run.status], attempt=run.attempt)
    log.info("run %s: %s", run.id, message)


def reconcile(repo: Repository, jobs: JobsClient) -> list[str]:
    """Compare every active run with Ray once (at startup); return the fixes made.

    A run whose job is PENDING or RUNNING is left alone: its worker still holds the token
    stored in the database and keeps reporting.
    """
    fixes: list[str] = []
    for run in repo.runs_with_status(SYNCED_STATUSES):
        if run.driven_by_sweep:
            continue  # its job is the sweep driver's; see service.sweep_dispatch
        try:
            fix = sync_run(repo, jobs, run, context="reconciler")
        except IllegalTransition as exc:
            log.info("run %s changed while reconciling: %s", run.id, exc.detail)
            continue
        except Exception:
            log.exception("could not reconcile run %s with Ray; leaving it %s", run.id, run.status.value)
            continue
        if fix is not None:
            fixes.append(f"{run.id}: {fix}")
    return fixes
