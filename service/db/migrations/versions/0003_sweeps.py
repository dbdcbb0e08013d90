"""Sweeps, and the trial columns of runs (trial id, searched params, metric extrema).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("driver", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("skipped", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("token_hash", sa.String(64), nullable=True),
        sa.Column("ray_job_id", sa.String(128), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("started_at", Timestamp, nullable=True),
        sa.Column("finished_at", Timestamp, nullable=True),
        sa.Column("updated_at", Timestamp, nullable=False),
    )
    op.create_index("ix_sweeps_status", "sweeps", ["status"])
    op.create_index("ix_sweeps_created_at_id", "sweeps", ["created_at", "id"])

    # Plain ADD COLUMN, never a batch rebuild: rebuilding `runs` on SQLite drops the old table,
    # and with foreign keys on that cascades into run_events, metrics and checkpoints.
    op.add_column("runs", sa.Column("trial_id", sa.String(64), nullable=True))
    op.add_column("runs", sa.Column("trial_params", sa.JSON(), nullable=True))
    op.add_column("runs", sa.Column("extrema", sa.JSON(), nullable=False, server_default=sa.text("'{}'")))
    op.create_index("uq_runs_sweep_id_trial_id", "runs", ["sweep_id", "trial_id"], unique=True)
    _backfill_extrema()


def _backfill_extrema() -> None:
    """Existing runs get their best values from the points they already reported."""
    bind = op.get_bind()
    found: dict[str, dict[str, list[float]]] = {}
    for run_id, key, low, high in bind.execute(
            sa.text("SELECT run_id, key, MIN(value), MAX(value) FROM metrics GROUP BY run_id, key")):
        found.setdefault(run_id, {})[key] = [low, high]
    runs = sa.table("runs", sa.column("id", sa.String(32)), sa.column("extrema", sa.JSON()))
    for run_id, extrema in found.items():
        bind.execute(runs.update().where(runs.c.id == run_id).values(extrema=extrema))


def downgrade() -> None:
    # DROP COLUMN (SQLite >= 3.35) for the same reason: no rebuild of `runs`.
    op.drop_index("uq_runs_sweep_id_trial_id", table_name="runs")
    for column in ("extrema", "trial_params", "trial_id"):
        op.drop_column("runs", column)
    op.drop_table("sweeps")
