"""One index on a run's metric points, not two: ``ix_metrics_run_id`` goes, ``ix_metrics_run_id_seq`` stays.

Every lookup by run (the metrics route, the foreign key's cascade, the point count) can use
``(run_id, seq)``, whose first column is ``run_id``; the lone ``(run_id)`` index only cost every
report its upkeep: without it a 1,000-point COPY (the report route's insert) takes 0.84x the time
(``bench/metric_reads.py``, docs/performance.md). An index on ``(run_id, key, seq)`` would read
a rare key of a long run 25x faster but made every COPY 1.22x as long: not taken.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_metrics_run_id", table_name="metrics")


def downgrade() -> None:
    op.create_index("ix_metrics_run_id", "metrics", ["run_id"])
