"""Reads of one run's metric points among many runs', and writes: index sets and plan cache modes.

    PYTHONPATH=. .venv/bin/python bench/metric_reads.py [--points 1000000] [--others 19] \
        [--rounds 2] [--pg postgresql://postgres@127.0.0.1:5432/test] [--out docs/bench/metric-reads-DATE.json]

``GET /runs/{id}/metrics`` reads a run's points in seq order after a cursor, of one key when
``key=`` is given (the SDK's ``iter_metrics(key=...)``, ``tessera metrics --key``). Seeded:
``--others`` runs of 100k points each, then one run of ``--points`` points, mostly ``train/loss``
with ``eval/f1_macro`` every 500 steps (a rare key). Beside the primary key (seq) and
``(run_id, seq)``, the arms compared, in turns (which goes first rotates):

- **before**: ``(run_id)`` too (migrations up to 0009), and PostgreSQL's default
  ``plan_cache_mode`` (auto): psycopg prepares a statement on a connection's sixth run of it, and
  after five plans for its values PostgreSQL may plan it once for any values (a generic plan);
- **plans_alone**: the indexes of before, every statement planned for its values
  (``force_custom_plan``, what ``service.db.engine.make_engine`` sets);
- **after**: that, and no more indexes (migration 0010 drops ``(run_id)``);
- **key_index**: ``(run_id, key, seq)`` in place of ``(run_id)``, plans as before (an
  alternative, not taken: see the writes).

Timed through ``Repository.metric_rows_after`` (the route's query) on the service's engine,
whose connection has run each read 11 times first, as a service's long-lived ones have, p50/p99
each: the rare key's points read whole (pages of 5,000), the run's first page unfiltered (a
dashboard's first load) and the common key's first page; with PostgreSQL's plans of the two key
reads as the arm's connection executes them. And what each index set costs writes: ms per
1,000-point COPY (the report route's insert) into three copies of ``metrics``, one per set,
rotating batch by batch. The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.seed import copy_metrics, fill_active, percentiles, scratch_database, vacuum_analyze  # noqa: E402

RARE_KEY, RARE_EVERY, PAGE = "eval/f1_macro", 500, 5000
INDEXES = {  # what each index set adds to the primary key (seq) and (run_id, seq)
    "old": ("DROP INDEX IF EXISTS ix_metrics_run_id_key_seq",
            "CREATE INDEX IF NOT EXISTS ix_metrics_run_id ON metrics (run_id)"),
    "lean": ("DROP INDEX IF EXISTS ix_metrics_run_id_key_seq", "DROP INDEX IF EXISTS ix_metrics_run_id"),
    "key": ("DROP INDEX IF EXISTS ix_metrics_run_id",
            "CREATE INDEX IF NOT EXISTS ix_metrics_run_id_key_seq ON metrics (run_id, key, seq)"),
}
SECOND_INDEX = {"old": "(run_id)", "lean": None, "key": "(run_id, key, seq)"}
# Each arm: an index set and the plan cache mode of its connections (make_engine's is force_custom_plan).
ARMS = {"before": ("old", "auto"), "plans_alone": ("old", "force_custom_plan"), "after": ("lean", "force_custom_plan"),
        "key_index": ("key", "auto")}


def use_indexes(engine, name: str) -> None:
    from sqlalchemy import text

    with engine.begin() as conn:
        for statement in INDEXES[name]:
            conn.execute(text(statement))
    vacuum_analyze(engine)


def copy_long_run(engine, run_id: str, points: int) -> int:
    """``points`` points of ``train/loss`` for one run, with ``RARE_KEY`` every ``RARE_EVERY``
    steps; returns how many of ``RARE_KEY``."""
    when, buffer, written = datetime(2026, 1, 1, tzinfo=timezone.utc).isoformat(), io.StringIO(), 0
    step, rare = 0, 0
    while written < points:
        buffer.write(f"{run_id}\t{step}\ttrain/loss\t{1.0 / (step + 1):.6f}\t{when}\t1\tf\n")
        written += 1
        if step % RARE_EVERY == 0 and written < points:
            buffer.write(f"{run_id}\t{step}\t{RARE_KEY}\t0.5\t{when}\t1\tf\n")
            written, rare = written + 1, rare + 1
        step += 1
    raw = engine.raw_connection()
    try:
        with raw.cursor() as cursor:
            with cursor.copy("COPY metrics (run_id, step, key, value, time, attempt, superseded) FROM STDIN") as copy:
                copy.write(buffer.getvalue())
            cursor.execute("UPDATE runs SET metric_points = %s WHERE id = %s", (written, run_id))
        raw.commit()
    finally:
        raw.close()
    return rare


def reads(repo, run_id: str) -> dict:
    def rare_whole():
        after, count = 0, 0
        while True:
            rows, after = repo.metric_rows_after(run_id, after, PAGE, key=RARE_KEY)
            count += len(rows)
            if len(rows) < PAGE:
                return count

    return {"rare_key_whole": rare_whole,
            "unfiltered_first_page": lambda: repo.metric_rows_after(run_id, 0, PAGE),
            "common_key_first_page": lambda: repo.metric_rows_after(run_id, 0, PAGE, key="train/loss")}


def explain_as_executed(engine, repo, run_id: str, key: str) -> str:
    """The plan of the statement ``metric_rows_after(run_id, key=key)`` sends, as PostgreSQL plans
    it prepared on its 11th run (its own text, casts and parameters), unedited on one line."""
    import re

    import psycopg
    from sqlalchemy import event

    sent = []
    keep = lambda _c, _cur, statement, parameters, _ctx, _many: sent.append((statement, parameters))  # noqa: E731
    event.listen(engine, "before_cursor_execute", keep)
    try:
        repo.metric_rows_after(run_id, 0, PAGE, key=key)
    finally:
        event.remove(engine, "before_cursor_execute", keep)
    statement, parameters = next((s, p) for s, p in sent if "FROM metrics" in s)
    names = re.findall(r"%\((\w+)\)s", statement)
    numbered = iter(range(1, len(names) + 1))
    prepared = re.sub(r"%\((\w+)\)s", lambda _: f"${next(numbered)}", statement)
    raw = engine.raw_connection()
    try:  # client-side binding: EXECUTE takes its arguments as literals
        cursor = psycopg.ClientCursor(raw.driver_connection)
        cursor.execute(f"PREPARE q AS {prepared}")
        execute = f"EXECUTE q({', '.join(['%s'] * len(names))})"
        values = [parameters[name] for name in names]
        for _ in range(10):
            cursor.execute(execute, values)
            cursor.fetchall()
        cursor.execute(f"EXPLAIN (ANALYZE) {execute}", values)
        rows = [row[0] for row in cursor.fetchall()]
        cursor.execute("DEALLOCATE q")
        raw.commit()
    finally:
        raw.close()
    return " | ".join(row.strip() for row in rows)


def arm_engine(url: str, plan_cache_mode: str):
    """The service's engine, its connections set to ``plan_cache_mode``."""
    from sqlalchemy import event

    from service.db.engine import make_engine

    engine = make_engine(url)

    def mode(dbapi_connection, _record):  # runs after make_engine's own listener
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET plan_cache_mode = {plan_cache_mode}")
        dbapi_connection.commit()

    event.listen(engine, "connect", mode)
    return engine


