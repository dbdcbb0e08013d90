"""Projects, API keys, per-project quotas; every run and sweep belongs to a project.

Existing runs and sweeps move into the ``default`` project, which this migration creates.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    projects = op.create_table(
        "projects",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("max_running_runs", sa.Integer(), nullable=True),
        sa.Column("max_workers", sa.Integer(), nullable=True),
        sa.Column("max_gpus", sa.Integer(), nullable=True),
        sa.Column("default_max_wall_time_s", sa.BigInteger(), nullable=True),
        sa.Column("max_wall_time_cap_s", sa.BigInteger(), nullable=True),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("roles", sa.JSON(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("revoked_at", Timestamp, nullable=True),
    )
    from datetime import datetime, timezone

    op.bulk_insert(projects, [{"name": "default", "created_at": datetime.now(timezone.utc)}])
    # Plain ADD COLUMN with a server default, never a batch rebuild (see 0003): existing rows
    # land in the default project.
    for table in ("runs", "sweeps"):
        op.add_column(table, sa.Column("project", sa.String(64), nullable=False, server_default="default"))
        op.create_index(f"ix_{table}_project", table, ["project"])


def downgrade() -> None:
    for table in ("runs", "sweeps"):
        op.drop_index(f"ix_{table}_project", table)
        op.drop_column(table, "project")
    op.drop_table("api_keys")
    op.drop_table("projects")
