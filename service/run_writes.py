"""How a run's row is created and changes status, for both repositories (a trial is a run like
any other).

``apply_run_status`` is the one place that asks the run transition table, counts attempts,
revokes tokens, adds up how long the run trained and writes the run event; callers hold the
run's row lock (``lock_row``).

How long a run trained (``runs.trained_seconds``, ``runs.training_since``; ``RunView``'s fields of
those names) leaves out the time it spent queued or starting between attempts, which its first
start to its last end counts. An attempt trains from its RUNNING (``attempt_started_at``) to:

- its end, as the run's ``finished_at`` says: the worker's word, else when Ray saw its job end
  (a job that crashed or was stopped, also while the service was down; a canceled run's job
  stops, and its workers train, after the cancel was asked for), else when the service learned of it;
- a re-queue (its job lost, or a trial restarted by its sweep's driver): when the service last
  heard of the run (``last_heard``), not when the loss was noticed, which after a service restart
  may be hours later;
- the RUNNING of a worker group Ray Train restarted in the same job: the service does not learn
  when the old group stopped, so the restart's own delay counts as training.

An attempt that ends before its RUNNING (it failed, was re-queued or canceled while starting)
trained for no time. ``training_since`` is set only between an attempt's RUNNING and its end, so
a client adds now - ``training_since`` to ``trained_seconds`` for the time up to now.
"""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from api.specs import RunSpec
from api.views import RunStatus
from service.db.models import DEFAULT_PROJECT, Run, RunEvent, aware, utcnow
from service.db.session import clean_text, new_id
from service.state_machine import RUN_TRANSITIONS, is_terminal, starts_new_attempt, starts_new_job


def insert_run(session: Session, spec: RunSpec, *, message: str, **columns: Any) -> SimpleNamespace:
    """A new QUEUED run of ``spec`` on attempt 1, with its first event saying ``message``;
    ``columns`` set others (a trial's ``sweep_id``, ``trial_id``, ``trial_params``; ``project``).
    Returns every column of the new row (``RunRecord.from_row`` reads it); the session does not
    hold it as an object (``session.get(Run, id)`` does).

    Two Core INSERTs, not ``session.add`` and a flush: the ORM's unit of work for these two rows
    was half of a submit's CPU time in its endpoint (py-spy, ``bench/service_ab.py``)."""
    now = utcnow()
    # Only the columns given: one left out gets its default, or SQL NULL (an explicit None in a
    # JSON column would be stored as JSON 'null', which raw SQL tells apart from NULL).
    values = {"id": new_id(), "project": DEFAULT_PROJECT, "name": spec.name, "status": RunStatus.QUEUED.value,
              "attempt": 1, "spec": spec.model_dump(mode="json"), "summary": {}, "extrema": {},
              "tags": list(spec.tags), "metric_points": 0, "trained_seconds": 0.0, "created_at": now, "updated_at": now,
              **columns}
    session.execute(insert(Run.__table__), values)
    session.execute(insert(RunEvent.__table__), {"run_id": values["id"], "from_status": None,
                                                 "to_status": RunStatus.QUEUED.value, "attempt": 1, "time": now,
                                                 "message": message})
    return SimpleNamespace(**{**{column.name: None for column in Run.__table__.columns}, **values})


def add_run_event(session: Session, run: Run, from_status: RunStatus | None, to_status: RunStatus,
                  message: str | None, now: datetime) -> None:
    """Record one status change (or, with equal statuses, a note) of ``run``'s current attempt."""
    session.add(RunEvent(run_id=run.id, from_status=from_status.value if from_status else None,
                         to_status=to_status.value, attempt=run.attempt, time=now, message=message))


def first_line(error: str | None, limit: int = 500) -> str | None:
    """The first line of ``error``, cut to ``limit`` characters: an event message that says why."""
    return error.strip().splitlines()[0][:limit] if error is not None and error.strip() else None


def worker_time(reported: datetime | None, earliest: datetime, now: datetime) -> datetime:
    """When something a worker reports happened (its attempt began training, or ended): ``reported``
    (the worker's word, which may come late: a report retried through an outage arrives after it),
    kept within ``[earliest, now]`` since a worker's clock may be off; ``now`` without it (a worker
    that does not say)."""
    if reported is None:
        return now
    # In UTC, as stored times read back: the report's answer shows what a later GET will.
    return max(min(aware(reported), now), aware(earliest)).astimezone(timezone.utc)


