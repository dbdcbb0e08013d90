"""All reads and writes of sweeps and of the trial runs their drivers register (docs/sweeps.md).

The run half of the data-access layer is ``service.repository``; this half shares its
``Database`` and changes trial runs through ``service.run_writes``, so a trial changes status by
exactly the rules of any run. Every write is one transaction, and locks rows in one order,
sweep before runs, so two writers never wait on each other in a circle.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from api.specs import RunSpec
from api.sweeps import SweepSpec, algorithm_sets
from api.views import RunStatus, SweepStatus, SweepView
from service.attempt_store import AttemptStore, StoredKind
from service.db.models import DEFAULT_PROJECT, Run, Sweep, utcnow
from service.db.session import is_possible_id, new_id
from service.idempotency import created_once
from service.keyset import one_page
from service.repository import Repository, RunRecord
from service.run_writes import apply_run_status, insert_run
from service.state_machine import RUN_TRANSITIONS, SWEEP_TRANSITIONS
from service.sweep_listing import SweepFilter, filtered, newest_first, next_cursor
from service.sweep_view import build_sweep_view
from service.sweep_writes import TRIAL_OUTLIVED_SWEEP, apply_sweep_status
from service.tokens import hash_token

# The event of a trial attempt's start names the driver attempt it runs under: a trial's log is
# that driver attempt's job log (``service.routes.logs``).
TRIAL_STARTED = "attempt {attempt} started by the sweep's driver (attempt {driver_attempt})"
_TRIAL_STARTED = re.compile(r"attempt \d+ started by the sweep's driver \(attempt (\d+)\)")  # the same words


def trial_driver_attempt(message: str | None) -> int | None:
    """The driver attempt a trial attempt's start event (``TRIAL_STARTED``) names; None for another message."""
    match = _TRIAL_STARTED.fullmatch(message or "")
    return None if match is None else int(match.group(1))

__all__ = ["TRIAL_OUTLIVED_SWEEP", "SweepNotFound", "SweepRecord", "SweepRepository", "TrialNotFound"]



class SweepNotFound(LookupError):
    """No sweep with this id (HTTP 404)."""

    def __init__(self, sweep_id: str, detail: str | None = None):
        self.sweep_id = sweep_id
        self.detail = detail or f"sweep {sweep_id} not found"
        super().__init__(self.detail)


class TrialNotFound(SweepNotFound):
    """No trial with this id in the sweep (HTTP 404)."""

    def __init__(self, sweep_id: str, trial_id: str):
        super().__init__(sweep_id, f"trial {trial_id} of sweep {sweep_id} not found")


@dataclass(frozen=True)
class SweepRecord:
    """A sweep as the service sees it. Holds no token material."""

    id: str
    name: str
    status: SweepStatus
    attempt: int
    driver: Literal["service", "external"]
    spec: dict[str, Any]
    project: str
    ray_job_id: str | None
    error: str | None
    message: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Sweep) -> "SweepRecord":
        return cls(id=row.id, name=row.name, status=SweepStatus(row.status), attempt=row.attempt, driver=row.driver,
                   spec=row.spec, project=row.project, ray_job_id=row.ray_job_id, error=row.error, message=row.message,
                   created_at=row.created_at, updated_at=row.updated_at)


