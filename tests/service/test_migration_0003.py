"""Migration 0003 (sweeps) upgrades a database that already holds runs, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, text

from service.db.engine import MIGRATIONS_DIR, make_engine, migrate
from service.repository import Repository
from tests.conftest import fresh_postgres_database


def _to(engine, revision: str, *, down: bool = False) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        (command.downgrade if down else command.upgrade)(config, revision)


@pytest.fixture(params=["sqlite", "postgresql"])
def engine_at_0002(request, tmp_path):
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path}/old.db")
        _to(engine, "0002")
        yield engine
        engine.dispose()
        return
    with fresh_postgres_database("tessera_mig") as url:
        engine = make_engine(url)
        try:
            _to(engine, "0002")
            yield engine
        finally:
            engine.dispose()


def _insert_old_run(engine, run_id: str, spec: dict) -> None:
    now = datetime(2026, 11, 1, tzinfo=timezone.utc).replace(tzinfo=None)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO runs (id, name, status, attempt, spec, summary, tags, created_at, updated_at) "
                          "VALUES (:id, 'old', 'COMPLETED', 1, :spec, :summary, '[]', :now, :now)"),
                     {"id": run_id, "spec": json.dumps(spec),
                      "summary": '{"eval/loss": 0.9}', "now": now})
        conn.execute(text("INSERT INTO run_events (run_id, to_status, attempt, time) VALUES (:r, 'QUEUED', 1, :t)"),
                     {"r": run_id, "t": now})
        for step, (key, value) in enumerate([("eval/loss", 2.0), ("eval/loss", 0.5), ("eval/loss", 0.9),
                                             ("eval/accuracy", 0.7)]):
            conn.execute(text("INSERT INTO metrics (run_id, step, key, value, time) VALUES (:r, :s, :k, :v, :t)"),
                         {"r": run_id, "s": step, "k": key, "v": value, "t": now})


def test_0003_upgrades_a_0002_database_with_runs_and_backfills_their_best_values(engine_at_0002, example_spec):
    spec = example_spec.model_dump(mode="json")
    _insert_old_run(engine_at_0002, "oldrun", spec)
    _insert_old_run(engine_at_0002, "other", spec)
    migrate(engine_at_0002)

    inspector = inspect(engine_at_0002)
    assert {"trial_id", "trial_params", "extrema"} <= {c["name"] for c in inspector.get_columns("runs")}
    assert "sweeps" in inspector.get_table_names()
    unique = [i for i in inspector.get_indexes("runs") if i["name"] == "uq_runs_sweep_id_trial_id"]
    assert unique and unique[0]["unique"] and unique[0]["column_names"] == ["sweep_id", "trial_id"]

    repo = Repository(engine_at_0002)
    old = repo.get_run("oldrun")
    assert (old.trial_id, old.trial_params, old.sweep_id) == (None, None, None)
    assert old.extrema == {"eval/loss": [0.5, 2.0], "eval/accuracy": [0.7, 0.7]}
    assert old.to_view().best == {"eval/loss": 0.5, "eval/accuracy": 0.7}
    # Nothing that hangs off runs is lost (a table rebuild on SQLite would cascade-delete it).
    assert len(repo.events("oldrun")) == 1 and repo.count_metrics("oldrun") == 4
    fresh = repo.create_run(example_spec)
    assert repo.get_run(fresh.id).extrema == {}

    _to(engine_at_0002, "0002", down=True)  # and back: the downgrade is clean too
    assert "sweeps" not in inspect(engine_at_0002).get_table_names()
    migrate(engine_at_0002)
    assert repo.get_run("oldrun").extrema["eval/loss"] == [0.5, 2.0] and repo.count_metrics("oldrun") == 4
