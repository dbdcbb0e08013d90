"""How long a run trained, apart from its waits between attempts: ``runs.trained_seconds`` and
``runs.training_since``.

A run's duration was its first start to its last end, so a run preempted, queued for an hour and
resumed counted that hour. ``trained_seconds`` holds the seconds of its attempts that have ended
(each from when it began training to its end), and ``training_since`` when the attempt that
trains now began (None while none does); ``service.run_writes`` keeps both from now on.

What came before is rebuilt from the run's events, which is what the service knew: an attempt
trains from its RUNNING event to its next RUNNING (a restarted worker group), re-queue or end.
The worker's own times were kept for three of those instants only, and they are used there: the
run's first start (``started_at``), its current attempt's start (``attempt_started_at``, once
that attempt's RUNNING came) and its end (``finished_at``); the others are when the service
learned of them (a lost job's attempt, so, ends when it was found lost). A run that trains now,
or is being canceled after it began training, trains since the RUNNING its events leave open (by
the worker's time where the row kept it): not from ``attempt_started_at`` alone, which 0012 left
empty on a run that was being canceled as it ran.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

ENDS = frozenset({"QUEUED", "COMPLETED", "FAILED", "CANCELED", "STOPPED"})  # a re-queue or an end
TERMINAL = ENDS - {"QUEUED"}
TRAINING = frozenset({"RUNNING", "RESTARTING", "CANCELING"})  # may still train: since its open RUNNING, if any
RUNS_PER_READ = 500  # bounded IN lists, and a bounded batch of events in memory

runs = sa.table("runs", sa.column("id", sa.String), sa.column("status", sa.String), sa.column("attempt", sa.Integer),
                sa.column("started_at", sa.DateTime(timezone=True)),
                sa.column("finished_at", sa.DateTime(timezone=True)),
                sa.column("attempt_started_at", sa.DateTime(timezone=True)), sa.column("trained_seconds", sa.Float),
                sa.column("training_since", sa.DateTime(timezone=True)))
events = sa.table("run_events", sa.column("seq", sa.BigInteger), sa.column("run_id", sa.String),
                  sa.column("from_status", sa.String), sa.column("to_status", sa.String),
                  sa.column("attempt", sa.Integer), sa.column("time", sa.DateTime(timezone=True)))


def upgrade() -> None:
    # Plain ADD COLUMN, never a batch rebuild (on SQLite a rebuilt ``runs`` would cascade-delete
    # every run's points): see 0003.
    op.add_column("runs", sa.Column("trained_seconds", sa.Float(), nullable=False, server_default="0"))
    op.add_column("runs", sa.Column("training_since", sa.DateTime(timezone=True), nullable=True))
    _fill_trained_seconds(op.get_bind())


def downgrade() -> None:
    op.drop_column("runs", "training_since")
    op.drop_column("runs", "trained_seconds")


def _fill_trained_seconds(connection: sa.Connection) -> None:
    """Every run that ever began training gets the seconds of its ended attempts, and one that may
    train now the start of its open attempt, from its events, ``RUNS_PER_READ`` runs at a time (by
    id: memory stays bounded however many runs there are)."""
    query = (sa.select(runs.c.id, runs.c.status, runs.c.attempt, runs.c.started_at, runs.c.finished_at,
                       runs.c.attempt_started_at)
             .where(runs.c.started_at.is_not(None)).order_by(runs.c.id).limit(RUNS_PER_READ))
    after = None
    while chunk := {run.id: run for run in connection.execute(
            query if after is None else query.where(runs.c.id > after))}:
        after = list(chunk)[-1]  # the last in the database's order (its collation, not Python's)
        changes = _status_changes(connection, list(chunk))
        values = []
        for run_id, run in chunk.items():
            seconds, since = trained_seconds(run, changes.get(run_id, []))
            since = since if run.status in TRAINING else None  # an ended run's last RUNNING is closed by its end
            if seconds > 0 or since is not None:
                values.append({"run_id": run_id, "seconds": seconds, "since": since})
        if values:
            connection.execute(runs.update().where(runs.c.id == sa.bindparam("run_id"))
                               .values(trained_seconds=sa.bindparam("seconds"),
                                       training_since=sa.bindparam("since")), values)


def _status_changes(connection: sa.Connection, run_ids: list[str]) -> dict[str, list[tuple[str, int, datetime]]]:
    """``{run id: [(to_status, attempt, time), ...]}`` in order: the moves to RUNNING, to QUEUED and
    to an end; notes (an event whose status does not change) left out."""
    query = (sa.select(events.c.run_id, events.c.to_status, events.c.attempt, events.c.time)
             .where(events.c.run_id.in_(run_ids), events.c.to_status.in_(ENDS | {"RUNNING"}),
                    sa.or_(events.c.from_status.is_(None), events.c.from_status != events.c.to_status))
             .order_by(events.c.run_id, events.c.seq))
    changes: dict[str, list[tuple[str, int, datetime]]] = {}
    for run_id, to_status, attempt, time in connection.execute(query):
        changes.setdefault(run_id, []).append((to_status, attempt, time))
    return changes


def trained_seconds(run: sa.Row, changes: list[tuple[str, int, datetime]]) -> tuple[float, datetime | None]:
    """The seconds of ``run``'s ended attempts: each from its start (a RUNNING) to the next RUNNING
    (a restarted worker group), re-queue or end; and the start of the attempt its events leave open
    (None if none); the worker's times where the row kept them."""
    runnings = [i for i, (to_status, _, _) in enumerate(changes) if to_status == "RUNNING"]
    ends = [i for i, (to_status, _, _) in enumerate(changes) if to_status in ENDS]
    known = {}  # event index -> the worker's time of that instant, kept on the row
    if runnings and run.started_at is not None:
        known[runnings[0]] = run.started_at
    if runnings and changes[runnings[-1]][1] == run.attempt and run.attempt_started_at is not None:
        known[runnings[-1]] = run.attempt_started_at  # the current attempt's RUNNING (one an attempt)
    if ends and run.status in TERMINAL and run.finished_at is not None:
        known[ends[-1]] = run.finished_at
    total, since = 0.0, None
    for i, (to_status, _, time) in enumerate(changes):
        at = _utc(known.get(i, time))
        if since is not None:
            total += max(0.0, (at - since).total_seconds())
        since = at if to_status == "RUNNING" else None
    return total, since


def _utc(value: datetime) -> datetime:
    """SQLite gives naive UTC times back (``service.db.models.UTCDateTime`` stores them so)."""
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
