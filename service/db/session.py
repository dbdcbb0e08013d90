"""Sessions for the repositories: plain reads, and writes that lock the row they change.

Every write runs in one transaction that first locks the row it changes (``SELECT ... FOR
UPDATE`` on PostgreSQL; on SQLite the write session's ``BEGIN IMMEDIATE`` takes the database's
write lock, see ``service.db.engine``), so two writers of the same run or sweep (a worker's
report, a user's cancel, the dispatcher) are serialized, and the state machine always decides
on the status that is really stored.

Reads on PostgreSQL run in autocommit: each statement is its own transaction. At READ
COMMITTED, the isolation the engine asks for (``service.db.engine``), every statement of a
transaction already sees its own snapshot, so a read session's statements see what they saw
before; what goes is the ``BEGIN`` before the first and the ``ROLLBACK`` at the end, two of a
lone read's four round trips (the pool's ping and the query stay). A read session must only
read: on PostgreSQL whatever it wrote would be committed at once. On SQLite a read keeps its
``BEGIN`` (``service.db.engine``): a local call, and one snapshot for all its statements in WAL
mode.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from service.db.engine import WRITE_OPTIONS

Row = TypeVar("Row")


class Database:
    """Read and write sessions over one SQLAlchemy engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        # On PostgreSQL, the same pool in autocommit; a connection is taken at a read's first
        # statement, as for any session. On SQLite a read is a plain session.
        self._reads = (sessionmaker(engine.execution_options(isolation_level="AUTOCOMMIT"), expire_on_commit=False)
                       if engine.dialect.name == "postgresql" else self._sessions)

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for queries only (on PostgreSQL each statement runs on its own: see the
        module docstring)."""
        with self._reads() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session whose transaction is a writer's from its first statement, committed on exit
        (rolled back if the block raises)."""
        with self._sessions() as session:
            session.connection(execution_options=WRITE_OPTIONS)
            yield session
            session.commit()

    @contextmanager
    def locked_write(self, model: type[Row], row_id: str,
                     not_found: Callable[[str], Exception]) -> Iterator[tuple[Session, Row]]:
        """A ``write`` session and ``model``'s row ``row_id``, locked until it commits; raises
        ``not_found(row_id)`` when there is no such row."""
        with self.write() as session:
            row = lock_row(session, model, row_id)
            if row is None:
                raise not_found(row_id)
            yield session, row


def lock_row(session: Session, model: type[Row], row_id: str) -> Row | None:
    """``model``'s row ``row_id``, locked until the transaction ends; None if there is none."""
    if not is_possible_id(row_id):
        return None
    return session.execute(select(model).where(model.id == row_id).with_for_update()).scalar_one_or_none()


def is_possible_id(row_id: str) -> bool:
    """Whether ``row_id`` could name a row. PostgreSQL refuses NUL characters in text parameters
    with an error, and neither driver can send a lone surrogate (``"\\ud800"`` in a cursor's
    JSON); such an id (from a URL or a cursor) names nothing and must read as "not found", not
    crash the request. Neither is printable."""
    return 0 < len(row_id) <= 64 and row_id.isprintable()


def clean_text(text: str | None) -> str | None:
    """Client-supplied text without NUL characters, which PostgreSQL cannot store."""
    return text.replace("\x00", "") if text is not None else None


def new_id() -> str:
    """A fresh id for a run or a sweep."""
    return secrets.token_hex(6)
