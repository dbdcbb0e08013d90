"""Migration 0004 (projects and keys): existing runs and sweeps land in the `default` project,
on SQLite and PostgreSQL, and nothing that hangs off runs is lost."""

from __future__ import annotations

from sqlalchemy import inspect

from service.access import AccessStore
from service.db.engine import migrate
from service.repository import Repository
from tests.service.test_migration_0003 import _insert_old_run, _to, engine_at_0002  # noqa: F401  (fixture)


def test_0004_moves_existing_runs_into_the_default_project(engine_at_0002, example_spec):
    _to(engine_at_0002, "0003")
    _insert_old_run(engine_at_0002, "oldrun", example_spec.model_dump(mode="json"))
    migrate(engine_at_0002)

    inspector = inspect(engine_at_0002)
    assert {"projects", "api_keys"} <= set(inspector.get_table_names())
    assert "project" in {c["name"] for c in inspector.get_columns("sweeps")}
    repo = Repository(engine_at_0002)
    old = repo.get_run("oldrun")
    assert old.project == "default" and repo.count_metrics("oldrun") == 4 and len(repo.events("oldrun")) == 1
    assert [p.name for p in AccessStore(repo.db).list_projects()] == ["default"]
    assert [r.id for r in repo.list_runs(projects=["default"])[0]] == ["oldrun"]
    assert repo.list_runs(projects=["elsewhere"])[0] == []

    _to(engine_at_0002, "0003", down=True)  # and back
    assert "projects" not in inspect(engine_at_0002).get_table_names()
    migrate(engine_at_0002)
    assert repo.get_run("oldrun").project == "default"