def attempt_began(run: Run) -> datetime:
    """The earliest the current attempt may have begun training or ended: its start
    (``attempt_started_at``: its RUNNING report's time, until then its submission), else the run's
    first start or its creation (a row whose attempt began before migration 0012, or was
    submitted by a service older than it)."""
    return run.attempt_started_at or run.started_at or run.created_at


def last_heard(run: Run, now: datetime) -> datetime:
    """The last time the service heard of ``run`` before ``now``: its last status change, or its
    job's last metric batch, checkpoint or note (``updated_at``; a user's edit of its tags or notes
    does not move it). A lost job's attempt ended by then, as far as anyone knows."""
    return min(aware(run.updated_at), now)


def end_training(run: Run, end: datetime) -> None:
    """The attempt that trains stops training at ``end``: its time goes into ``run``'s
    ``trained_seconds`` (no time if ``end`` reads before it began, whatever a worker's clock said);
    nothing if none trains."""
    if run.training_since is None:
        return
    run.trained_seconds += max(0.0, (aware(end) - aware(run.training_since)).total_seconds())
    run.training_since = None


def apply_run_status(session: Session, run: Run, target: RunStatus, *, message: str | None,
                     error: str | None, started_at: datetime | None = None, ended_at: datetime | None = None,
                     failure: str | None = None, job_lost: bool = False) -> None:
    """Move the locked ``run`` to ``target`` through the state machine and record the event.
    ``started_at``: with RUNNING, when the attempt began training if earlier than now;
    ``ended_at``: with a terminal ``target``, when the run ended if earlier than now. Both are a
    worker's word (an end may be Ray's, when its job ended without the worker's report), kept no
    earlier than the attempt's start (``worker_time``, ``attempt_began``);
    the event is still stamped now, when the service learned of it.
    ``failure``: with FAILED, why (``RunView.failure``: ``machine`` or ``code``; None: not known).
    ``job_lost``: Ray has no such job any more (lost with its node, or with the service's embedded
    head), so nobody saw the attempt end: it ended, as far as anyone knows, when the service last
    heard of the run (``last_heard``), not when the loss was found, which after a service restart
    may be hours later. A re-queue always counts so.

    An idempotent repeat changes nothing; an illegal change raises ``IllegalTransition``.
    """
    current = RunStatus(run.status)
    if not RUN_TRANSITIONS.check(run.id, current, target):
        return
    now = utcnow()
    message, error = clean_text(message), clean_text(error)
    # The one place attempts are counted: a re-queue, a resume, or a worker-group restart.
    if starts_new_attempt(current, target):
        run.attempt += 1
    if starts_new_job(current, target):
        end_training(run, last_heard(run, now))  # its job lost (a resumed or continued run trains no more)
        run.token_hash = None  # the old job's worker may no longer report
        run.finished_at = None
        run.error = None
        run.failure = None
        run.attempt_started_at = None
    # The attempt's start: its submission, until its RUNNING says when training began (a RESTARTING
    # keeps the previous attempt's, the earliest the restarted group's can be).
    if target is RunStatus.STARTING:
        run.attempt_started_at = now  # written, not read: begin_attempts loads TRANSITION_COLUMNS alone
    if target is RunStatus.RUNNING:
        run.attempt_started_at = worker_time(started_at, attempt_began(run), now)
        if run.started_at is None:
            run.started_at = run.attempt_started_at
        end_training(run, run.attempt_started_at)  # a restarted worker group's: the old group's ends here
        run.training_since = run.attempt_started_at
    if is_terminal(target):
        if ended_at is None and job_lost:
            ended_at = last_heard(run, now)
        run.finished_at = worker_time(ended_at, attempt_began(run), now)
        end_training(run, run.finished_at)
    if error is not None:
        run.error = error
    if target is RunStatus.FAILED:
        run.failure = failure
    run.status = target.value
    run.updated_at = now
    if message is None:
        message = first_line(error)
    add_run_event(session, run, current, target, message, now)
