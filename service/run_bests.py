"""``run_bests``: each run's min and max per metric key, the indexed copy of ``runs.extrema``
that ``GET /runs?order_by=best:<key>`` sorts by (``service.run_listing``).

Written in the same transaction as the metric points and ``runs.extrema`` (under the run's row
lock), by one ``INSERT ... ON CONFLICT DO UPDATE`` on either database.
"""

from __future__ import annotations

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.db.models import RunBest

_INSERTS = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


def upsert_bests(session: Session, run_id: str, extrema: dict[str, list[float]]) -> None:
    """Store ``{key: [min, max]}`` as the run's bests for those keys (the caller has merged the
    new points in already, so the stored bounds are replaced, not compared)."""
    if not extrema:
        return
    insert = _INSERTS[session.get_bind().dialect.name]
    statement = insert(RunBest).values([{"run_id": run_id, "key": key, "min_value": low, "max_value": high}
                                        for key, (low, high) in extrema.items()])
    statement = statement.on_conflict_do_update(
        index_elements=[RunBest.run_id, RunBest.key],
        set_={"min_value": statement.excluded.min_value, "max_value": statement.excluded.max_value})
    session.execute(statement)
