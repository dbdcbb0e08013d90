"""What runs and sweeps store alike: one Ray job and one bearer token per attempt.

``Repository`` (runs) and ``SweepRepository`` (sweeps) are ``AttemptStore``s; these are the
reads and writes the job follower makes (``snapshots``, ``begin_attempts``, and ``transition``
as a compare-and-set) and the token check of the report endpoints, written once for both.
"""

from __future__ import annotations

import enum
import functools
import logging
import re
from collections import namedtuple
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import select
from sqlalchemy.orm import load_only

from service.db.session import Database, is_possible_id
from service.lifecycle import IllegalTransition, TransitionTable
from service.tokens import hash_token, token_matches

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredKind:
    """How one kind of record is stored: its row, status enum, errors and status writer."""

    model: type  # the ORM row: Run or Sweep
    status: type[enum.Enum]  # RunStatus or SweepStatus
    not_found: type[Exception]  # raised with the id of a record that does not exist
    transitions: TransitionTable
    job_prefix: str  # "run" | "sweep", the start of each attempt's Ray submission id
    record: Any  # RunRecord or SweepRecord: ``record.from_row(row)`` is what callers get
    # What a dispatcher tick reads of each record (``AttemptStore.snapshots``): a dataclass whose
    # every field is a column of ``model`` by the same name, with ``from_row``.
    snapshot: Any
    apply_status: Callable[..., None]  # apply_run_status or apply_sweep_status on a locked row


