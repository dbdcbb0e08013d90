"""All reads and writes of runs, run events and metrics. Routes and loops never touch sessions.

Every write is one ``Database.write`` transaction that first locks the run's row
(``service.db.session``), so two writers of the same run (a worker's report, a user's cancel,
the dispatcher) are serialized and the state machine always decides on the stored status.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, and_, func, or_, select, text
from sqlalchemy.orm import Session

from api.specs import RunSpec
from api.views import (ACTIVE_STATUSES, CheckpointReport, CheckpointView, MetricPoint, ReportedMetric, RunEventView,
                       RunStatus, RunView, metric_mode)
from service.attempt_store import AttemptStore, StoredKind
from service.db.models import DEFAULT_PROJECT, Checkpoint, Metric, Run, RunEvent, utcnow
from service.run_bests import upsert_bests
from service.keyset import InvalidCursor, one_page
from service.run_listing import CREATED, RunFilter, best_first, filtered, newest_first, next_cursor
from service.db.session import Database, clean_text, is_possible_id
from service.idempotency import created_once
from service.metric_limits import MetricLimits, non_finite_note
from service.metric_writes import insert_points, is_replayed_batch, remember_batch
from service.run_writes import add_run_event, apply_run_status, first_line, insert_run
from service.state_machine import RUN_TRANSITIONS
from service.tokens import hash_token
from service.worker_reports import apply_report


class RunNotFound(LookupError):
    """No run with this id (HTTP 404)."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.detail = f"run {run_id} not found"
        super().__init__(self.detail)


@dataclass(frozen=True)
class RunRecord:
    """A run as the service sees it. Holds no token material."""

    id: str
    name: str
    status: RunStatus
    attempt: int
    spec: dict[str, Any]
    project: str
    summary: dict[str, float]
    error: str | None
    tags: list[str]
    ray_job_id: str | None
    sweep_id: str | None
    trial_id: str | None
    trial_params: dict[str, Any] | None
    extrema: dict[str, list[float]]
    final_checkpoint: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    attempt_started_at: datetime | None = None  # the current attempt's start (RunView.attempt_started_at)
    notes: str | None = None
    archived_at: datetime | None = None
    parent_id: str | None = None  # lineage (service.lineage): the run this one was forked from
    fork: dict[str, Any] | None = None
    failure: str | None = None  # once FAILED: "machine" | "code" | None (RunView.failure)
    trained_seconds: float = 0.0  # its ended attempts' training (RunView.trained_seconds)
    training_since: datetime | None = None  # while an attempt trains, when it began (RunView.training_since)

    @classmethod
    def from_row(cls, row: Run) -> "RunRecord":
        return cls(id=row.id, name=row.name, status=RunStatus(row.status), attempt=row.attempt,
                   spec=row.spec, project=row.project, summary=dict(row.summary or {}), error=row.error, tags=list(row.tags or []),
                   ray_job_id=row.ray_job_id, sweep_id=row.sweep_id, trial_id=row.trial_id,
                   trial_params=row.trial_params, extrema=dict(row.extrema or {}),
                   final_checkpoint=row.final_checkpoint, created_at=row.created_at,
                   started_at=row.started_at, finished_at=row.finished_at, updated_at=row.updated_at,
                   attempt_started_at=row.attempt_started_at, notes=row.notes, archived_at=row.archived_at,
                   parent_id=row.parent_id, fork=row.fork, failure=row.failure, trained_seconds=row.trained_seconds,
                   training_since=row.training_since)

    @property
    def driven_by_sweep(self) -> bool:
        return driven_by_sweep(self)

    def to_view(self) -> RunView:
        return RunView(id=self.id, name=self.name, status=self.status, attempt=self.attempt, spec=self.spec,
                       created_at=self.created_at, started_at=self.started_at,
                       attempt_started_at=self.attempt_started_at, finished_at=self.finished_at,
                       trained_seconds=self.trained_seconds,
                       # Only while it may train: a run ended by a service older than 0013 (a replica still
                       # serving through the upgrade, or a rollback) never cleared it, and would count forever.
                       training_since=self.training_since if self.status in ACTIVE_STATUSES else None,
                       summary=self.summary, best=best_values(self.extrema), error=self.error, tags=self.tags,
                       sweep_id=self.sweep_id, driven_by_sweep=self.driven_by_sweep, trial_id=self.trial_id,
                       project=self.project,
                       notes=self.notes, archived_at=self.archived_at, final_checkpoint=self.final_checkpoint,
                       parent_id=self.parent_id, fork=self.fork, failure=self.failure)


