"""How a run's metric points are stored, replayed and superseded: the writes behind
``Repository.add_metrics`` and a resumed attempt's RUNNING report.

Two guarantees make a worker's spool replay safe (``workers.spool``):

- a batch carries its reporter's ``session`` and ``batch`` number; the run remembers the last
  one stored, so a batch replayed after its answer was lost is acknowledged, not stored twice
  (a reporter delivers its batches strictly in order, one at a time);
- an attempt that resumes from a checkpoint at step S says so in its RUNNING report; points of
  earlier attempts after S are flagged ``superseded`` (kept for audit, listed only with
  ``all_attempts=true``), and the run's summary, extrema and ``run_bests`` are recomputed from
  the surviving points, so the series reads as if the run never stopped;
- a point a resumed attempt reports at a (key, step) an earlier attempt's surviving point has
  supersedes that one the same way: points at S itself survive the RUNNING report, since what
  was measured at S before the checkpoint (the training loss) is not measured again, but an
  epoch's checkpoint is committed before that epoch's evaluation, so a run resumed from it
  evaluates step S again. One value per (key, step), the newest attempt's.

Callers hold the run's row lock (``Database.locked_write``).
"""

from __future__ import annotations

from sqlalchemy import delete, func, insert, or_, select, update
from sqlalchemy.orm import Session

from service.db.models import Metric, Run, RunBest, aware


# COPY is PostgreSQL's bulk load: a 1,000-point report is one round trip and no per-row SQL,
# where SQLAlchemy's executemany sends 1,000 pipelined INSERTs (42 -> 16 ms of CPU a 1,000-point
# report, in process). Row order is kept, so ``seq`` follows report order. It runs on the
# session's own connection, so in its transaction; its errors are psycopg's own (not wrapped by
# SQLAlchemy): a database error is a 500 either way, which a worker's reporter retries.
#
# Binary COPY with the columns' types declared: psycopg then dumps each value with the dumper
# of its column, chosen once. Text COPY (``write_row`` without types) picks a dumper per value
# from its Python type; that cost 4.5-5.2 ms of CPU per 1,000 rows, binary 0.7-0.9 ms (same
# rows into a scratch table, same process). The types must be the columns' own: binary COPY
# converts nothing (``varchar`` and ``text`` share one binary form).
_COPY_METRICS = "COPY metrics (run_id, step, key, value, time, attempt) FROM STDIN (FORMAT BINARY)"
_COPY_TYPES = ("text", "int8", "text", "float8", "timestamptz", "int4")


def insert_points(session: Session, rows: list[dict]) -> None:
    """Insert metric rows (``run_id, step, key, value, time, attempt``) of one run and attempt in
    the session's transaction, in order, superseding the points of earlier attempts at the same
    (key, step); when there were some, the run's summary, extrema and ``run_bests`` are
    recomputed from the surviving points (the caller's own update of them with ``rows`` then
    changes nothing: they are the newest points)."""
    superseded = supersede_reported_again(session, rows)
    _insert(session, rows)
    if superseded:
        recompute_summary(session, session.get(Run, rows[0]["run_id"]))  # locked: in the identity map


def _insert(session: Session, rows: list[dict]) -> None:
    """By COPY on PostgreSQL, by an executemany INSERT elsewhere."""
    connection = session.connection()
    if connection.dialect.name != "postgresql":
        session.execute(insert(Metric), rows)
        return
    with connection.connection.driver_connection.cursor() as cursor, cursor.copy(_COPY_METRICS) as copy:
        copy.set_types(_COPY_TYPES)
        for row in rows:  # a timestamptz in binary is its instant: any time zone will do
            copy.write_row((row["run_id"], row["step"], row["key"], row["value"], aware(row["time"]), row["attempt"]))


def is_replayed_batch(run: Run, session_id: str | None, batch: int | None) -> bool:
    """Whether (session, batch) was stored already: the reporter's batches arrive in order."""
    if session_id is None or batch is None:
        return False
    return run.report_session == session_id and run.report_batch is not None and batch <= run.report_batch


def remember_batch(run: Run, session_id: str | None, batch: int | None) -> None:
    if session_id is not None and batch is not None:
        run.report_session, run.report_batch = session_id, batch


def supersede_after(session: Session, run: Run, step: int) -> int:
    """Flag the run's surviving points after ``step`` as superseded and recompute what is read
    from the survivors; returns how many points were superseded. No earlier attempt's point
    survives after ``step`` now: the attempt's batches past it need not look for any."""
    result = session.execute(update(Metric).where(Metric.run_id == run.id, Metric.step > step,
                                                  Metric.superseded.is_(False))
                             .values(superseded=True).execution_options(synchronize_session=False))
    count = result.rowcount or 0
    if count:
        recompute_summary(session, run)
    if run.attempt > 1:
        _remember_bound((run.id, run.attempt), step)
    return count


