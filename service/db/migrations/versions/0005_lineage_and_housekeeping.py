"""Lineage, housekeeping and idempotent submits.

- runs: ``parent_id`` and ``fork`` (what a forked run came from: the parent's checkpoint choice
  and the spec patch), ``notes``, ``archived_at``, and ``idempotency_key`` (unique per project,
  so a retried ``POST /runs`` returns the first run).
- sweeps: ``archived_at``.
- ``run_bests``: one row per (run, metric key) with the key's min and max, indexed by key and
  value so ``GET /runs?order_by=best:<key>`` stays an index scan at 100k runs. ``runs.extrema``
  keeps the same numbers for the views; this table is what lists sort by.
- projects: ``max_duration_caps``, an admin's raise of the service's upper bounds on
  ``max_duration`` per unit (``{"ep": 5000}``).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Plain ADD COLUMN (nullable), never a batch rebuild: see 0003.
    op.add_column("runs", sa.Column("parent_id", sa.String(32), nullable=True))
    op.add_column("runs", sa.Column("fork", sa.JSON(), nullable=True))
    op.add_column("runs", sa.Column("notes", sa.Text(), nullable=True))
    op.add_column("runs", sa.Column("archived_at", Timestamp, nullable=True))
    op.add_column("runs", sa.Column("idempotency_key", sa.String(128), nullable=True))
    op.create_index("ix_runs_parent_id", "runs", ["parent_id"])
    op.create_index("uq_runs_project_idempotency_key", "runs", ["project", "idempotency_key"], unique=True)
    op.add_column("sweeps", sa.Column("archived_at", Timestamp, nullable=True))
    op.add_column("projects", sa.Column("max_duration_caps", sa.JSON(), nullable=True))
    op.create_table(
        "run_bests",
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("min_value", sa.Float(), nullable=False),
        sa.Column("max_value", sa.Float(), nullable=False),
    )
    op.create_index("ix_run_bests_key_min", "run_bests", ["key", "min_value"])
    op.create_index("ix_run_bests_key_max", "run_bests", ["key", "max_value"])
    # Existing runs' extrema are copied in, so old runs sort too.
    bind = op.get_bind()
    runs = sa.table("runs", sa.column("id", sa.String), sa.column("extrema", sa.JSON))
    bests = sa.table("run_bests", sa.column("run_id", sa.String), sa.column("key", sa.String),
                     sa.column("min_value", sa.Float), sa.column("max_value", sa.Float))
    rows = [{"run_id": run_id, "key": key, "min_value": float(lo), "max_value": float(hi)}
            for run_id, extrema in bind.execute(sa.select(runs.c.id, runs.c.extrema))
            for key, (lo, hi) in (extrema or {}).items()]
    if rows:
        op.bulk_insert(bests, rows)


def downgrade() -> None:
    op.drop_index("ix_run_bests_key_max", "run_bests")
    op.drop_index("ix_run_bests_key_min", "run_bests")
    op.drop_table("run_bests")
    op.drop_column("projects", "max_duration_caps")
    op.drop_column("sweeps", "archived_at")
    op.drop_index("uq_runs_project_idempotency_key", "runs")
    op.drop_index("ix_runs_parent_id", "runs")
    for column in ("idempotency_key", "archived_at", "notes", "fork", "parent_id"):
        op.drop_column("runs", column)