def time_arm(url: str, run_id: str, plan_cache_mode: str, requests: int, rare_points: int) -> dict:
    from service.repository import Repository

    engine = arm_engine(url, plan_cache_mode)
    try:
        repo = Repository(engine)
        read_all = reads(repo, run_id)
        found = read_all["rare_key_whole"]()
        if found != rare_points:
            raise AssertionError(f"the rare key's read found {found} points of the {rare_points} stored")
        result = {}
        for name, read in read_all.items():
            for _ in range(11):  # prepared (psycopg) and past PostgreSQL's 5 custom plans
                read()
            samples = []
            for _ in range(requests):
                began = time.perf_counter()
                read()
                samples.append(time.perf_counter() - began)
            result[name] = percentiles(samples)
        result["rare_key_plan"] = explain_as_executed(engine, repo, run_id, RARE_KEY)
        result["common_key_plan"] = explain_as_executed(engine, repo, run_id, "train/loss")
        return result
    finally:
        engine.dispose()


def copy_tables(engine) -> None:
    """``metrics_old``, ``metrics_lean`` and ``metrics_key``: copies of ``metrics``, rows included,
    each with one index set, for writes timed batch by batch against each other."""
    from sqlalchemy import text

    with engine.begin() as conn:
        for name, second in SECOND_INDEX.items():
            conn.execute(text(f"CREATE TABLE metrics_{name} (LIKE metrics INCLUDING DEFAULTS)"))
            conn.execute(text(f"INSERT INTO metrics_{name} SELECT * FROM metrics"))
            conn.execute(text(f"ALTER TABLE metrics_{name} ADD PRIMARY KEY (seq)"))
            conn.execute(text(f"CREATE INDEX ON metrics_{name} (run_id, seq)"))
            if second:
                conn.execute(text(f"CREATE INDEX ON metrics_{name} {second}"))
    vacuum_analyze(engine)


