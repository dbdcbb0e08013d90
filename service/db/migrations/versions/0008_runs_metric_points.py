"""A per-run count of stored metric points, so a report's budget check does not count them.

``POST /runs/{id}/report/metrics`` refuses a report that would take the run past
``TESSERA_MAX_POINTS_PER_RUN``; it counted the run's points with ``count(*)`` on every report,
under the run's row lock. That is linear in the run's points: 7 ms at 20k points, 168 ms at
400k (PostgreSQL, this machine), about 2 s near the 5M default budget, and every report of that
run waits behind it. ``runs.metric_points`` keeps the count (every stored point, superseded ones
too, as the ``count(*)`` did), updated in the report's transaction; this migration fills it in.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN with a server default, never a batch rebuild (on SQLite a rebuilt ``runs``
    # would cascade-delete every run's points): see 0003.
    op.add_column("runs", sa.Column("metric_points", sa.BigInteger(), nullable=False, server_default="0"))
    op.execute("UPDATE runs SET metric_points = (SELECT count(*) FROM metrics WHERE metrics.run_id = runs.id)")


def downgrade() -> None:
    op.drop_column("runs", "metric_points")
