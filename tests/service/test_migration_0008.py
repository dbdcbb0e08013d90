"""Migration 0008 (a per-run count of metric points): an old run's points are counted once, new
reports add to the count, the point budget reads it, and the migration goes back down."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import inspect, select

from api.views import ReportedMetric
from service.db.engine import migrate
from service.db.models import Run
from service.metric_limits import MetricLimitExceeded, MetricLimits
from service.repository import Repository
from tests.service.test_migration_0003 import _insert_old_run, _to, engine_at_0002  # noqa: F401  (fixture)


def _stored_count(engine, run_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(select(Run.metric_points).where(Run.id == run_id)).scalar_one()


def test_0008_counts_old_points_then_new_reports_and_the_budget_reads_the_count(engine_at_0002, example_spec):
    _to(engine_at_0002, "0007")
    _insert_old_run(engine_at_0002, "oldrun", example_spec.model_dump(mode="json"))
    migrate(engine_at_0002)
    assert _stored_count(engine_at_0002, "oldrun") == 4  # the four points stored before 0008

    repo = Repository(engine_at_0002)
    with engine_at_0002.begin() as conn:  # still running, so it may report
        conn.execute(Run.__table__.update().where(Run.id == "oldrun").values(status="RUNNING"))
    now = datetime.now(timezone.utc)
    points = [ReportedMetric(step=10 + i, key="eval/loss", value=1.0, time=now) for i in range(3)]
    limits = MetricLimits(max_keys=100, max_points_per_report=100, max_points=8)
    assert repo.add_metrics("oldrun", points, limits) == 3
    assert _stored_count(engine_at_0002, "oldrun") == 7 == repo.count_metrics("oldrun")
    with pytest.raises(MetricLimitExceeded, match="budget of 8 metric points"):
        repo.add_metrics("oldrun", points[:2], limits)  # 7 + 2 > 8
    assert _stored_count(engine_at_0002, "oldrun") == 7

    _to(engine_at_0002, "0007", down=True)
    assert "metric_points" not in {c["name"] for c in inspect(engine_at_0002).get_columns("runs")}
    migrate(engine_at_0002)
    assert _stored_count(engine_at_0002, "oldrun") == 7
