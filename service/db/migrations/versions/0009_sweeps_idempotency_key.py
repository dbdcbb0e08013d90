"""``Idempotency-Key`` on ``POST /sweeps``, as 0005 gave ``POST /runs`` one.

The SDK retries a sweep's submit whose answer was lost (a connection error, a 502/503/504) with
the same key; the key is kept on the sweep, unique per project, so the retry gets the first
request's sweep instead of making a second one.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (nullable), never a batch rebuild: see 0003.
    op.add_column("sweeps", sa.Column("idempotency_key", sa.String(128), nullable=True))
    op.create_index("uq_sweeps_project_idempotency_key", "sweeps", ["project", "idempotency_key"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_sweeps_project_idempotency_key", "sweeps")
    op.drop_column("sweeps", "idempotency_key")
