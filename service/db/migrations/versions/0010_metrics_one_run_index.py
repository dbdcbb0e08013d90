"""One index on a run's metric points, not two: ``ix_metrics_run_id`` goes, ``ix_metrics_run_id_seq`` stays.

Every lookup by run (the metrics route, the foreign key's cascade, the point count) is served by
``(run_id, seq)``, whose first column is ``run_id``. The lone ``(run_id)`` index cost every report
its upkeep, and it took part in the slow plan of ``GET /runs/{id}/metrics?key=``: the key's rows
fetched through it. Without it, and with every statement planned for its values
(``service.db.engine.plan_each_statement``), a key's first page of a 1M-point run among 2.9M
points took 0.06-0.11x the time, and a 1,000-point COPY (the report route's insert) 0.84x
(``bench/metric_reads.py``, docs/performance.md). An index on ``(run_id, key, seq)`` read a rare
key faster still but made every COPY 1.24x as long: not taken.

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
