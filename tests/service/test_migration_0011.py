"""Migration 0011 (why a FAILED run failed, ``runs.failure``): a run that failed before it reads
as not known (the dashboard then still reads its error's text), a run failing after it keeps
what its worker said, and it goes back down."""

from __future__ import annotations

from sqlalchemy import inspect, text

from api.views import RunStatus
from service.db.engine import migrate
from service.repository import Repository
from tests.service.test_migration_0003 import _insert_old_run, _to, engine_at_0002  # noqa: F401  (fixture)


def test_0011_leaves_old_failures_unknown_and_keeps_new_ones(engine_at_0002, example_spec):
    _to(engine_at_0002, "0010")
    _insert_old_run(engine_at_0002, "oldrun", example_spec.model_dump(mode="json"))
    _insert_old_run(engine_at_0002, "newrun", example_spec.model_dump(mode="json"))
    with engine_at_0002.begin() as conn:
        conn.execute(text("UPDATE runs SET status = 'FAILED', error = 'NodeDiedError: node died' WHERE id = 'oldrun'"))
        conn.execute(text("UPDATE runs SET status = 'RUNNING' WHERE id = 'newrun'"))
    migrate(engine_at_0002)

    repo = Repository(engine_at_0002)
    old = repo.get_run("oldrun").to_view()
    assert (old.status, old.error, old.failure) == (RunStatus.FAILED, "NodeDiedError: node died", None)
    repo.apply_worker_report("newrun", RunStatus.FAILED, error="WorkerHealthCheckFailedError: lost", failure="machine")
    assert repo.get_run("newrun").to_view().failure == "machine"

    _to(engine_at_0002, "0010", down=True)
    assert "failure" not in {c["name"] for c in inspect(engine_at_0002).get_columns("runs")}
    migrate(engine_at_0002)
    assert repo.get_run("newrun").failure is None  # what went down with the column is not made up
