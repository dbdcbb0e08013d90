"""Migration 0010 (one index on a run's metric points): ``ix_metrics_run_id`` goes and
``ix_metrics_run_id_seq`` stays, a run's points stored before it stay readable, by key too, and
go with their run, and it goes back down. What it does to reads and writes is measured by
``bench/metric_reads.py``, not here: a plan depends on the data's size."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import inspect, text

from api.views import ReportedMetric
from service.db.engine import migrate
from service.db.models import Run
from service.repository import Repository
from tests.service.test_migration_0003 import _insert_old_run, _to, engine_at_0002  # noqa: F401  (fixture)


def _metric_indexes(engine) -> dict[str, list[str]]:
    return {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("metrics")}


def test_0010_leaves_one_index_by_run_and_the_points_read_and_go_as_before(engine_at_0002, example_spec):
    _to(engine_at_0002, "0009")
    _insert_old_run(engine_at_0002, "oldrun", example_spec.model_dump(mode="json"))
    assert set(_metric_indexes(engine_at_0002)) == {"ix_metrics_run_id", "ix_metrics_run_id_seq"}
    migrate(engine_at_0002)
    assert _metric_indexes(engine_at_0002) == {"ix_metrics_run_id_seq": ["run_id", "seq"]}

    repo = Repository(engine_at_0002)
    with engine_at_0002.begin() as conn:  # still running, so it may report
        conn.execute(Run.__table__.update().where(Run.id == "oldrun").values(status="RUNNING"))
    now = datetime.now(timezone.utc)
    repo.add_metrics("oldrun", [ReportedMetric(step=100 + i, key=("train/loss", "lr")[i % 2], value=float(i),
                                               time=now) for i in range(10)])
    rows, _ = repo.metric_rows_after("oldrun", key="lr")
    assert [(row["step"], row["value"]) for row in rows] == [(101 + i, 1.0 + i) for i in range(0, 10, 2)]
    assert repo.count_metrics("oldrun") == 14  # the four points stored before 0010 too

    _to(engine_at_0002, "0009", down=True)
    assert _metric_indexes(engine_at_0002)["ix_metrics_run_id"] == ["run_id"]
    migrate(engine_at_0002)
    with engine_at_0002.begin() as conn:  # the foreign key's cascade still takes the run's points
        conn.execute(text("DELETE FROM runs WHERE id = 'oldrun'"))
    assert repo.count_metrics("oldrun") == 0