# The highest step of the surviving points earlier attempts stored, by (run id, attempt): a
# resumed attempt's points past it cannot meet one, so its batches there cost a comparison, not a
# query (a first attempt's cost nothing). Read from the database once per attempt and process
# (``_older_bound``), or set by the attempt's RUNNING report (``supersede_after``: its metrics
# come after it, as a reporter delivers in order, so a RUNNING whose transaction failed is sent
# again first). It can only fall after that (earlier attempts store no more points: the service
# stamps each point with the run's attempt under its row lock), so a value kept here is never
# too low, and forgetting one costs a query. ``_MAX_BOUNDS`` entries at most (resumed attempts
# only), then all are dropped. Threads share it without a lock: a dict's get, set and clear are
# atomic.
_NO_POINT = -1  # steps are >= 0
_MAX_BOUNDS = 10_000
_bounds: dict[tuple[str, int], int] = {}


def forget_bounds() -> None:
    """Drop every kept bound (as a process started since would have none)."""
    _bounds.clear()


def _remember_bound(key: tuple[str, int], step: int) -> None:
    if len(_bounds) >= _MAX_BOUNDS:
        _bounds.clear()
    _bounds[key] = step


def _earlier_attempts(run_id: str, attempt: int) -> tuple:
    """The run's surviving points stored by attempts before ``attempt`` (None: stored before
    migration 0006, so by an earlier attempt)."""
    return (Metric.run_id == run_id, Metric.superseded.is_(False),
            or_(Metric.attempt < attempt, Metric.attempt.is_(None)))


def _older_bound(session: Session, run_id: str, attempt: int) -> int:
    """The highest step of an earlier attempt's surviving point (``_NO_POINT``: there is none)."""
    bound = _bounds.get((run_id, attempt))
    if bound is None:
        highest = session.execute(select(func.max(Metric.step)).where(*_earlier_attempts(run_id, attempt))).scalar()
        bound = _NO_POINT if highest is None else highest
        _remember_bound((run_id, attempt), bound)
    return bound


def supersede_reported_again(session: Session, rows: list[dict]) -> int:
    """Flag as superseded the surviving points earlier attempts stored at a (key, step) of
    ``rows`` (of one run and attempt); returns how many. A first attempt's batch, or a resumed
    one's past the earlier attempts' steps, runs no statement: the ingest path stays one insert.

    A resumed attempt's points at those steps are usually a few, in one batch (the evaluation of
    the step it resumed from): one read of the earlier points in their step range and keys, then
    an update by primary key. The read scans the run's points (no index has their steps), as
    ``supersede_after`` does once an attempt too."""
    if not rows or rows[0]["attempt"] is None or rows[0]["attempt"] < 2:
        return 0
    run_id, attempt = rows[0]["run_id"], rows[0]["attempt"]
    bound = _older_bound(session, run_id, attempt)
    again = {(row["key"], row["step"]) for row in rows if row["step"] <= bound}
    if not again:
        return 0
    steps = [step for _, step in again]
    query = select(Metric.seq, Metric.key, Metric.step).where(
        *_earlier_attempts(run_id, attempt), Metric.step >= min(steps), Metric.step <= max(steps),
        Metric.key.in_(sorted({key for key, _ in again})))
    seqs = [seq for seq, key, step in session.execute(query) if (key, step) in again]
    for start in range(0, len(seqs), 1000):  # bounded IN lists
        session.execute(update(Metric).where(Metric.seq.in_(seqs[start:start + 1000])).values(superseded=True)
                        .execution_options(synchronize_session=False))
    return len(seqs)


def recompute_summary(session: Session, run: Run) -> None:
    """The run's summary (last value per key, by report order) and extrema (min and max per key)
    from its surviving points; ``run_bests`` follows ``extrema``."""
    live = (Metric.run_id == run.id, Metric.superseded.is_(False))
    bounds = session.execute(select(Metric.key, func.min(Metric.value), func.max(Metric.value))
                             .where(*live).group_by(Metric.key)).all()
    last_seq = select(func.max(Metric.seq)).where(*live).group_by(Metric.key)
    last = session.execute(select(Metric.key, Metric.value).where(Metric.seq.in_(last_seq))).all()
    run.summary = {key: value for key, value in last}
    run.extrema = {key: [low, high] for key, low, high in bounds}
    write_bests(session, run.id, run.extrema)


def write_bests(session: Session, run_id: str, extrema: dict[str, list[float]]) -> None:
    """Replace the run's ``run_bests`` rows by ``extrema`` (what lists sort by)."""
    session.execute(delete(RunBest).where(RunBest.run_id == run_id))
    rows = [{"run_id": run_id, "key": key, "min_value": low, "max_value": high}
            for key, (low, high) in extrema.items()]
    if rows:
        session.execute(insert(RunBest), rows)
