"""Outage-safe reports: idempotent metric batches, superseded points, the final checkpoint.

- metrics: ``attempt`` (the run's attempt when the point was stored; NULL for points stored
  before this migration) and ``superseded`` (true once a later attempt resumed from a step
  before the point's: kept for audit, hidden from the default reads, summary and best values).
- runs: ``report_session`` and ``report_batch``, the last metric batch stored (a worker's
  reporter session and its batch number), so a batch replayed from a worker's spool after its
  answer was lost is acknowledged without being stored twice; ``final_checkpoint``
  (``saved`` | ``missing``; NULL when the run saves no checkpoints or has not ended).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (nullable or with a server default), never a batch rebuild: see 0003.
    op.add_column("metrics", sa.Column("attempt", sa.Integer(), nullable=True))
    op.add_column("metrics", sa.Column("superseded", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("runs", sa.Column("report_session", sa.String(32), nullable=True))
    op.add_column("runs", sa.Column("report_batch", sa.BigInteger(), nullable=True))
    op.add_column("runs", sa.Column("final_checkpoint", sa.String(16), nullable=True))


def downgrade() -> None:
    for column in ("final_checkpoint", "report_batch", "report_session"):
        op.drop_column("runs", column)
    op.drop_column("metrics", "superseded")
    op.drop_column("metrics", "attempt")