class AttemptStore:
    """A repository whose subclass says how its records are stored, in ``stored``."""

    db: Database
    stored: ClassVar[StoredKind]

    def get(self, record_id: str) -> Any:
        """The record with this id; raises ``not_found`` if there is none."""
        with self.db.read() as session:
            row = session.get(self.stored.model, record_id) if is_possible_id(record_id) else None
            if row is None:
                raise self.stored.not_found(record_id)
            return self.stored.record.from_row(row)

    def with_status(self, statuses: Iterable[enum.Enum]) -> list[Any]:
        """Every record in one of ``statuses``, oldest first (the dispatcher's fair order)."""
        query = (select(self.stored.model).where(self.stored.model.status.in_([s.value for s in statuses]))
                 .order_by(self.stored.model.created_at, self.stored.model.id))
        with self.db.read() as session:
            return [self.stored.record.from_row(row) for row in session.execute(query).scalars()]

    def snapshots(self, statuses: Iterable[enum.Enum]) -> list[Any]:
        """Like ``with_status``, as the dispatcher's ticks read records: only the columns of
        ``stored.snapshot``, as plain rows. Every tick reads every active record; for runs this
        leaves out the summary, extrema, tags, notes, trial params and fork, whose JSON was most
        of the read's cost. The spec is read once per (record, attempt) and kept (``SpecCache``):
        a record's spec changes only as it is queued again, which starts a new attempt
        (``run_writes``; a hand-written SQL update of a live record's spec is not seen)."""
        model, snapshot, row_of = self.stored.model, self.stored.snapshot, self._snapshot_row
        names = row_of._fields[:-1]  # every field but the spec, the last
        query = (select(*(getattr(model, name) for name in names))
                 .where(model.status.in_([s.value for s in statuses])).order_by(model.created_at, model.id))
        cache = self._spec_cache
        with self.db.read() as session:
            # Rows as they come: Row._asdict() cost about 15 µs a row in the profiler (15 ms
            # of a 1,000-run tick), and a dict and a SimpleNamespace a row a few µs more than
            # the named tuple ``from_row`` reads (``_snapshot_row``)
            rows = session.execute(query).tuples().all()
            specs = [cache.get((row.id, row.attempt)) for row in rows]
            missing = [row.id for row, spec in zip(rows, specs) if spec is None]
            fetched = {}
            for start in range(0, len(missing), 1000):  # bounded IN lists
                read = select(model.id, model.attempt, model.spec).where(model.id.in_(missing[start:start + 1000]))
                for record_id, attempt, spec in session.execute(read):
                    cache.put((record_id, attempt), spec)
                    fetched[record_id] = spec
        # A record queued again between the two reads carries its new attempt's spec in this
        # snapshot (of the old attempt): for one tick, admission plans with it and the wall-clock
        # check reads its limit. A record deleted between them has no spec and is left out.
        specs = [spec if spec is not None else fetched.get(row.id) for row, spec in zip(rows, specs)]
        return [snapshot.from_row(row_of(*row, spec)) for row, spec in zip(rows, specs) if spec is not None]

    def job_owners(self, record_ids: Iterable[str]) -> dict[str, tuple[str, str, int, str | None]]:
        """``(project, status, attempt, ray_job_id)`` of each of ``record_ids`` that names a record."""
        model, ids = self.stored.model, [i for i in set(record_ids) if is_possible_id(i)]
        owners: dict[str, tuple[str, str, int, str | None]] = {}
        with self.db.read() as session:
            for start in range(0, len(ids), 1000):  # bounded IN lists
                query = (select(model.id, model.project, model.status, model.attempt, model.ray_job_id)
                         .where(model.id.in_(ids[start:start + 1000])))
                owners.update((row[0], tuple(row[1:])) for row in session.execute(query))
        return owners

    @functools.cached_property
    def _snapshot_row(self) -> type:
        """A named tuple of ``stored.snapshot``'s fields: the id, the attempt, the other columns
        it reads, and the spec last, which ``snapshots`` reads apart (``SpecCache``)."""
        others = [f.name for f in fields(self.stored.snapshot) if f.name not in ("id", "attempt", "spec")]
        return namedtuple(f"{self.stored.snapshot.__name__}Row", ["id", "attempt", *others, "spec"])

    @functools.cached_property
    def _spec_cache(self) -> "SpecCache":
        return SpecCache()

    def transition(self, record_id: str, to_status: enum.Enum, *, message: str | None = None,
                   error: str | None = None, only_from: Iterable[enum.Enum] | None = None,
                   attempt: int | None = None, failure: str | None = None, job_lost: bool = False,
                   ended_at: datetime | None = None) -> Any:
        """Change the record's status through its transition table and record why (``failure``:
        a run's ``machine`` or ``code`` with FAILED; ``job_lost``: Ray has no such job any more, so
        a run's attempt ended when it was last heard of; a sweep keeps neither). ``ended_at``: with
        an end, when Ray saw its job end, if earlier than now.

        ``only_from`` and ``attempt`` make it a compare-and-set for loops that decided on an
        older snapshot: if the record has moved on since, ``IllegalTransition`` is raised instead.
        """
        with self.db.locked_write(self.stored.model, record_id, self.stored.not_found) as (session, row):
            current = self.stored.status(row.status)
            self.stored.transitions.require_snapshot(record_id, current, to_status, stored_attempt=row.attempt,
                                              only_from=only_from, attempt=attempt)
            self.stored.apply_status(session, row, to_status, message=message, error=error, failure=failure,
                                     job_lost=job_lost, ended_at=ended_at)
            session.flush()
            return self.stored.record.from_row(row)

    def begin_attempt(self, record_id: str, *, token: str, message: str | None = None) -> Any:
        """QUEUED → STARTING for the current attempt: store the token's hash and the Ray job id."""
        with self.db.locked_write(self.stored.model, record_id, self.stored.not_found) as (session, row):
            self._start_attempt(session, row, token, message)
            session.flush()
            return self.stored.record.from_row(row)

    def begin_attempts(self, queued: list[Any], tokens: dict[str, str], message: Callable[[int], str]) -> list[Any]:
        """``begin_attempt`` for each of ``queued`` (snapshots; ``tokens[id]`` its new token,
        ``message(attempt)`` its event) in one transaction: what a dispatcher tick submits costs one
        locking read, one batch of updates and one of inserts, not a transaction per record. A
        record that left QUEUED or moved to another attempt since its snapshot (a cancel), or is
        gone, is left as it is and not returned; the others come back in the order of ``queued``.
        Rows another writer holds locked are skipped (PostgreSQL's ``SKIP LOCKED``; SQLite locks
        the whole database anyway) and stay QUEUED for the next tick: the batch never waits on a
        user's or a driver's transaction while it holds its own rows, so it cannot deadlock with
        one that locks several runs in another order (a sweep's cancel locks its trials).

        Returns the snapshots of the records started with their status (STARTING), attempt and
        job id as now stored; their other fields are as in the snapshot. The rows are read with
        only the columns a transition uses (not the spec and metrics JSON, which were most of
        this read's cost)."""
        model, status = self.stored.model, self.stored.status
        with self.db.write() as session:
            # Any other column read by mistake raises here instead of loading row by row.
            only = load_only(*(getattr(model, name) for name in TRANSITION_COLUMNS), raiseload=True)
            query = select(model).options(only).where(model.id.in_([record.id for record in queued]))
            rows = {row.id: row for row in session.execute(query.with_for_update(skip_locked=True)).scalars()}
            started = []
            for record in queued:
                row = rows.get(record.id)
                if row is None:  # deleted since the snapshot, or locked by another writer
                    continue
                try:
                    self.stored.transitions.require_snapshot(
                        record.id, status(row.status), status.STARTING, stored_attempt=row.attempt,
                        only_from=[status.QUEUED], attempt=record.attempt)
                    self._start_attempt(session, row, tokens[record.id], message(row.attempt))
                except IllegalTransition as exc:
                    log.debug("not starting %s: %s", record.id, exc)
                    continue
                started.append(replace(record, status=status.STARTING, attempt=row.attempt,
                                       ray_job_id=row.ray_job_id))
            session.flush()
            return started

    def _start_attempt(self, session: Any, row: Any, token: str, message: str | None) -> None:
        self.stored.apply_status(session, row, self.stored.status.STARTING, message=message, error=None)
        row.token_hash = hash_token(token)
        row.ray_job_id = attempt_job_id(self.stored.job_prefix, row.id, row.attempt)

    def check_token(self, record_id: str, token: str) -> bool:
        """Whether ``token`` is the current attempt's token; False for unknown records."""
        stored = None
        if is_possible_id(record_id):
            with self.db.read() as session:
                query = select(self.stored.model.token_hash).where(self.stored.model.id == record_id)
                stored = session.execute(query).scalar_one_or_none()
        return token_matches(token, stored)


