"""Migration 0005 (lineage and housekeeping): old runs keep everything, their metric extrema
are copied into ``run_bests`` so they sort by best value, and the migration goes back down."""

from __future__ import annotations

from sqlalchemy import inspect, text

from service.db.engine import migrate
from service.repository import Repository
from tests.service.test_migration_0003 import _insert_old_run, _to, engine_at_0002  # noqa: F401  (fixture)


def test_0005_copies_old_runs_extrema_and_downgrades(engine_at_0002, example_spec):
    _to(engine_at_0002, "0004")
    _insert_old_run(engine_at_0002, "oldrun", example_spec.model_dump(mode="json"))
    with engine_at_0002.begin() as conn:
        conn.execute(text("UPDATE runs SET extrema = :e WHERE id = 'oldrun'"),
                     {"e": '{"eval/accuracy": [0.25, 0.75]}'})
    migrate(engine_at_0002)

    inspector = inspect(engine_at_0002)
    assert {"parent_id", "fork", "notes", "archived_at", "idempotency_key"} <= {
        c["name"] for c in inspector.get_columns("runs")}
    with engine_at_0002.connect() as conn:
        bests = conn.execute(text("SELECT run_id, key, min_value, max_value FROM run_bests")).all()
    assert [tuple(b) for b in bests] == [("oldrun", "eval/accuracy", 0.25, 0.75)]
    old = Repository(engine_at_0002).get_run("oldrun")
    assert old.extrema == {"eval/accuracy": [0.25, 0.75]}

    _to(engine_at_0002, "0004", down=True)
    assert "run_bests" not in inspect(engine_at_0002).get_table_names()
    assert "parent_id" not in {c["name"] for c in inspect(engine_at_0002).get_columns("runs")}
    migrate(engine_at_0002)
    assert Repository(engine_at_0002).get_run("oldrun").summary is not None
