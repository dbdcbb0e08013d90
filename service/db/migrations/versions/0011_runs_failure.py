"""Why a FAILED run failed, as the place that recorded the failure knew it: ``runs.failure``.

``machine`` when what ran the attempt was lost (a node or worker process died, Ray lost or never
made its job), so another attempt may well pass; ``code`` when the training raised (its code,
spec or data), which a resume would repeat. The dashboard guessed this from the error's text;
runs that failed before this migration keep NULL, and it still guesses for them.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN, never a batch rebuild (on SQLite a rebuilt ``runs`` would cascade-delete
    # every run's points): see 0003.
    op.add_column("runs", sa.Column("failure", sa.String(16), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "failure")