# What moving a run or sweep to another status reads or writes (``apply_run_status``,
# ``apply_sweep_status``, ``_start_attempt``): the columns they share, besides ``id``. A run's
# other transitions read and write more:
# - RUNNING and an end read ``attempt_started_at`` and ``created_at`` (``run_writes.attempt_began``);
# - RUNNING, an end and a re-queue read and write ``trained_seconds`` and ``training_since``, and a
#   re-queue (or an end whose job was lost) reads ``updated_at`` (``run_writes.last_heard``);
# - an end writes ``failure``.
# None of them is STARTING, the one transition made on rows loaded with these columns alone
# (``begin_attempts``), which writes a run's ``attempt_started_at`` without reading it.
TRANSITION_COLUMNS = ("status", "attempt", "error", "ray_job_id", "token_hash", "started_at", "finished_at",
                      "updated_at")


def attempt_job_id(prefix: str, record_id: str, attempt: int) -> str:
    """Ray submission id of one attempt (``run-{id}-attempt-{n}``, ``sweep-{id}-attempt-{n}``).
    Ray refuses a second job with the same id, which is what guarantees that an attempt never
    runs twice; trial runs carry their driver's as their ``ray_job_id``."""
    return f"{prefix}-{record_id}-attempt-{attempt}"


def parse_attempt_job_id(prefix: str, job_id: str) -> tuple[str, int] | None:
    """``(record id, attempt)`` of an id ``attempt_job_id`` made with this prefix; None for any
    other (``attempt-01`` or non-ASCII digits included: the id must be the one it would make)."""
    match = re.fullmatch(rf"{re.escape(prefix)}-(.+)-attempt-([1-9][0-9]*)", job_id, flags=re.ASCII)
    return None if match is None else (match.group(1), int(match.group(2)))


class SpecCache:
    """Specs by (record id, attempt), in two generations: every ``turn`` lookups the older one is
    dropped, so what a tick still asks for stays (a hit moves into the newer one) and what it no
    longer asks for (ended runs, finished attempts) is gone within two turns. Memory stays near
    twice the active records' specs: about 15 MB for 1,000 runs whose specs are 7 KB of dicts
    (which every full garbage collection walks), not every spec a long-lived service has seen."""

    def __init__(self, turn: int = 20_000):
        self.turn, self.lookups = turn, 0
        self.new: dict[tuple[str, int], Any] = {}
        self.old: dict[tuple[str, int], Any] = {}

    def get(self, key: tuple[str, int]) -> Any:
        self.lookups += 1
        if self.lookups >= self.turn:
            self.lookups, self.old, self.new = 0, self.new, {}
        spec = self.new.get(key)
        if spec is None:
            spec = self.old.get(key)
            if spec is not None:
                self.new[key] = spec
        return spec

    def put(self, key: tuple[str, int], spec: Any) -> None:
        self.new[key] = spec