class SweepRepository(AttemptStore):
    """Sweeps and trial registration, over the ``Database`` of a run ``Repository``;
    ``transition``, ``begin_attempt`` and ``check_token`` come from ``AttemptStore``."""

    stored = StoredKind(model=Sweep, status=SweepStatus, not_found=SweepNotFound, transitions=SWEEP_TRANSITIONS,
                        job_prefix="sweep", record=SweepRecord,
                        snapshot=SweepRecord, apply_status=apply_sweep_status)

    def __init__(self, runs: Repository):
        self.db = runs.db

    @staticmethod
    def _trials(session: Session, sweep_ids: list[str]) -> dict[str, list[Run]]:
        found: dict[str, list[Run]] = {sweep_id: [] for sweep_id in sweep_ids}
        if sweep_ids:
            query = select(Run).where(Run.sweep_id.in_(sweep_ids)).order_by(Run.created_at, Run.id)
            for run in session.execute(query).scalars():
                found[run.sweep_id].append(run)
        return found

    # --- sweeps --------------------------------------------------------------------------
    def create_sweep(self, spec: SweepSpec, *, driver: Literal["service", "external"] = "service",
                     token: str | None = None, project: str = DEFAULT_PROJECT,
                     idempotency_key: str | None = None) -> SweepRecord:
        """Store a validated sweep with its skipped algorithm sets: QUEUED for the dispatcher, or
        RUNNING at once for an ``external`` driver, which reports with ``token`` (hash kept)."""
        external = driver == "external"
        if external != (token is not None):
            raise ValueError("an external sweep needs a driver token, a service one none")
        _, skipped = algorithm_sets(spec)
        now = utcnow()
        with self.db.write() as session:
            status = SweepStatus.RUNNING if external else SweepStatus.QUEUED
            sweep = Sweep(id=new_id(), name=spec.name, project=project, status=status.value, attempt=1, driver=driver,
                          spec=spec.model_dump(mode="json"),
                          skipped=[{"algorithms": list(s), "reason": why} for s, why in skipped],
                          token_hash=hash_token(token) if token else None,
                          message="driven outside the service" if external else "queued",
                          created_at=now, started_at=now if external else None, updated_at=now,
                          idempotency_key=idempotency_key)
            session.add(sweep)
            session.flush()
            return SweepRecord.from_row(sweep)

    def create_sweep_once(self, spec: SweepSpec, *, driver: Literal["service", "external"], token: str | None,
                          project: str, idempotency_key: str) -> tuple[SweepRecord, bool]:
        """``create_sweep`` once per ``(project, idempotency_key)``: the sweep and True when this
        call made it; the sweep an earlier call with the key made and False otherwise."""
        return created_once(lambda: self.sweep_by_idempotency_key(project, idempotency_key),
                            lambda: self.create_sweep(spec, driver=driver, token=token, project=project,
                                                      idempotency_key=idempotency_key))

    def sweep_by_idempotency_key(self, project: str, idempotency_key: str) -> SweepRecord | None:
        query = select(Sweep).where(Sweep.project == project, Sweep.idempotency_key == idempotency_key)
        with self.db.read() as session:
            row = session.execute(query).scalars().first()
            return SweepRecord.from_row(row) if row is not None else None

    def replace_driver_token(self, sweep: SweepRecord, token: str) -> Literal["replaced", "ended", "driven"]:
        """Make ``token`` the driver token of the external ``sweep`` (the earlier one stops
        working), only while nobody drives it yet: it runs, has no trial, no driver has reported
        since its token was issued (a report moves ``updated_at`` past ``started_at``, which
        issuing a token sets to the same time), and it has not changed since ``sweep`` was read
        (a concurrent replay). ``ended``: it no longer runs; ``driven``: it is driven or changed;
        either way nothing changed."""
        with self.db.write() as session:
            row = session.get(Sweep, sweep.id, with_for_update=True)
            if row is None or row.driver != "external" or row.status != SweepStatus.RUNNING.value:
                return "ended"
            has_trials = session.execute(select(Run.id).where(Run.sweep_id == sweep.id).limit(1)).first()
            if has_trials is not None or row.updated_at != sweep.updated_at or row.updated_at != row.started_at:
                return "driven"
            now = utcnow()
            row.token_hash, row.started_at, row.updated_at = hash_token(token), now, now
            return "replaced"

    def get_sweep(self, sweep_id: str) -> SweepRecord:
        return self.get(sweep_id)

    def sweeps_with_status(self, statuses: Iterable[SweepStatus]) -> list[SweepRecord]:
        return self.with_status(statuses)

    def sweep_view(self, sweep_id: str) -> SweepView:
        with self.db.read() as session:
            sweep = session.get(Sweep, sweep_id) if is_possible_id(sweep_id) else None
            if sweep is None:
                raise SweepNotFound(sweep_id)
            return build_sweep_view(sweep, self._trials(session, [sweep_id])[sweep_id], utcnow())

    def list_sweep_views(self, where: SweepFilter | None = None, *, limit: int = 50,
                         cursor: str | None = None) -> tuple[list[SweepView], str | None]:
        """Sweeps kept by ``where`` (default: every project's unarchived sweeps), newest first,
        with their trials: one page of ``limit`` after ``cursor``, and the cursor of the next
        page (None on the last). ``InvalidCursor`` for a cursor this list did not hand out."""
        query = newest_first(filtered(select(Sweep), where or SweepFilter()), cursor)
        with self.db.read() as session:
            sweeps, following = one_page(session, query, limit, next_cursor)
            trials = self._trials(session, [s.id for s in sweeps])
            now = utcnow()
            return [build_sweep_view(s, trials[s.id], now) for s in sweeps], following

    def set_archived(self, sweep_id: str, archived: bool) -> None:
        """Hide the sweep and its trials from default lists (``archived``), or show them again.

        The trials go with it (a sweep archived out of sight left its 16 trials in ``tessera
        runs``), marked with the sweep's own time, so that unarchiving brings back only those:
        a trial archived on its own before stays archived."""
        with self.db.locked_write(Sweep, sweep_id, SweepNotFound) as (session, sweep):
            if not archived:
                if sweep.archived_at is not None:
                    session.execute(update(Run).where(Run.sweep_id == sweep_id, Run.archived_at == sweep.archived_at)
                                    .values(archived_at=None))
                sweep.archived_at = None
            elif sweep.archived_at is None:
                sweep.archived_at = utcnow()
                session.execute(update(Run).where(Run.sweep_id == sweep_id, Run.archived_at.is_(None))
                                .values(archived_at=sweep.archived_at))

    # --- status --------------------------------------------------------------------------
    def apply_driver_report(self, sweep_id: str, status: SweepStatus, *, message: str | None = None,
                            error: str | None = None) -> SweepRecord:
        """The driver's word (RUNNING, COMPLETED or FAILED). A cancel wins: while the sweep is
        CANCELING or CANCELED the report changes nothing; so does repeating the final status."""
        with self.db.locked_write(Sweep, sweep_id, SweepNotFound) as (session, sweep):
            current = SweepStatus(sweep.status)
            canceled = current in (SweepStatus.CANCELING, SweepStatus.CANCELED)
            if not canceled and not (current.is_terminal and current is status):
                apply_sweep_status(session, sweep, status, message=message, error=error)
                # Even a repeated RUNNING says a driver holds the token: a replay of the sweep's
                # Idempotency-Key must then keep it (``replace_driver_token`` sees the change).
                sweep.updated_at = utcnow()
                session.flush()
            return SweepRecord.from_row(sweep)

    def cancel(self, sweep_id: str, *, by: str = "user") -> SweepRecord:
        """A user's cancel (``by``: who, named in the event): service-driven → CANCELING (the
        dispatcher stops the driver job); external → CANCELED at once (its driver sees that and
        stops Tune). 409 once ended."""
        with self.db.locked_write(Sweep, sweep_id, SweepNotFound) as (session, sweep):
            current = SweepStatus(sweep.status)
            if current.is_terminal:
                raise _illegal(sweep, SweepStatus.CANCELING,
                               f"sweep {sweep_id} is {current.value}; it has already ended")
            target = SweepStatus.CANCELED if sweep.driver == "external" else SweepStatus.CANCELING
            apply_sweep_status(session, sweep, target, message=f"canceled by {by}", error=None)
            session.flush()
            return SweepRecord.from_row(sweep)

    # --- trials --------------------------------------------------------------------------
    def register_trial(self, sweep_id: str, *, trial_id: str, spec: RunSpec, params: dict[str, Any],
                       token: str) -> RunRecord:
        """Start a trial as ``token``'s attempt: the first time, create its run (QUEUED then
        STARTING in this one transaction, so the run dispatcher never sees it queued); again, a
        new attempt of the same run. 409 for a COMPLETED trial or a sweep that takes no trials."""
        with self.db.locked_write(Sweep, sweep_id, SweepNotFound) as (session, sweep):
            sweep_status = SweepStatus(sweep.status)
            if sweep_status not in (SweepStatus.STARTING, SweepStatus.RUNNING):
                raise _illegal(sweep, sweep_status,
                               f"sweep {sweep_id} is {sweep_status.value}; it takes no new trials")
            run = _locked_trial(session, sweep_id, trial_id)
            if run is None:
                # A sweep archived while it runs hides the trials it registers after, too (set_archived).
                inserted = insert_run(session, spec, message=f"trial {trial_id} of sweep {sweep_id}",
                                      sweep_id=sweep_id, trial_id=trial_id, trial_params=params, project=sweep.project,
                                      archived_at=sweep.archived_at)
                run = session.get(Run, inserted.id)  # the new row as an object, to move it to STARTING
            else:
                _check_can_restart(RunRecord.from_row(run), sweep_id, trial_id)
                apply_run_status(session, run, RunStatus.QUEUED,
                                 message=f"trial {trial_id} restarted by the sweep's driver", error=None)
            apply_run_status(session, run, RunStatus.STARTING, error=None,
                             message=TRIAL_STARTED.format(attempt=run.attempt, driver_attempt=sweep.attempt))
            run.token_hash = hash_token(token)
            run.ray_job_id = sweep.ray_job_id  # None for an external driver
            session.flush()
            return RunRecord.from_row(run)

    def end_trial(self, sweep_id: str, trial_id: str, *, outcome: Literal["stopped", "failed"],
                  message: str | None = None, error: str | None = None) -> RunRecord:
        """Tune is done with a trial: ``stopped`` → STOPPED, ``failed`` → FAILED. Nothing changes
        if the run already ended (it completed normally) or no longer belongs to the driver."""
        with self.db.locked_write(Sweep, sweep_id, SweepNotFound) as (session, _sweep):
            run = _locked_trial(session, sweep_id, trial_id)
            if run is None:
                raise TrialNotFound(sweep_id, trial_id)
            record = RunRecord.from_row(run)
            if record.status.is_terminal or record.status is RunStatus.CANCELING or not record.driven_by_sweep:
                return record
            if outcome == "stopped":
                apply_run_status(session, run, RunStatus.STOPPED,
                                 message=message or "stopped early by the sweep's scheduler", error=None)
            else:
                apply_run_status(session, run, RunStatus.FAILED, message=message,
                                 error=error or message or "Ray Tune reported the trial as failed")
            session.flush()
            return RunRecord.from_row(run)


def _locked_trial(session: Session, sweep_id: str, trial_id: str) -> Run | None:
    query = select(Run).where(Run.sweep_id == sweep_id, Run.trial_id == trial_id).with_for_update()
    return session.execute(query).scalar_one_or_none()


def _illegal(sweep: Sweep, target: SweepStatus, reason: str):
    return SWEEP_TRANSITIONS.refusal(sweep.id, SweepStatus(sweep.status), target, reason)


def _check_can_restart(run: RunRecord, sweep_id: str, trial_id: str) -> None:
    if run.status is RunStatus.COMPLETED:
        raise RUN_TRANSITIONS.refusal(run.id, run.status, RunStatus.QUEUED,
                                      f"trial {trial_id} of sweep {sweep_id} (run {run.id}) is COMPLETED; "
                                      f"it cannot be registered again")
    if not run.status.is_terminal and not run.driven_by_sweep:
        raise RUN_TRANSITIONS.refusal(run.id, run.status, RunStatus.QUEUED,
                                      f"trial {trial_id} of sweep {sweep_id} (run {run.id}) was resumed by hand "
                                      f"and is {run.status.value} on its own")
