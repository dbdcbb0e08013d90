"""How ``GET /runs`` finds runs: filters (tag, name, status, sweep, creation time, archived) and
two orders, each with its own keyset cursor so pages never skip or repeat a run.

- newest first: ``(created_at, id)`` descending, on ``ix_runs_created_at_id``;
- ``best:<key>``: the key's best value first (``api.views.metric_mode``), then id, read from
  ``run_bests`` in index order (``ix_run_bests_key_max`` / ``_min``); only runs that reported
  the key are listed.

A cursor names its order, so one handed out for another order (or another key) is refused
(``service.keyset``, whose cursors and newest-first order ``GET /sweeps`` shares).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Select, String, and_, cast, exists, func, literal, or_, select
from sqlalchemy.dialects.postgresql import JSONB

from api.views import RunStatus, metric_mode
from service import keyset
from service.db.models import Run, RunBest
from service.keyset import decode_cursor, encode_cursor, invalid_cursor
from service.list_filters import Archived, archived_is, name_contains


CREATED = "created"  # the newest-first order's name in cursors (a two-field cursor from before orders: this one)


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
        query = query.where(name_contains(Run.name, where.name))
    if where.created_after is not None:
        query = query.where(Run.created_at > where.created_after)
    if where.created_before is not None:
        query = query.where(Run.created_at < where.created_before)
    if (archived := archived_is(Run.archived_at, where.archived)) is not None:
        query = query.where(archived)
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
    return keyset.newest_first(query, Run, cursor, CREATED, untagged=CREATED)


def best_first(query: Select, key: str, cursor: str | None) -> Select:
    """``query`` joined to ``key``'s bests, best value first (ties: larger id first), after ``cursor``."""
    column = RunBest.max_value if metric_mode(key) == "max" else RunBest.min_value
    ordered = column.desc() if metric_mode(key) == "max" else column.asc()
    query = query.join(RunBest, and_(RunBest.run_id == Run.id, RunBest.key == key)).order_by(ordered, Run.id.desc())
    if cursor is not None:
        value, run_id = decode_cursor(cursor, f"best:{key}")
        value = _finite(value)
        beyond = column < value if metric_mode(key) == "max" else column > value
        query = query.where(or_(beyond, and_(column == value, Run.id < run_id)))
    return query


def next_cursor(last: Run, order: str) -> str:
    """The cursor after ``last`` in ``order`` (``created`` or ``best:<key>``)."""
    if order == CREATED:
        return keyset.newest_cursor(last, CREATED)
    return encode_cursor(order, _best_of(last, order.removeprefix("best:")), last.id)


def _best_of(run: Run, key: str) -> float:
    low, high = run.extrema[key]
    return float(high if metric_mode(key) == "max" else low)


def _finite(value) -> float:
    """A cursor's metric value as the float the database compares (a huge integer would not bind)."""
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(number := float(value)):
            raise ValueError("not a finite number")
        return number
    except (ValueError, TypeError, OverflowError) as exc:
        raise invalid_cursor() from exc
