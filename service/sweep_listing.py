"""How ``GET /sweeps`` finds sweeps: filters (project, status, name, archived) and one order,
newest first, ``(created_at, id)`` descending on ``ix_sweeps_created_at_id``, in keyset pages
(``service.keyset``) that never skip or repeat a sweep. Its cursors name their own order, so a
``GET /runs`` cursor is refused here."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Select

from api.views import SweepStatus
from service import keyset
from service.db.models import Sweep
from service.list_filters import Archived, archived_is, name_contains

ORDER = "sweeps:created"  # the order's name in cursors


@dataclass(frozen=True)
class SweepFilter:
    """What a list of sweeps keeps; None means no condition."""

    projects: list[str] | None = None
    status: SweepStatus | None = None
    name: str | None = None
    archived: Archived = "false"


def filtered(query: Select, where: SweepFilter) -> Select:
    """``query`` (over ``Sweep``) with ``where``'s conditions."""
    if where.projects is not None:
        query = query.where(Sweep.project.in_(where.projects))
    if where.status is not None:
        query = query.where(Sweep.status == where.status.value)
    if where.name is not None:
        query = query.where(name_contains(Sweep.name, where.name))
    if (archived := archived_is(Sweep.archived_at, where.archived)) is not None:
        query = query.where(archived)
    return query


def newest_first(query: Select, cursor: str | None) -> Select:
    """``query`` newest first (ties: larger id first), after ``cursor``'s sweep."""
    return keyset.newest_first(query, Sweep, cursor, ORDER)


def next_cursor(last: Sweep) -> str:
    """The cursor after ``last``."""
    return keyset.newest_cursor(last, ORDER)
