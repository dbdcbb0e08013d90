"""Migration 0009 (an Idempotency-Key on sweeps): sweeps stored before it keep no key and do not
collide in the unique index, a keyed submit after it is made once, and it goes back down."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import inspect, text

from api.sweeps import SweepSpec
from service.db.engine import migrate
from service.repository import Repository
from service.sweep_repository import SweepRepository
from tests.service.test_migration_0003 import _to, engine_at_0002  # noqa: F401  (fixture)


def _insert_old_sweep(engine, sweep_id: str, spec: dict) -> None:
    now = datetime(2026, 11, 1, tzinfo=timezone.utc).replace(tzinfo=None)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO sweeps (id, project, name, status, attempt, spec, driver, skipped, "
                          "created_at, updated_at) VALUES (:id, 'default', 'old', 'COMPLETED', 1, :spec, "
                          "'service', '[]', :now, :now)"), {"id": sweep_id, "spec": SweepSpec.model_validate(spec)
                                                           .model_dump_json(), "now": now})


def test_0009_keeps_old_sweeps_without_a_key_and_makes_a_keyed_sweep_once(engine_at_0002, sweep_body):
    _to(engine_at_0002, "0008")
    _insert_old_sweep(engine_at_0002, "oldsweep1", sweep_body)
    _insert_old_sweep(engine_at_0002, "oldsweep2", sweep_body)  # two NULL keys in one project
    migrate(engine_at_0002)
    sweeps = SweepRepository(Repository(engine_at_0002))
    assert sweeps.get_sweep("oldsweep1").status.value == "COMPLETED"
    spec = SweepSpec.model_validate(sweep_body)
    made, created = sweeps.create_sweep_once(spec, driver="service", token=None, project="default",
                                             idempotency_key="k")
    again, created_again = sweeps.create_sweep_once(spec, driver="service", token=None, project="default",
                                                    idempotency_key="k")
    assert (created, created_again, again.id) == (True, False, made.id)

    _to(engine_at_0002, "0008", down=True)
    assert "idempotency_key" not in {c["name"] for c in inspect(engine_at_0002).get_columns("sweeps")}
    migrate(engine_at_0002)
    assert sweeps.get_sweep(made.id).id == made.id
