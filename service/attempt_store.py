"""What runs and sweeps store alike: one Ray job and one bearer token per attempt.

``Repository`` (runs) and ``SweepRepository`` (sweeps) are ``AttemptStore``s; these are the
reads and writes the job follower makes (``with_status``, ``begin_attempt``, and ``transition``
as a compare-and-set) and the token check of the report endpoints, written once for both.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, ClassVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.session import Database, is_possible_id
from service.lifecycle import TransitionTable
from service.tokens import hash_token, token_matches


class AttemptStore:
    """Subclasses set the class attributes and implement ``_apply_status`` and ``_to_record``."""

    db: Database
    model: ClassVar[type]  # the ORM row: Run or Sweep
    status: ClassVar[type[enum.Enum]]  # RunStatus or SweepStatus
    not_found: ClassVar[type[Exception]]  # raised with the id of a record that does not exist
    transitions: ClassVar[TransitionTable]
    job_prefix: ClassVar[str]  # "run" | "sweep", the start of each attempt's Ray submission id

    def _apply_status(self, session: Session, row: Any, target: enum.Enum, *, message: str | None,
                      error: str | None) -> None:
        raise NotImplementedError

    def _to_record(self, row: Any) -> Any:
        raise NotImplementedError

    def get(self, record_id: str) -> Any:
        """The record with this id; raises ``not_found`` if there is none."""
        with self.db.read() as session:
            row = session.get(self.model, record_id) if is_possible_id(record_id) else None
            if row is None:
                raise self.not_found(record_id)
            return self._to_record(row)

    def with_status(self, statuses: Iterable[enum.Enum]) -> list[Any]:
        """Every record in one of ``statuses``, oldest first (the dispatcher's fair order)."""
        query = (select(self.model).where(self.model.status.in_([s.value for s in statuses]))
                 .order_by(self.model.created_at, self.model.id))
        with self.db.read() as session:
            return [self._to_record(row) for row in session.execute(query).scalars()]

    def transition(self, record_id: str, to_status: enum.Enum, *, message: str | None = None,
                   error: str | None = None, only_from: Iterable[enum.Enum] | None = None,
                   attempt: int | None = None) -> Any:
        """Change the record's status through its transition table and record why.

        ``only_from`` and ``attempt`` make it a compare-and-set for loops that decided on an
        older snapshot: if the record has moved on since, ``IllegalTransition`` is raised instead.
        """
        with self.db.locked_write(self.model, record_id, self.not_found) as (session, row):
            current = self.status(row.status)
            self.transitions.require_snapshot(record_id, current, to_status, stored_attempt=row.attempt,
                                              only_from=only_from, attempt=attempt)
            self._apply_status(session, row, to_status, message=message, error=error)
            session.flush()
            return self._to_record(row)

    def begin_attempt(self, record_id: str, *, token: str, message: str | None = None) -> Any:
        """QUEUED → STARTING for the current attempt: store the token's hash and the Ray job id."""
        with self.db.locked_write(self.model, record_id, self.not_found) as (session, row):
            self._apply_status(session, row, self.status.STARTING, message=message, error=None)
            row.token_hash = hash_token(token)
            row.ray_job_id = attempt_job_id(self.job_prefix, row.id, row.attempt)
            session.flush()
            return self._to_record(row)

    def check_token(self, record_id: str, token: str) -> bool:
        """Whether ``token`` is the current attempt's token; False for unknown records."""
        stored = None
        if is_possible_id(record_id):
            with self.db.read() as session:
                query = select(self.model.token_hash).where(self.model.id == record_id)
                stored = session.execute(query).scalar_one_or_none()
        return token_matches(token, stored)


def attempt_job_id(prefix: str, record_id: str, attempt: int) -> str:
    """Ray submission id of one attempt (``run-{id}-attempt-{n}``, ``sweep-{id}-attempt-{n}``).
    Ray refuses a second job with the same id, which is what guarantees that an attempt never
    runs twice; trial runs carry their driver's as their ``ray_job_id``."""
    return f"{prefix}-{record_id}-attempt-{attempt}"
