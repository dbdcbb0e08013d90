"""The service's PostgreSQL connections plan every statement for its own values.

psycopg prepares a statement once a connection has run it 5 times, and after 5 plans of it for
its values PostgreSQL may plan it once for any values (a generic plan), which cannot know which
run a metrics read is for (``service.db.engine.plan_each_statement``; measured by
``bench/metric_reads.py``). Counted here by PostgreSQL itself (``pg_prepared_statements``)."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import text

from api.views import ReportedMetric
from service.db.engine import make_engine, migrate
from service.db.models import Run
from service.repository import Repository
from tests.conftest import fresh_postgres_database


def test_a_metrics_read_run_twelve_times_on_one_connection_is_planned_for_its_run_each_time(example_spec):
    with fresh_postgres_database("tessera_plans") as url:
        engine = make_engine(url)
        try:
            migrate(engine)
            plans = _plans_of_a_read_run_twelve_times(engine, example_spec)
        finally:
            engine.dispose()
    # PostgreSQL's default (plan_cache_mode = auto) gives 2 generic and 5 custom plans here.
    assert plans and all(generic == 0 and custom == 7 for generic, custom in plans), plans


def _plans_of_a_read_run_twelve_times(engine, example_spec) -> list[tuple[int, int]]:
    """PostgreSQL's count of generic and custom plans of the read's prepared statement."""
    repo = Repository(engine)
    now = datetime.now(timezone.utc)
    runs = [repo.create_run(example_spec).id for _ in range(10)]
    with engine.begin() as conn:
        conn.execute(Run.__table__.update().values(status="RUNNING"))
    for run_id in runs:
        repo.add_metrics(run_id, [ReportedMetric(step=i, key="train/loss", value=1.0, time=now) for i in range(500)])
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE metrics"))
    engine.pool.dispose()  # one connection from here on, which runs the read every time
    for _ in range(12):
        rows, _ = repo.metric_rows_after(runs[-1], 0, 100)
        assert len(rows) == 100
    with engine.connect() as conn:
        return conn.execute(text("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement "
                                 "LIKE '%FROM metrics%' AND statement LIKE '%ORDER BY metrics.seq%'")).all()
