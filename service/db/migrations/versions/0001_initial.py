"""Initial schema: runs, run_events, metrics.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Same as service.db.models.BigSeq; spelled out so this file never changes with the models.
BigSeq = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("ray_job_id", sa.String(128), nullable=True),
        sa.Column("token_hash", sa.String(64), nullable=True),
        sa.Column("sweep_id", sa.String(32), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("started_at", Timestamp, nullable=True),
        sa.Column("finished_at", Timestamp, nullable=True),
        sa.Column("updated_at", Timestamp, nullable=False),
    )
    op.create_index("ix_runs_status", "runs", ["status"])
    op.create_index("ix_runs_sweep_id", "runs", ["sweep_id"])
    op.create_index("ix_runs_created_at_id", "runs", ["created_at", "id"])

    op.create_table(
        "run_events",
        sa.Column("seq", BigSeq, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("from_status", sa.String(16), nullable=True),
        sa.Column("to_status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("time", Timestamp, nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
    )
    op.create_index("ix_run_events_run_id", "run_events", ["run_id"])

    op.create_table(
        "metrics",
        sa.Column("seq", BigSeq, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("time", Timestamp, nullable=False),
    )
    op.create_index("ix_metrics_run_id", "metrics", ["run_id"])
    op.create_index("ix_metrics_run_id_seq", "metrics", ["run_id", "seq"])


def downgrade() -> None:
    op.drop_table("metrics")
    op.drop_table("run_events")
    op.drop_table("runs")
