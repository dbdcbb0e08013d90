"""Migration 0006 (outage-safe reports): old points survive as live points of no known attempt,
old runs have no final-checkpoint word, and the migration goes back down."""

from __future__ import annotations

from sqlalchemy import inspect

from service.db.engine import migrate
from service.repository import Repository
from tests.service.test_migration_0003 import _insert_old_run, _to, engine_at_0002  # noqa: F401  (fixture)


def test_0006_keeps_old_points_live_and_downgrades(engine_at_0002, example_spec):
    _to(engine_at_0002, "0005")
    _insert_old_run(engine_at_0002, "oldrun", example_spec.model_dump(mode="json"))
    migrate(engine_at_0002)

    repo = Repository(engine_at_0002)
    points, _ = repo.metrics_after("oldrun")
    assert [(p.step, p.attempt, p.superseded) for p in points] == [(0, None, False), (1, None, False),
                                                                   (2, None, False), (3, None, False)]
    assert repo.get_run("oldrun").final_checkpoint is None

    _to(engine_at_0002, "0005", down=True)
    assert "superseded" not in {c["name"] for c in inspect(engine_at_0002).get_columns("metrics")}
    assert "final_checkpoint" not in {c["name"] for c in inspect(engine_at_0002).get_columns("runs")}
    migrate(engine_at_0002)
    assert len(Repository(engine_at_0002).metrics_after("oldrun")[0]) == 4