def driven_by_sweep(run: "RunRecord | ActiveRun") -> bool:
    """Whether ``run`` is a trial whose attempts belong to its sweep's Tune driver, not to the
    run dispatcher: its job is the driver's (``sweep-...``) or an external driver's (none). A
    trial resumed by hand is QUEUED for the dispatcher, gets its own ``run-...`` job, and is an
    ordinary run from then on (a driver's trial is never QUEUED outside a transaction)."""
    return (run.sweep_id is not None and run.status is not RunStatus.QUEUED
            and (run.ray_job_id is None or run.ray_job_id.startswith("sweep-")))


@dataclass(frozen=True)
class ActiveRun:
    """A run as each dispatcher tick reads it (``Repository.snapshots``): what following its
    job, planning the queue, archiving its log and its wall-clock limit need. Its metrics,
    tags and notes are left out: with 1,000 active runs their JSON was most of a tick."""

    id: str
    project: str
    status: RunStatus
    attempt: int
    spec: dict[str, Any]  # shared by every tick's snapshot of this attempt: read, never modify
    error: str | None
    ray_job_id: str | None
    sweep_id: str | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> "ActiveRun":
        return cls(id=row.id, project=row.project, status=RunStatus(row.status), attempt=row.attempt, spec=row.spec,
                   error=row.error, ray_job_id=row.ray_job_id, sweep_id=row.sweep_id, created_at=row.created_at)

    @property
    def driven_by_sweep(self) -> bool:
        return driven_by_sweep(self)


def best_values(extrema: dict[str, list[float]]) -> dict[str, float]:
    """The best reported value of each key, by ``api.views.metric_mode``."""
    return {key: (low if metric_mode(key) == "min" else high) for key, (low, high) in extrema.items()}


def with_extrema(extrema: dict[str, list[float]], points: Iterable[tuple[str, float]]) -> dict[str, list[float]]:
    """A new ``{key: [min, max]}`` that also covers ``points`` (a fresh object, so the JSON column
    sees the change)."""
    updated = {key: list(bounds) for key, bounds in extrema.items()}
    for key, value in points:
        low, high = updated.get(key, (value, value))
        updated[key] = [min(low, value), max(high, value)]
    return updated


def _refuse_after_end(run: Run, what: str) -> None:
    """A worker's token is good only while its attempt is live: once the run has ended, its
    metrics, best values (and so a sweep's Pareto front) and checkpoints are final (409)."""
    status = RunStatus(run.status)
    if status.is_terminal:
        raise RUN_TRANSITIONS.refusal(run.id, status, status,
                                      f"run {run.id} is {status.value}; it takes no more reports ({what} refused)")


def _checkpoint_view(row: Checkpoint) -> CheckpointView:
    return CheckpointView(step=row.step, epoch=row.epoch, attempt=row.attempt, time=row.time, bytes=row.bytes,
                          committed=row.committed, url=row.url, world_size=row.world_size, error=row.error)


