"""When a run's current attempt began training: ``runs.attempt_started_at``.

A run's ``finished_at`` is the time its worker says the attempt ended, kept no earlier than the
attempt's start; ``started_at`` is the run's first start only, so for a resumed or re-queued run
that bound let a worker's early clock put the end before the current attempt even began. The
column holds the current attempt's start (its RUNNING report's time, by the worker's clock;
until then its submission) and is that bound (``service.run_writes``). Runs in a job now get
their latest STARTING or RUNNING event's time, which is what the service knew of that start;
other runs keep NULL (a queued one gets it when submitted; an ended one keeps the times it has).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN, never a batch rebuild (on SQLite a rebuilt ``runs`` would cascade-delete
    # every run's points): see 0003.
    op.add_column("runs", sa.Column("attempt_started_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE runs SET attempt_started_at = (SELECT max(run_events.time) FROM run_events "
               "WHERE run_events.run_id = runs.id AND run_events.to_status IN ('STARTING', 'RUNNING')) "
               "WHERE status IN ('STARTING', 'RUNNING', 'RESTARTING')")


def downgrade() -> None:
    op.drop_column("runs", "attempt_started_at")
