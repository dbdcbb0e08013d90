"""On PostgreSQL a migration that must lock a table another session's transaction uses gives way
(``lock_timeout``), says who holds a transaction open, and tries again; it neither stalls the
table's queries behind it for as long as that transaction lasts nor leaves the schema half-done.
Migration 0010 (``DROP INDEX`` on ``metrics``) is the one that locks here."""

from __future__ import annotations

import logging
import threading

import pytest
from sqlalchemy import inspect, text

from service.db.engine import make_engine, migrate
from tests.conftest import fresh_postgres_database
from tests.service.test_migration_0003 import _to


@pytest.fixture
def engine_at_0009():
    with fresh_postgres_database("tessera_lock") as url:
        engine = make_engine(url)
        try:
            _to(engine, "0009")
            yield engine
        finally:
            engine.dispose()


def _holding_metrics(engine):
    """A session (named ``reader``) whose open transaction has read ``metrics``: it holds a lock
    that ``DROP INDEX`` on the table must wait for."""
    connection = engine.connect()
    connection.exec_driver_sql("SET application_name = 'reader'")
    connection.execute(text("SELECT count(*) FROM metrics"))
    pid = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
    return connection, pid


def _revision(engine) -> str:
    with engine.connect() as connection:
        return connection.execute(text("SELECT version_num FROM alembic_version")).scalar_one()


class _Warnings(logging.Handler):
    """The engine's warnings, and an event set at the first."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.first = threading.Event()

    def emit(self, record):
        self.messages.append(record.getMessage())
        self.first.set()


def test_a_migration_gives_way_to_an_open_transaction_names_it_and_goes_on_once_it_ends(engine_at_0009):
    reader, pid = _holding_metrics(engine_at_0009)
    warnings = _Warnings()
    logger = logging.getLogger("service.db.engine")
    logger.addHandler(warnings)
    failures: list[BaseException] = []

    def run():
        try:
            migrate(engine_at_0009, lock_timeout_s=0.2, patience_s=60)
        except BaseException as exc:  # noqa: BLE001  (asserted below)
            failures.append(exc)

    migration = threading.Thread(target=run)
    try:
        migration.start()
        assert warnings.first.wait(30), "the migration never gave way to the open transaction"
        assert f"pid {pid} (reader, idle in transaction" in warnings.messages[0]
        with engine_at_0009.connect() as other:  # the table stays readable while the migration waits
            assert other.execute(text("SELECT count(*) FROM metrics")).scalar_one() == 0
        assert _revision(engine_at_0009) == "0009"  # each try rolled back whole
    finally:
        reader.close()  # ends the transaction
        migration.join(60)
        logger.removeHandler(warnings)
    assert not migration.is_alive() and not failures
    assert _revision(engine_at_0009) != "0009"
    assert "ix_metrics_run_id" not in {i["name"] for i in inspect(engine_at_0009).get_indexes("metrics")}


def test_a_migration_that_runs_out_of_patience_raises_naming_the_transaction_and_leaves_the_schema_as_it_was(
        engine_at_0009):
    reader, pid = _holding_metrics(engine_at_0009)
    try:
        with pytest.raises(RuntimeError, match=rf"could not lock a table for 0 s; .*pid {pid} \(reader, idle in "
                                               r"transaction.*start the service again"):
            migrate(engine_at_0009, lock_timeout_s=0.1, patience_s=0)
    finally:
        reader.close()
    assert _revision(engine_at_0009) == "0009"
    assert "ix_metrics_run_id" in {i["name"] for i in inspect(engine_at_0009).get_indexes("metrics")}
