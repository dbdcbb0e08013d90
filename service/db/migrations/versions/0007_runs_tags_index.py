"""An index for ``GET /runs?tag=`` on PostgreSQL.

``runs.tags`` is a JSON array. Without an index, a tag few runs carry makes the list walk the
newest-first index through most of the table (98 ms p50 / 185 ms p99 at 100k runs for a tag on
0.1% of them, ``bench/run_list.py``). A GIN index on ``tags::jsonb`` answers the containment
test ``(tags::jsonb) @> '["tag"]'`` that ``service.run_listing`` sends on PostgreSQL. SQLite (the
embedded default) has no such index type and keeps the ``json_each`` scan.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE INDEX ix_runs_tags_gin ON runs USING gin ((tags::jsonb))")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX ix_runs_tags_gin")