class Repository(AttemptStore):
    """Runs, their events, checkpoints and metrics over one SQLAlchemy engine (SQLite or
    PostgreSQL); ``transition``, ``begin_attempt`` and ``check_token`` come from ``AttemptStore``."""

    stored = StoredKind(model=Run, status=RunStatus, not_found=RunNotFound, transitions=RUN_TRANSITIONS,
                        job_prefix="run", record=RunRecord,
                        snapshot=ActiveRun, apply_status=apply_run_status)

    def __init__(self, engine: Engine):
        self.engine = engine
        self.db = Database(engine)

    @staticmethod
    def _require_run(session: Session, run_id: str) -> None:
        if not is_possible_id(run_id) or session.execute(select(Run.id).where(Run.id == run_id)).first() is None:
            raise RunNotFound(run_id)

    def ping(self) -> None:
        """Raise if the database cannot answer a trivial query."""
        with self.db.read() as session:
            session.execute(text("SELECT 1"))

    # --- runs ----------------------------------------------------------------------------
    def create_run(self, spec: RunSpec, *, sweep_id: str | None = None, project: str = DEFAULT_PROJECT,
                   by: str | None = None) -> RunRecord:
        """Store a validated spec as a QUEUED run of ``project`` with its first event, in one
        transaction; ``by``: who asked (``Caller.who``), named in that event."""
        with self.db.write() as session:
            return RunRecord.from_row(insert_run(session, spec, message=_created(by), sweep_id=sweep_id,
                                                 project=project))

    def create_run_once(self, spec: RunSpec, *, project: str, idempotency_key: str,
                        by: str | None = None) -> tuple[RunRecord, bool]:
        """``create_run`` once per ``(project, idempotency_key)``: the run and True when this call
        made it; the run an earlier call with the key made and False otherwise
        (``service.idempotency.created_once``: two concurrent calls make one run)."""
        def create() -> RunRecord:
            with self.db.write() as session:
                return RunRecord.from_row(insert_run(session, spec, message=_created(by), project=project,
                                                     idempotency_key=idempotency_key))
        return created_once(lambda: self.run_by_idempotency_key(project, idempotency_key), create)

    def run_by_idempotency_key(self, project: str, idempotency_key: str) -> RunRecord | None:
        query = select(Run).where(Run.project == project, Run.idempotency_key == idempotency_key)
        with self.db.read() as session:
            row = session.execute(query).scalars().first()
            return RunRecord.from_row(row) if row is not None else None

    def get_run(self, run_id: str) -> RunRecord:
        return self.get(run_id)

    def list_runs(self, where: RunFilter | None = None, *, status: RunStatus | None = None,
                  sweep_id: str | None = None, limit: int = 50, cursor: str | None = None,
                  projects: list[str] | None = None, order_by_best: str | None = None) -> tuple[list[RunRecord], str | None]:
        """Newest first (or, with ``order_by_best=KEY``, KEY's best value first), kept by ``where``
        (default: unarchived runs; ``status``/``sweep_id``/``projects`` narrow it, None: any).
        Returns the page and the cursor of the next page (None on the last); ``InvalidCursor``
        for a cursor of another order."""
        narrower = {"status": status, "sweep_id": sweep_id, "projects": projects}
        where = replace(where or RunFilter(), **{name: v for name, v in narrower.items() if v is not None})
        query = filtered(select(Run), where, self.engine.dialect.name)
        if order_by_best is None:
            query, order = newest_first(query, cursor), CREATED
        else:
            query, order = best_first(query, order_by_best, cursor), f"best:{order_by_best}"
        with self.db.read() as session:
            rows, following = one_page(session, query, limit, lambda last: next_cursor(last, order))
            return [RunRecord.from_row(row) for row in rows], following

    def update_run(self, run_id: str, *, tags: list[str] | None = None, notes: str | None = None) -> RunRecord:
        """Replace the run's tags (duplicates dropped, first kept) and/or notes (``""`` clears them);
        None leaves a field as it is. Allowed in any status."""
        with self.db.locked_write(Run, run_id, RunNotFound) as (session, run):
            if tags is not None:
                run.tags = list(dict.fromkeys(tags))
            if notes is not None:
                run.notes = clean_text(notes) or None
            # Not updated_at: it says when the run's job was last heard of (run_writes.last_heard).
            session.flush()
            return RunRecord.from_row(run)

    def set_archived(self, run_id: str, archived: bool) -> RunRecord:
        """Hide the run from default lists (``archived``) or show it again; archiving an archived
        run keeps its first ``archived_at``."""
        with self.db.locked_write(Run, run_id, RunNotFound) as (session, run):
            if not archived:
                run.archived_at = None
            elif run.archived_at is None:
                run.archived_at = utcnow()
            session.flush()
            return RunRecord.from_row(run)

    # --- status --------------------------------------------------------------------------
    def cancel_run(self, run_id: str, *, by: str = "user") -> RunRecord:
        """A user's cancel (``by``: who, named in the event): → CANCELING (the dispatcher stops the
        job). An active trial of a sweep is refused: its driver owns it, and only canceling the
        sweep stops it."""
        with self.db.locked_write(Run, run_id, RunNotFound) as (session, run):
            record = RunRecord.from_row(run)
            if record.driven_by_sweep and record.status in ACTIVE_STATUSES:
                raise RUN_TRANSITIONS.refusal(run_id, record.status, RunStatus.CANCELING,
                                              f"run {run_id} is a trial of sweep {record.sweep_id}; a trial cannot "
                                              f"be canceled on its own, cancel its sweep instead")
            apply_run_status(session, run, RunStatus.CANCELING, message=f"canceled by {by}", error=None)
            session.flush()
            return RunRecord.from_row(run)

    def apply_worker_report(self, run_id: str, status: RunStatus, *, message: str | None = None,
                            error: str | None = None, step: int | None = None,
                            final_checkpoint: str | None = None, started_at: datetime | None = None,
                            ended_at: datetime | None = None, failure: str | None = None) -> RunRecord:
        """A worker's status report, through the state machine (``service.worker_reports``
        says how lost, late and repeated reports are taken)."""
        with self.db.locked_write(Run, run_id, RunNotFound) as (session, run):
            apply_report(session, run, status, message=message, error=error, step=step,
                         final_checkpoint=final_checkpoint, started_at=started_at, ended_at=ended_at,
                         failure=failure)
            session.flush()
            return RunRecord.from_row(run)

    def resume_run(self, run_id: str, *, num_workers: int | None = None, by: str = "user") -> RunRecord:
        """FAILED, CANCELED or STOPPED (a trial ended early) → QUEUED as a new attempt (``by``: who
        asked, named in the event), which
        resumes from the newest committed checkpoint (a trial goes on as a standalone run); with
        ``num_workers`` the spec's ``parallelism.num_workers`` is rewritten first (validated:
        raises pydantic's ``ValidationError`` for a spec that no longer holds)."""
        with self.db.locked_write(Run, run_id, RunNotFound) as (session, run):
            current = RunStatus(run.status)
            if current not in (RunStatus.FAILED, RunStatus.CANCELED, RunStatus.STOPPED):
                way_forward = ""
                if current is RunStatus.COMPLETED:  # it trained to the end: what a user wants is elsewhere
                    way_forward = (f"; to train it longer, continue it: tessera continue {run_id} --max-duration N "
                                   f"(POST /api/v1/runs/{run_id}/continue); to change it, fork it: tessera fork "
                                   f"{run_id} --set FIELD=VALUE (POST /api/v1/runs/{run_id}/fork)")
                raise RUN_TRANSITIONS.refusal(run_id, current, RunStatus.QUEUED,
                                              f"run {run_id} is {current.value}; only FAILED, CANCELED or STOPPED "
                                              f"runs can be resumed{way_forward}")
            message = f"resumed by {by}"
            if num_workers is not None and num_workers != run.spec["parallelism"]["num_workers"]:
                spec = dict(run.spec)
                spec["parallelism"] = {**spec["parallelism"], "num_workers": num_workers}
                run.spec = RunSpec.model_validate(spec).model_dump(mode="json")
                message += f" on {num_workers} worker(s)"
            message += _resumes_from(session, run)
            apply_run_status(session, run, RunStatus.QUEUED, message=message, error=None)
            session.flush()
            return RunRecord.from_row(run)

    # --- checkpoints ---------------------------------------------------------------------
    def add_checkpoint(self, run_id: str, report: CheckpointReport) -> CheckpointView:
        """Record a worker's checkpoint report (idempotent per URL: a retried report updates
        the row). A failed save becomes a run event saying why. Committed rows beyond the
        spec's ``checkpoint.keep_last`` are dropped, as the worker's retention deletes them."""
        with self.db.locked_write(Run, run_id, RunNotFound) as (session, run):
            _refuse_after_end(run, "a checkpoint")
            row = session.execute(select(Checkpoint).where(Checkpoint.run_id == run_id,
                                                           Checkpoint.url == report.url)).scalar_one_or_none()
            if row is None:
                row = Checkpoint(run_id=run_id, url=report.url)
                session.add(row)
            row.attempt, row.step, row.epoch, row.time = run.attempt, report.step, report.epoch, report.time
            row.bytes, row.committed, row.world_size = report.bytes, report.committed, report.world_size
            row.error = clean_text(report.error)
            run.updated_at = utcnow()  # heard of (run_writes.last_heard)
            if not report.committed:
                status = RunStatus(run.status)
                reason = first_line(row.error, 400) or "unknown error"
                add_run_event(session, run, status, status,
                           f"checkpoint at batch {report.step} not committed: {reason}", utcnow())
            session.flush()
            keep_last = int(run.spec.get("checkpoint", {}).get("keep_last", 3))
            committed = session.execute(select(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.committed)
                                        .order_by(Checkpoint.step.desc(), Checkpoint.id.desc())).scalars().all()
            for old in committed[keep_last:]:
                session.delete(old)
            session.flush()
            return _checkpoint_view(row)

    def add_note(self, run_id: str, message: str) -> RunRecord:
        """A worker's note: a run event that keeps the run's status (refused once it ended)."""
        with self.db.locked_write(Run, run_id, RunNotFound) as (session, run):
            _refuse_after_end(run, "a note")
            status = RunStatus(run.status)
            run.updated_at = utcnow()  # heard of (run_writes.last_heard)
            add_run_event(session, run, status, status, clean_text(message), run.updated_at)
            session.flush()
            return RunRecord.from_row(run)

    def checkpoints(self, run_id: str) -> list[CheckpointView]:
        """The run's checkpoints, oldest first."""
        with self.db.read() as session:
            self._require_run(session, run_id)
            rows = session.execute(select(Checkpoint).where(Checkpoint.run_id == run_id)
                                   .order_by(Checkpoint.step, Checkpoint.id)).scalars()
            return [_checkpoint_view(row) for row in rows]

    def events(self, run_id: str) -> list[RunEventView]:
        """Every status change of the run, oldest first."""
        with self.db.read() as session:
            self._require_run(session, run_id)
            rows = session.execute(select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.seq)).scalars()
            return [RunEventView(seq=e.seq, from_status=RunStatus(e.from_status) if e.from_status else None,
                                 to_status=RunStatus(e.to_status), attempt=e.attempt, time=e.time, message=e.message)
                    for e in rows]

    # --- worker tokens -------------------------------------------------------------------
    def set_token(self, run_id: str, token: str) -> None:
        """Make ``token`` the only one accepted for the run's reports (only its hash is kept)."""
        with self.db.locked_write(Run, run_id, RunNotFound) as (_session, run):
            run.token_hash = hash_token(token)

    # --- metrics -------------------------------------------------------------------------
    def add_metrics(self, run_id: str, points: list[ReportedMetric], limits: MetricLimits | None = None, *,
                    session_id: str | None = None, batch: int | None = None) -> int | None:
        """Store a batch of points and update the run's summary (last value per key) and extrema
        (min and max per key); returns how many were stored, or None for a batch replayed after it
        was stored (``session_id`` and ``batch``, see ``service.metric_writes``): stored once.

        Non-finite values (a diverged loss) are not stored as points (they would poison the
        summary, extrema and charts); each report that has them leaves a run event naming the
        key and the step. ``limits``: refuse the whole report (``MetricLimitExceeded``) if it
        would take the run past its key count or point budget.
        """
        # The row lock orders concurrent batches of one run: their seqs are assigned in
        # commit order, so a reader polling `after=last_seq` never skips a point.
        with self.db.locked_write(Run, run_id, RunNotFound) as (session, run):
            if is_replayed_batch(run, session_id, batch):
                return None  # checked first: a replay whose answer was lost, even after the run ended
            _refuse_after_end(run, "metrics")
            remember_batch(run, session_id, batch)
            if limits is not None:
                limits.check_run(run_id, (run.summary or {}).keys(), run.metric_points or 0, points)
            note = non_finite_note(points)
            if note is not None:
                status = RunStatus(run.status)
                add_run_event(session, run, status, status, note, utcnow())
            attempt = run.attempt  # read once: each read of a mapped attribute goes through the ORM
            rows = [{"run_id": run_id, "step": p.step, "key": p.key, "value": p.value, "time": p.time,
                     "attempt": attempt}
                    for p in points if math.isfinite(p.value)]
            if not rows:
                return 0
            insert_points(session, rows)
            run.metric_points = (run.metric_points or 0) + len(rows)
            summary = dict(run.summary or {})
            for row in rows:  # reporting order: the last value reported for a key wins
                summary[row["key"]] = row["value"]
            run.summary = summary
            extrema = with_extrema(run.extrema or {}, ((row["key"], row["value"]) for row in rows))
            run.extrema = extrema
            reported = dict.fromkeys(row["key"] for row in rows)  # each key once, in reporting order
            upsert_bests(session, run_id, {key: extrema[key] for key in reported})
            run.updated_at = utcnow()
            return len(rows)

    def metrics_after(self, run_id: str, after: int = 0, limit: int = 5000, *,
                      all_attempts: bool = False) -> tuple[list[MetricPoint], int]:
        """Points with ``seq > after`` in seq order, and the largest seq returned (or ``after``);
        points superseded by a resumed attempt only with ``all_attempts``."""
        rows, last_seq = self.metric_rows_after(run_id, after, limit, all_attempts=all_attempts)
        return [MetricPoint(**row) for row in rows], last_seq

    def metric_rows_after(self, run_id: str, after: int = 0, limit: int = 5000, *, all_attempts: bool = False,
                          key: str | None = None) -> tuple[list[dict[str, Any]], int]:
        """``metrics_after`` as dicts of ``MetricPoint``'s fields, for the metrics route (only
        ``key``'s points when given): a dashboard's first poll reads 10,000 points a page, and
        building a validated model per stored point (validated when reported) was most of its CPU."""
        columns = (Metric.seq, Metric.step, Metric.key, Metric.value, Metric.time, Metric.attempt, Metric.superseded)
        query = select(*columns).where(Metric.run_id == run_id, Metric.seq > after).order_by(Metric.seq).limit(limit)
        if key is not None:
            query = query.where(Metric.key == key)
        if not all_attempts:
            query = query.where(Metric.superseded.is_(False))
        names = [column.key for column in columns]
        with self.db.read() as session:
            self._require_run(session, run_id)
            rows = [dict(zip(names, row)) for row in session.execute(query)]
        return rows, (rows[-1]["seq"] if rows else after)

    def eval_metrics_at(self, run_id: str, step: int) -> dict[str, float]:
        """The latest value of each ``eval/`` key reported at or before ``step`` (what a model
        exported at ``step`` scored)."""
        query = (select(Metric.key, Metric.value)
                 .where(Metric.run_id == run_id, Metric.step <= step, Metric.key.like("eval/%"),
                        Metric.superseded.is_(False))
                 .order_by(Metric.step, Metric.seq))
        with self.db.read() as session:
            return {key: value for key, value in session.execute(query)}

    def count_metrics(self, run_id: str) -> int:
        with self.db.read() as session:
            return session.execute(select(func.count()).select_from(Metric).where(Metric.run_id == run_id)).scalar_one()


def _resumes_from(session, run: Run) -> str:
    """What a resumed run's event adds when no committed checkpoint of the run was reported: it
    starts again from its parent's checkpoint (a fork), or from the start. (The worker resumes
    from storage's newest: a report lost on the way would make this wrong, and it says so.)"""
    saved = session.execute(select(Checkpoint.id).where(Checkpoint.run_id == run.id, Checkpoint.committed)
                            .limit(1)).first()
    if saved is not None:
        return ""
    if (run.fork or {}).get("checkpoint_url"):
        return "; it has no checkpoint of its own, so it starts again from its parent's"
    return ("; it has no checkpoint (none was reported: checkpoint.interval sets how often one is saved), so "
            "it trains again from the start")


def _created(by: str | None) -> str:
    """A new run's first event: ``created``, and by whom when a caller is known."""
    return "created" if by is None else f"created by {by}"