def time_writes(engine, run_ids: list[str], batches: int) -> dict:
    """ms per 1,000-point COPY (the report route's insert on PostgreSQL) into each copy table,
    rotating batch by batch (each first in turn), so all see the same load."""
    now = datetime.now(timezone.utc).isoformat()
    samples: dict[str, list[float]] = {name: [] for name in SECOND_INDEX}
    raw = engine.raw_connection()
    try:
        for b in range(batches):
            run_id, step = run_ids[b % len(run_ids)], b * 250
            rows = "".join(f"{run_id}\t{step + i // 4}\t{key}\t0.5\t{now}\t1\tf\n" for i, key in
                           zip(range(1000), ("train/loss", "train/lr", "throughput/samples_per_s", "eval/x") * 250))
            names = list(SECOND_INDEX)
            for name in names[b % 3:] + names[:b % 3]:  # which goes first rotates
                began = time.perf_counter()
                with raw.cursor() as cursor:
                    with cursor.copy(f"COPY metrics_{name} (run_id, step, key, value, time, attempt, superseded) "
                                     "FROM STDIN") as copy:
                        copy.write(rows)
                raw.commit()
                samples[name].append(time.perf_counter() - began)
    finally:
        raw.close()
    return {name: percentiles(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=1_000_000, help="points of the run read")
    parser.add_argument("--others", type=int, default=19, help="other runs, stored first")
    parser.add_argument("--other-points", type=int, default=100_000, help="points of each other run")
    parser.add_argument("--rounds", type=int, default=2, help="turns of the three arms")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--batches", type=int, default=400, help="1,000-point COPYs into each index set")
    parser.add_argument("--pg", default=os.environ.get("TESSERA_TEST_PG_URL",
                                                      "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from service.db.engine import make_engine

    report: dict = {"points": args.points, "other_runs": args.others, "other_points_each": args.other_points,
                    "rare_key": RARE_KEY, "rare_every_steps": RARE_EVERY, "rounds": []}
    with scratch_database(args.pg) as url:
        engine = make_engine(url)
        try:
            *others, run_id = fill_active(engine, args.others + 1)
            copy_metrics(engine, others, args.other_points)
            report["rare_points"] = copy_long_run(engine, run_id, args.points)
            names = list(ARMS)
            for turn in range(args.rounds):
                result = {}
                for arm in names[turn % len(names):] + names[:turn % len(names)]:
                    indexes, mode = ARMS[arm]
                    use_indexes(engine, indexes)
                    result[arm] = time_arm(url, run_id, mode, args.requests, report["rare_points"])
                report["rounds"].append(result)
            copy_tables(engine)
            report["writes_ms_per_1000_points"] = time_writes(engine, others, args.batches)
        finally:
            engine.dispose()
    report["ratios_over_before_p50"] = {
        arm: {read: [round(r[arm][read]["p50_ms"] / r["before"][read]["p50_ms"], 3) for r in report["rounds"]]
              for read in ("rare_key_whole", "unfiltered_first_page", "common_key_first_page")}
        for arm in ARMS if arm != "before"}
    writes = report["writes_ms_per_1000_points"]
    report["write_ratios_over_old"] = {name: {"p50": round(writes[name]["p50_ms"] / writes["old"]["p50_ms"], 3),
                                              "mean": round(writes[name]["mean_ms"] / writes["old"]["mean_ms"], 3)}
                                       for name in ("lean", "key")}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
