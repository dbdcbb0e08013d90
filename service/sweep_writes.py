"""How a sweep's row changes status; callers hold the sweep's row lock (``Database.locked_write``).

A sweep that ends ends its driver's unfinished trials in the same transaction (their rows are
locked after the sweep's, the order every sweep write keeps). A sweep being canceled takes them
to CANCELING at once: stopping the driver kills their workers, whose FAILED reports would
otherwise land before the sweep is CANCELED; a CANCELING run acknowledges them and the cancel wins.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.views import TERMINAL_STATUSES, RunStatus, SweepStatus
from service.db.models import Run, Sweep, utcnow
from service.db.session import clean_text
from service.repository import RunRecord
from service.run_writes import apply_run_status, first_line, worker_time
from service.state_machine import SWEEP_TRANSITIONS

TRIAL_OUTLIVED_SWEEP = "the sweep ended before the trial reported"


def apply_sweep_status(session: Session, sweep: Sweep, target: SweepStatus, *, message: str | None,
                       error: str | None, failure: str | None = None, job_lost: bool = False,
                       ended_at: datetime | None = None) -> None:
    """Move the locked ``sweep`` to ``target`` through the state machine; a sweep that ends takes
    its driver's unfinished trials with it. An idempotent repeat changes nothing. ``failure`` and
    ``job_lost`` (``apply_run_status``'s, which the dispatcher passes for either kind) are not
    kept: a sweep's trials are runs, each with its own, and its duration is its span.
    ``ended_at``: with an end, when Ray saw the driver's job end, if earlier than now; the trials
    it ran ended then too."""
    if not SWEEP_TRANSITIONS.check(sweep.id, SweepStatus(sweep.status), target):
        return
    now = utcnow()
    message, error = clean_text(message), clean_text(error)
    if target is SweepStatus.QUEUED:  # a new driver attempt, with a new job and token
        sweep.attempt += 1
        sweep.token_hash = None
        sweep.ray_job_id = None
    if target is SweepStatus.RUNNING and sweep.started_at is None:
        sweep.started_at = now
    if target.is_terminal:
        sweep.finished_at = worker_time(ended_at, sweep.started_at or sweep.created_at, now)
    if error is not None:
        sweep.error = error
    if message is None:
        message = first_line(error)
    if message is not None:
        sweep.message = message
    sweep.status = target.value
    sweep.updated_at = now
    if target.is_terminal:
        _end_active_trials(session, sweep, canceled=target is SweepStatus.CANCELED)
    elif target is SweepStatus.CANCELING:
        for run in _active_trials(session, sweep):
            apply_run_status(session, run, RunStatus.CANCELING, message="its sweep is being canceled", error=None)


def _active_trials(session: Session, sweep: Sweep) -> list[Run]:
    """The locked rows of the driver's unfinished trials (not those resumed by hand: ordinary runs now)."""
    query = (select(Run).where(Run.sweep_id == sweep.id, Run.status.not_in([s.value for s in TERMINAL_STATUSES]))
             .order_by(Run.created_at, Run.id).with_for_update())
    return [run for run in session.execute(query).scalars() if RunRecord.from_row(run).driven_by_sweep]


def _end_active_trials(session: Session, sweep: Sweep, *, canceled: bool) -> None:
    """A sweep that ended takes its driver's unfinished trials with it."""
    for run in _active_trials(session, sweep):
        if canceled:
            apply_run_status(session, run, RunStatus.CANCELING, message="its sweep was canceled", error=None)
            apply_run_status(session, run, RunStatus.CANCELED, message="its sweep was canceled", error=None,
                             ended_at=sweep.finished_at)
        else:
            apply_run_status(session, run, RunStatus.FAILED, message=f"sweep {sweep.status.lower()}",
                             error=TRIAL_OUTLIVED_SWEEP, ended_at=sweep.finished_at)
