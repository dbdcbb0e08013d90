"""``run_bests``: each run's min and max per metric key, the indexed copy of ``runs.extrema``
that ``GET /runs?order_by=best:<key>`` sorts by (``service.run_listing``).

Written in the same transaction as the metric points and ``runs.extrema`` (under the run's row
lock), by an ``INSERT ... ON CONFLICT DO UPDATE`` per key on either database.
"""

from __future__ import annotations

import functools

from sqlalchemy import Insert
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.db.models import RunBest

_INSERTS = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


@functools.cache  # one statement per dialect: compiled once, then taken from the cache
def _upsert(dialect: str) -> Insert:
    table = RunBest.__table__
    statement = _INSERTS[dialect](table)
    return statement.on_conflict_do_update(
        index_elements=[table.c.run_id, table.c.key],
        set_={"min_value": statement.excluded.min_value, "max_value": statement.excluded.max_value})


def upsert_bests(session: Session, run_id: str, extrema: dict[str, list[float]]) -> None:
    """Store ``{key: [min, max]}`` as the run's bests for those keys (the caller has merged the
    new points in already, so the stored bounds are replaced, not compared).

    One statement, compiled once, executed with the rows as parameters (the driver's
    executemany: one INSERT per key, pipelined on psycopg). With the rows built into the
    statement it had no cache key and was compiled for every report: a quarter of a metric
    report's CPU in ``bench/control_plane.py``'s profile."""
    if not extrema:
        return
    rows = [{"run_id": run_id, "key": key, "min_value": low, "max_value": high} for key, (low, high) in extrema.items()]
    session.execute(_upsert(session.get_bind().dialect.name), rows)
