"""How ``GET /runs`` finds runs: filters (tag, name, status, sweep, creation time, archived) and
two orders, each with its own keyset cursor so pages never skip or repeat a run.

- newest first: ``(created_at, id)`` descending, on ``ix_runs_created_at_id``;
- ``best:<key>``: the key's best value first (``api.views.metric_mode``), then id, read from
  ``run_bests`` in index order (``ix_run_bests_key_max`` / ``_min``); only runs that reported
  the key are listed.

A cursor names its order, so one handed out for another order (or another key) is refused.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from sqlalchemy import Select, String, and_, cast, exists, func, literal, or_, select
from sqlalchemy.dialects.postgresql import JSONB

from api.views import RunStatus, metric_mode
from service.db.models import Run, RunBest
from service.db.session import is_possible_id

Archived = Literal["true", "false", "all"]


class InvalidCursor(ValueError):
    """A ``cursor`` that this service did not hand out (or one from another order)."""


@dataclass(frozen=True)
class RunFilter:
    """What a list of runs keeps; None means no condition."""

    projects: list[str] | None = None
    status: RunStatus | None = None
    sweep_id: str | None = None
    tag: str | None = None
    name: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    archived: Archived = "false"


def filtered(query: Select, where: RunFilter, dialect: str) -> Select:
    """``query`` (over ``Run``) with ``where``'s conditions."""
    if where.projects is not None:
        query = query.where(Run.project.in_(where.projects))
    if where.status is not None:
        query = query.where(Run.status == where.status.value)
    if where.sweep_id is not None:
        query = query.where(Run.sweep_id == where.sweep_id)
    if where.name is not None:
        query = query.where(Run.name.icontains(where.name, autoescape=True))
    if where.created_after is not None:
        query = query.where(Run.created_at > where.created_after)
    if where.created_before is not None:
        query = query.where(Run.created_at < where.created_before)
    if where.archived != "all":
        query = query.where(Run.archived_at.is_not(None) if where.archived == "true" else Run.archived_at.is_(None))
    if where.tag is not None:
        query = query.where(_has_tag(where.tag, dialect))
    return query


def _has_tag(tag: str, dialect: str):
    """The run's JSON ``tags`` array holds ``tag`` exactly (an element, not a substring)."""
    if dialect == "postgresql":
        # (tags::jsonb) @> '["tag"]': the expression GIN index of migration 0007 answers it. The
        # array is a text parameter cast to jsonb, so the query also renders with literal binds.
        # As a subquery of ids, so the planner fetches the tagged runs through the index rather
        # than walking the newest-first index and testing each run (slow for a rare tag).
        tagged = cast(Run.tags, JSONB).op("@>")(cast(literal(json.dumps([tag]), String()), JSONB))
        return Run.id.in_(select(Run.id).where(tagged).scalar_subquery())
    elements = func.json_each(Run.tags).table_valued("value")
    return exists(select(1).select_from(elements).where(elements.c.value == tag))


def newest_first(query: Select, cursor: str | None) -> Select:
    """``query`` newest first, after ``cursor``'s run."""
    query = query.order_by(Run.created_at.desc(), Run.id.desc())
    if cursor is not None:
        created_at, run_id = _decode(cursor, "created")
        query = query.where(or_(Run.created_at < _utc(created_at),
                                and_(Run.created_at == _utc(created_at), Run.id < run_id)))
    return query


def best_first(query: Select, key: str, cursor: str | None) -> Select:
    """``query`` joined to ``key``'s bests, best value first (ties: larger id first), after ``cursor``."""
    column = RunBest.max_value if metric_mode(key) == "max" else RunBest.min_value
    ordered = column.desc() if metric_mode(key) == "max" else column.asc()
    query = query.join(RunBest, and_(RunBest.run_id == Run.id, RunBest.key == key)).order_by(ordered, Run.id.desc())
    if cursor is not None:
        value, run_id = _decode(cursor, f"best:{key}")
        value = _finite(value)
        beyond = column < value if metric_mode(key) == "max" else column > value
        query = query.where(or_(beyond, and_(column == value, Run.id < run_id)))
    return query


def next_cursor(last: Run, order: str) -> str:
    """The cursor after ``last`` in ``order`` (``created`` or ``best:<key>``)."""
    position = last.created_at.isoformat() if order == "created" else _best_of(last, order.removeprefix("best:"))
    raw = json.dumps([order, position, last.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _best_of(run: Run, key: str) -> float:
    low, high = run.extrema[key]
    return float(high if metric_mode(key) == "max" else low)


def _decode(cursor: str, order: str):
    """The position and run id of a cursor handed out for ``order``."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        fields = json.loads(raw)
        if isinstance(fields, list) and len(fields) == 2:
            fields = ["created", *fields]  # a newest-first cursor from before orders existed
        cursor_order, position, run_id = fields
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise _invalid() from exc
    if cursor_order != order or not isinstance(run_id, str) or not is_possible_id(run_id):
        raise _invalid()
    return position, run_id


def _finite(value) -> float:
    """A cursor's metric value as the float the database compares (a huge integer would not bind)."""
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(number := float(value)):
            raise ValueError("not a finite number")
        return number
    except (ValueError, TypeError, OverflowError) as exc:
        raise _invalid() from exc


def _utc(created_at) -> datetime:
    try:
        when = datetime.fromisoformat(created_at)
        # In UTC, where the database compares it: an offset that moves it out of the years
        # 1..9999 raises OverflowError here instead of a database error later.
        return when.astimezone(timezone.utc) if when.tzinfo is not None else when
    except (ValueError, TypeError, OverflowError) as exc:
        raise _invalid() from exc


def _invalid() -> InvalidCursor:
    return InvalidCursor("cursor is not one this service returned for this order; pass next_cursor from a previous "
                         "page of the same query, or omit it for the first page")
