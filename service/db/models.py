"""Tables of the control plane (SQLAlchemy 2 typed models). Works on SQLite and PostgreSQL.

These are storage rows, never response bodies: the routes return ``api.views`` models built
from them, so a column like ``token_hash`` cannot leak into the API by accident.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, false,
                        TypeDecorator)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def aware(value: datetime) -> datetime:
    """``value`` with a time zone: a naive time from a caller is taken to be UTC already."""
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


class UTCDateTime(TypeDecorator):
    """A timestamp that is always timezone-aware UTC in Python.

    SQLite has no time zones: values are stored as naive UTC and given ``tzinfo=UTC`` back, so
    both databases return the same thing and comparisons never mix naive and aware values.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        value = aware(value).astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


# SQLite only autoincrements an INTEGER PRIMARY KEY (the rowid), not a BIGINT one.
BigSeq = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


DEFAULT_PROJECT = "default"


class AttemptedRow:
    """The columns runs and sweeps share: a project, a status, and one Ray job and token per attempt."""

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    project: Mapped[str] = mapped_column(String(64), default=DEFAULT_PROJECT, index=True)
    name: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    ray_job_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # sha256 of the current attempt's token (a run's worker, a sweep's driver); the token itself
    # is never stored.
    token_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # A run's: its last status change, or its job's last report (service.run_writes.last_heard);
    # not a user's edit of its tags or notes. A sweep's: its last status change or report.
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Run(AttemptedRow, Base):
    __tablename__ = "runs"

    summary: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)  # on PostgreSQL, GIN-indexed as jsonb (0007)
    sweep_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    # A sweep trial: Ray Tune's trial id within the sweep, and the searched values that made it.
    trial_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    trial_params: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # {key: [min, max]} over every reported point: the best value per api.views.metric_mode.
    extrema: Mapped[dict[str, list[float]]] = mapped_column(JSON, default=dict)
    # Lineage: the run this one was forked from, and how ({"from": ..., "patch": {...}}).
    parent_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    fork: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    notes: Mapped[str | None] = mapped_column(Text, nullable=True)
    archived_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The client's Idempotency-Key of the submit that made this run (unique per project).
    idempotency_key: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # The last metric batch stored (the worker reporter's session and batch number): a batch
    # replayed after its answer was lost is acknowledged, not stored twice (migration 0006).
    report_session: Mapped[str | None] = mapped_column(String(32), nullable=True)
    report_batch: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # "saved" | "missing" once a run that saves checkpoints has ended; None otherwise.
    final_checkpoint: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # Metric points stored for this run (superseded ones too): the report budget's count (0008).
    metric_points: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Once FAILED: "machine" | "code", why, as the worker or dispatcher that recorded it knew
    # (``api.views.RunView.failure``); None if neither knew, or it failed before 0011.
    failure: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # When the current attempt began training (its RUNNING report's time, by the worker's clock);
    # until then when it was submitted; None while QUEUED (``service.run_writes``, migration 0012).
    attempt_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # How long the run trained (held a worker group), apart from time queued or starting between
    # attempts: the seconds of its attempts that have ended, and while one trains, when it began
    # (its attempt_started_at; None while none trains). ``service.run_writes``, migration 0013.
    trained_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    training_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    __table_args__ = (Index("ix_runs_created_at_id", "created_at", "id"),
                      Index("uq_runs_sweep_id_trial_id", "sweep_id", "trial_id", unique=True),
                      Index("uq_runs_project_idempotency_key", "project", "idempotency_key", unique=True))


class RunBest(Base):
    """A run's min and max of one metric key, kept beside ``runs.extrema`` so lists can sort
    by a metric's best value through an index (``GET /runs?order_by=best:<key>``)."""

    __tablename__ = "run_bests"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    min_value: Mapped[float] = mapped_column(Float)
    max_value: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_run_bests_key_min", "key", "min_value"),
                      Index("ix_run_bests_key_max", "key", "max_value"))


class Sweep(AttemptedRow, Base):
    """A search over runs (see docs/sweeps.md). Its trials are runs with ``sweep_id`` set."""

    __tablename__ = "sweeps"

    driver: Mapped[str] = mapped_column(String(16))  # "service" (a Ray job we submit) or "external"
    skipped: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    archived_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The client's Idempotency-Key of the submit that made this sweep (unique per project).
    idempotency_key: Mapped[str | None] = mapped_column(String(128), nullable=True)

    __table_args__ = (Index("ix_sweeps_created_at_id", "created_at", "id"),
                      Index("uq_sweeps_project_idempotency_key", "project", "idempotency_key", unique=True))


class RunEvent(Base):
    """One status transition of a run, with the attempt it belongs to and why it happened."""

    __tablename__ = "run_events"

    seq: Mapped[int] = mapped_column(BigSeq, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    from_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    to_status: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    time: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)


class Metric(Base):
    """One reported value. ``seq`` orders points globally so clients can poll ``after=seq``."""

    __tablename__ = "metrics"

    seq: Mapped[int] = mapped_column(BigSeq, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))  # indexed with seq below
    step: Mapped[int] = mapped_column(BigInteger)
    key: Mapped[str] = mapped_column(String(128))
    value: Mapped[float] = mapped_column(Float)
    time: Mapped[datetime] = mapped_column(UTCDateTime)
    # The run's attempt when stored (None: stored before migration 0006), and whether a later
    # attempt resumed from an earlier step (kept for audit; default reads skip it).
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    superseded: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    # Every lookup by run goes through (run_id, seq); a lone (run_id) index went in migration 0010.
    __table_args__ = (Index("ix_metrics_run_id_seq", "run_id", "seq"),)


class Checkpoint(Base):
    """A checkpoint a worker reported: committed (its marker is written) or failed (``error``)."""

    __tablename__ = "checkpoints"

    id: Mapped[int] = mapped_column(BigSeq, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(BigInteger)
    epoch: Mapped[int] = mapped_column(Integer)
    time: Mapped[datetime] = mapped_column(UTCDateTime)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    committed: Mapped[bool] = mapped_column(Boolean, default=False)
    url: Mapped[str] = mapped_column(Text)
    world_size: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class Project(Base):
    """A tenant: runs, sweeps and their checkpoints belong to one; quotas are per project.

    A quota of None means no limit."""

    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    max_running_runs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_workers: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Seconds: the wall-clock limit of a run that sets none, and this project's raise of the
    # global caps (None: the service's settings apply).
    default_max_wall_time_s: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_wall_time_cap_s: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # An admin's raise of the service's upper bounds on max_duration, per unit ({"ep": 5000}).
    max_duration_caps: Mapped[dict[str, int] | None] = mapped_column(JSON, nullable=True)


class ApiKey(Base):
    """A user's API key: only the sha256 of the secret is stored. ``roles`` maps a project name
    to ``viewer``, ``member`` or ``admin``; the project ``*`` means every project (the key the
    service makes on first start)."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))  # the first characters, to tell keys apart in lists
    roles: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
