"""Engine construction and schema migration for SQLite and PostgreSQL.

SQLite needs three things to behave under a web server plus a dispatcher thread: WAL (readers
don't block the writer), a busy timeout (writers wait instead of failing), and transactions
that really begin where SQLAlchemy says they do. Python's sqlite3 module defers BEGIN until
the first INSERT/UPDATE, so a read-decide-write sequence would read outside the transaction
and race. We emit BEGIN ourselves, and BEGIN IMMEDIATE (take the write lock up front) for
sessions marked as writers; see ``WRITE_OPTIONS``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import random
import re
import time
from pathlib import Path
from typing import Any

import orjson
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# Execution options of a write session; on SQLite they turn its BEGIN into BEGIN IMMEDIATE.
WRITE_OPTIONS = {"tessera_write": True}
# PostgreSQL connections a process keeps open, and how many more it may open for a while.
POOL_SIZE, POOL_OVERFLOW = 10, 5
# On PostgreSQL, how long a migration's statement waits for a table lock before the migration gives
# way (rolls back) and tries again, and for how long in all it tries. See ``migrate``.
MIGRATION_LOCK_TIMEOUT_S, MIGRATION_LOCK_PATIENCE_S = 5.0, 600.0
# SQLSTATE 55P03 (lock_not_available): what PostgreSQL answers when ``lock_timeout`` ran out.
_LOCK_NOT_AVAILABLE = "55P03"


# A run of 19 or more digits: where an integer may lie beyond 64 bits, which orjson reads as a
# float. Such a text goes to ``json.loads``. (Floats, whatever their number of digits, orjson
# reads as ``json.loads`` does: tests/service/test_json_columns.py.)
_LONG_NUMBER_TEXT, _LONG_NUMBER_BYTES = re.compile(r"\d{19}"), re.compile(rb"\d{19}")


def json_loads(text: str | bytes) -> Any:
    """A JSON column's value, as ``json.loads`` reads it, in about a third of the time.

    ``GET /runs?limit=50`` decodes four JSON columns a run (spec, summary, tags, best values),
    and ``json.loads`` was the largest single item in a py-spy profile of that route (1,000
    runs on PostgreSQL). What orjson refuses and the standard library reads (``NaN`` and
    ``Infinity``, which ``json.dumps`` writes into SQLite; lone surrogates; ``1e400``) and any
    long run of digits (``_LONG_NUMBER_*``) go to ``json.loads``, so no value reads
    differently. The API refuses integers beyond 64 bits (``service/limits.py``); the guard
    keeps a read exact whatever wrote the row. PostgreSQL hands it bytes (psycopg's loader),
    SQLite a str."""
    if not isinstance(text, (str, bytes)):
        text = bytes(text)  # a memoryview (json.loads takes none) or a bytearray
    if (_LONG_NUMBER_TEXT if isinstance(text, str) else _LONG_NUMBER_BYTES).search(text) is None:
        with contextlib.suppress(orjson.JSONDecodeError):  # refused: json.loads reads it below
            return orjson.loads(text)
    return json.loads(text)


def plan_each_statement(dbapi_connection, _record) -> None:
    """Plan every statement for its own values (``plan_cache_mode = force_custom_plan``).

    psycopg prepares a statement on the server once a connection has run it 5 times, and after 5
    plans of a prepared statement for its values PostgreSQL may plan it once for any values (a
    generic plan) when that plan's estimate is no dearer. A run's metric points are a few of the
    table's, but a generic plan cannot know which run or key: for ``GET /runs/{id}/metrics?key=``
    it walked the primary key from ``after`` and dropped other runs' points (a key's first page of
    a long run 0.04-0.12x the time with this; ``bench/metric_reads.py``). A prepared statement
    still saves the parse; only the plan is redone.
    PostgreSQL has the setting from version 12."""
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_custom_plan")
    dbapi_connection.commit()


def make_engine(database_url: str) -> Engine:
    """An engine for ``database_url`` (``sqlite:///path`` or ``postgresql+psycopg://...``)."""
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite":
        # At most 15 connections a process, as with SQLAlchemy's defaults (5 kept, 10 more on
        # demand), but 10 of them kept: a connection above those kept is opened for one request
        # and closed after it, which under a burst of submits cost a connect (and a PostgreSQL
        # backend) per request.
        # READ COMMITTED whatever the server's default: reads run in autocommit on the grounds that
        # a transaction's statements would each see their own snapshot anyway (service.db.session).
        engine = create_engine(url, pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW,
                               isolation_level="READ COMMITTED", json_deserializer=json_loads)
        event.listen(engine, "connect", plan_each_statement)
        return engine

    if url.database and url.database != ":memory:":
        Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, json_deserializer=json_loads)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see module docstring)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection):
        write = connection.get_execution_options().get("tessera_write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def migrate(engine: Engine, *, lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S,
            patience_s: float = MIGRATION_LOCK_PATIENCE_S) -> None:
    """Bring the schema to the newest Alembic revision (no-op when it is current).

    On PostgreSQL the migrations run with ``lock_timeout``: a statement that must lock a table
    (``DROP INDEX``, ``ALTER TABLE``) queues behind any session whose transaction uses it, and
    while it waits every later query of that table queues behind it. During a rolling upgrade
    the old replica still serves, so a long transaction of its (an export, a stuck session)
    would stall the whole API. Instead the migration gives way after ``lock_timeout_s``, rolls
    back (PostgreSQL's DDL is transactional: nothing is half-done), logs the sessions that hold
    transactions open, and tries again after a pause that grows (``_pause_s``), so the table's
    queries wait at most ``lock_timeout_s`` at a time and run freely between tries; after
    ``patience_s`` in all it raises, naming those sessions."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    postgres = engine.dialect.name == "postgresql"
    deadline = time.monotonic() + patience_s
    for tries in itertools.count(1):
        try:
            with engine.begin() as connection:
                if postgres:  # at least 1 ms: 0 would mean no limit
                    connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{max(1, round(lock_timeout_s * 1000))}ms'")
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
            return
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                raise
            holders = _open_transactions(engine)
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the database migration could not lock a table for {patience_s:.0f} s; sessions "
                                   f"with a transaction open: {holders or 'none now'}. End them (or wait for "
                                   "them) and start the service again") from exc
            pause = min(_pause_s(lock_timeout_s, tries), max(0.0, deadline - time.monotonic()))
            log.warning("the database migration waits for a table lock (another session's transaction uses the "
                        "table) and tries again in %.1f s; sessions with a transaction open: %s", pause,
                        holders or "none now")
            time.sleep(pause)


def _pause_s(lock_timeout_s: float, tries: int) -> float:
    """How long a migration that gave way ``tries`` times waits before its next try: twice its
    lock wait, doubling each time up to 30 s, with up to a quarter more at random (two replicas
    starting together do not try in step)."""
    pause = min(30.0, 2 * lock_timeout_s * 2 ** (tries - 1))
    return pause * (1 + random.random() / 4)


def _open_transactions(engine: Engine) -> str:
    """The other sessions of this database with a transaction open, oldest first: where a lock
    a migration waited for is held. For its log line only."""
    with engine.connect() as connection:
        rows = connection.execute(text(
            "SELECT pid, application_name, state, extract(epoch FROM now() - xact_start) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL "
            "ORDER BY xact_start LIMIT 5")).all()
    return "; ".join(f"pid {pid} ({name or 'no application_name'}, {state}, transaction open {age:.0f} s)"
                     for pid, name, state, age in rows)
