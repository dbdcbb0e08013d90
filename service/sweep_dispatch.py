"""Submitting and following sweep driver jobs; ``Dispatcher.tick`` calls ``tick_sweeps``.

A service-driven sweep runs its Ray Tune driver (``python -m workers.tune --sweep-id ID``) as
the Ray job ``sweep-{id}-attempt-{n}``. A driver that dies without reporting an end is
re-queued as the next attempt, which restores the Tune experiment, up to
``settings.sweep_driver_restarts`` times; then the sweep fails with the job's log tail.
Trials are runs, but their jobs are the driver's: the run dispatcher leaves them alone.
"""

from __future__ import annotations

import logging
import secrets
import shlex

from api.views import SweepStatus
from service.ray_jobs import LIVE_JOB_STATES, JobsClient, failure_from_logs, forwarded_env, stop_and_check
from service.settings import Settings
from service.state_machine import IllegalTransition
from service.sweep_repository import SweepRecord, SweepRepository

log = logging.getLogger(__name__)

SS = SweepStatus
# A trainer that cannot get its workers must fail fast so Tune retries it, not wait forever.
DEFAULT_WORKER_GROUP_START_TIMEOUT_S = "30"
DRIVER_ENDED_WITHOUT_RESULT = "the sweep driver's Ray job ended without reporting a result"


def sweep_entrypoint(settings: Settings, sweep_id: str) -> str:
    return f"{shlex.quote(settings.worker_python)} -m workers.tune --sweep-id {shlex.quote(sweep_id)}"


def sweep_job_env(settings: Settings, sweep: SweepRecord, token: str) -> dict[str, str]:
    """Environment of one driver attempt: where to report, with which token, where to store."""
    env = forwarded_env()
    env.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", DEFAULT_WORKER_GROUP_START_TIMEOUT_S)
    env.update({
        "TESSERA_SERVICE_URL": settings.public_url,
        "TESSERA_SWEEP_TOKEN": token,
        "TESSERA_SWEEP_ID": sweep.id,
        "TESSERA_ATTEMPT": str(sweep.attempt),
        "TESSERA_STORAGE_URL": settings.storage_url,
    })
    return env


def tick_sweeps(sweeps: SweepRepository, jobs: JobsClient, settings: Settings) -> None:
    """One pass: submit every QUEUED service-driven sweep, then sync the others with Ray."""
    queued = [s for s in sweeps.sweeps_with_status([SS.QUEUED]) if s.driver == "service"]
    for sweep in queued:
        _guarded(submit_sweep, sweeps, jobs, settings, sweep)
    # As for runs: a job submitted a moment ago may not be visible in Ray yet.
    just_submitted = {s.id for s in queued}
    for sweep in sweeps.sweeps_with_status([SS.STARTING, SS.RUNNING, SS.CANCELING]):
        if sweep.driver == "service" and sweep.id not in just_submitted:
            _guarded(sync_sweep, sweeps, jobs, settings, sweep)


def reconcile_sweeps(sweeps: SweepRepository, jobs: JobsClient, settings: Settings) -> list[str]:
    """Compare every active service-driven sweep with Ray once (at startup); return the fixes."""
    fixes = []
    for sweep in sweeps.sweeps_with_status([SS.STARTING, SS.RUNNING, SS.CANCELING]):
        if sweep.driver == "service":
            fix = _guarded(sync_sweep, sweeps, jobs, settings, sweep, context="reconciler")
            if fix is not None:
                fixes.append(f"sweep {sweep.id}: {fix}")
    return fixes


def _guarded(action, *args, **kwargs) -> str | None:
    sweep = args[-1]
    try:
        return action(*args, **kwargs)
    except IllegalTransition as exc:  # the driver or a user changed the sweep first; theirs stands
        log.debug("sweep %s: %s", sweep.id, exc.detail)
    except Exception:
        log.exception("sweep dispatch: sweep %s (%s) could not be handled; will retry", sweep.id, sweep.status.value)
    return None


def submit_sweep(sweeps: SweepRepository, jobs: JobsClient, settings: Settings, sweep: SweepRecord) -> None:
    """QUEUED → STARTING with a fresh token, and submit the driver job of this attempt."""
    token = secrets.token_urlsafe(32)
    started = sweeps.begin_attempt(sweep.id, token=token, message=f"submitting driver attempt {sweep.attempt} to Ray")
    try:
        jobs.submit(started.ray_job_id, sweep_entrypoint(settings, sweep.id), sweep_job_env(settings, started, token))
    except OSError:
        # Ray unreachable: the attempt stays STARTING; once Ray answers "no such job", the sync
        # re-queues it, so no attempt runs twice.
        log.warning("sweep dispatch: Ray unreachable while submitting %s; will retry", started.ray_job_id)
        return
    except Exception as exc:
        sweeps.transition(sweep.id, SS.FAILED, error=f"Ray refused job {started.ray_job_id}: {exc}",
                          only_from=[SS.STARTING], attempt=started.attempt)
        log.warning("sweep dispatch: Ray refused %s: %s", started.ray_job_id, exc)
        return
    log.info("sweep %s: submitted driver job %s", sweep.id, started.ray_job_id)


def sync_sweep(sweeps: SweepRepository, jobs: JobsClient, settings: Settings, sweep: SweepRecord, *,
               context: str = "dispatcher") -> str | None:
    """Apply the fix that Ray's view of the sweep's driver job calls for; return its message."""
    job_id = sweep.ray_job_id
    if sweep.status is SS.CANCELING:
        live, state = stop_and_check(jobs, job_id)
        if live:
            return None
        message = f"{context}: driver job {job_id} is {state or 'gone'}; cancel complete"
        _change(sweeps, sweep, SS.CANCELED, message=message)
        return message

    state = jobs.status(job_id) if job_id else None
    if state in LIVE_JOB_STATES:
        return None
    if state == "SUCCEEDED":
        _change(sweeps, sweep, SS.FAILED, message=f"{context}: driver job {job_id} succeeded without a result",
                error=DRIVER_ENDED_WITHOUT_RESULT)
        return DRIVER_ENDED_WITHOUT_RESULT
    what = {None: "not found", "FAILED": "failed", "STOPPED": "was stopped"}.get(state, state)
    if sweep.attempt <= settings.sweep_driver_restarts:
        message = f"{context}: driver job {job_id} {what}; re-queued as attempt {sweep.attempt + 1}"
        _change(sweeps, sweep, SS.QUEUED, message=message)
        return message
    tail = failure_from_logs(jobs, job_id) if state is not None else f"driver job {job_id} {what}"
    error = (f"the sweep driver died {sweep.attempt} time(s), more than sweep_driver_restarts="
             f"{settings.sweep_driver_restarts} allows; last: {tail}")
    _change(sweeps, sweep, SS.FAILED, message=f"{context}: driver job {job_id} {what}; giving up", error=error)
    return error


def _change(sweeps: SweepRepository, sweep: SweepRecord, target: SweepStatus, *, message: str,
            error: str | None = None) -> None:
    # Compare-and-set on the snapshot we decided from: the driver's report may have landed since.
    sweeps.transition(sweep.id, target, message=message, error=error, only_from=[sweep.status],
                      attempt=sweep.attempt)
    log.info("sweep %s: %s", sweep.id, message)
