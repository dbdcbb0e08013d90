"""Bulk seeding of a throwaway PostgreSQL database, shared by the control-plane benchmarks.

``bench/run_list.py`` and ``bench/control_plane.py`` both need the service's schema at a lab's
scale (100k runs, millions of metric points) in seconds rather than through the API, and both
must leave nothing behind: ``scratch_database`` makes a database, migrates it and drops it on exit.
Runs go in as batched INSERTs (``fill``); metric points through PostgreSQL's COPY (``copy_metrics``),
the only way 10M rows load in minutes on a small machine.
"""

from __future__ import annotations

import io
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

COMMON_TAGS = [f"tag{i}" for i in range(10)]
RARE_TAG = "rare"
START = datetime(2026, 1, 1, tzinfo=timezone.utc)
METRIC_KEYS = ("train/loss", "eval/accuracy")


class IdleJobs:
    """No Ray: for benchmarks that only read. Submits are accepted and forgotten."""

    def submit(self, *args):
        return None  # nothing is ever followed: the dispatcher thread is off where this is used

    def status(self, submission_id): return None
    def stop(self, submission_id): return None
    def logs_tail(self, submission_id, lines=40): return ""
    def job_logs(self, submission_id): return None
    def delete(self, submission_id): return None


@contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    """A fresh, migrated database next to ``admin_url``'s; yields its SQLAlchemy URL and drops
    it (forcing out any connection left) when the block ends, however it ends."""
    import psycopg

    from service.db.engine import make_engine, migrate

    name = f"tessera_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin_url.replace("postgresql://", "postgresql+psycopg://").rsplit("/", 1)[0] + f"/{name}"
    try:
        engine = make_engine(url)
        try:
            migrate(engine)
        finally:
            engine.dispose()
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_id_of(index: int) -> str:
    """The id ``fill`` gives its ``index``-th run (ordered like ``created_at``)."""
    return f"{index:012x}"


def stored_spec() -> dict:
    """A run's spec as the service stores a submitted one: the validated spec's JSON, every
    field and default included (about 900 bytes). A run list decodes and returns it whole, so its
    size is part of what a list request costs."""
    from api.specs import RunSpec

    return RunSpec.model_validate({
        "name": "bench", "model": {"name": "cifar_resnet20"},
        "data": {"train": {"name": "digits", "split": "train"}, "eval": {"name": "digits", "split": "test"},
                 "batch_size": 64},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}, "max_duration": "3ep", "eval_interval": "1ep",
    }).model_dump(mode="json")


def fill(engine, num_runs: int, seed: int = 0, *, first: int = 0, settle: bool = True) -> list[str]:
    """Insert ``num_runs`` COMPLETED runs (indexes ``first``.. onwards) with bests for
    ``eval/accuracy`` and ``train/loss`` and 0-3 tags, in batches; return their ids.

    ``settle``: VACUUM ANALYZE afterwards, as autovacuum would leave the tables."""
    from sqlalchemy import insert

    from service.db.models import Run, RunBest

    rng = random.Random(seed + first)
    batch, ids, spec = 5000, [], stored_spec()
    with engine.begin() as conn:
        for start in range(first, first + num_runs, batch):
            runs, bests = [], []
            for i in range(start, min(start + batch, first + num_runs)):
                run_id = run_id_of(i)
                ids.append(run_id)
                accuracy, loss = round(rng.random(), 4), round(rng.uniform(0.05, 3.0), 4)  # rounded: ties happen
                tags = rng.sample(COMMON_TAGS, rng.randint(0, 3)) + ([RARE_TAG] if rng.random() < 0.001 else [])
                when = START + timedelta(seconds=i * 30)
                runs.append({"id": run_id, "project": "default", "name": f"run-{i}", "status": "COMPLETED",
                             "attempt": 1, "spec": spec, "created_at": when, "updated_at": when,
                             "started_at": when, "finished_at": when, "summary": {"eval/accuracy": accuracy},
                             "tags": tags, "extrema": {"eval/accuracy": [0.0, accuracy], "train/loss": [loss, 3.0]}})
                bests += [{"run_id": run_id, "key": "eval/accuracy", "min_value": 0.0, "max_value": accuracy},
                          {"run_id": run_id, "key": "train/loss", "min_value": loss, "max_value": 3.0}]
            conn.execute(insert(Run), runs)
            conn.execute(insert(RunBest), bests)
    if settle:
        vacuum_analyze(engine)
    return ids


def fill_active(engine, num_runs: int) -> list[str]:
    """Insert ``num_runs`` RUNNING runs, each on Ray job ``run-{id}-attempt-1`` (what a dispatcher
    follows); their ids start with ``a`` so they sort apart from ``fill``'s. Returns the ids."""
    from sqlalchemy import insert

    from service.db.models import Run

    now, spec = datetime.now(timezone.utc), stored_spec()
    rows = [{"id": f"a{i:011x}", "project": "default", "name": f"active-{i}", "status": "RUNNING", "attempt": 1,
             "spec": spec, "created_at": now, "updated_at": now, "started_at": now,
             "ray_job_id": f"run-a{i:011x}-attempt-1", "summary": {}, "tags": [], "extrema": {}}
            for i in range(num_runs)]
    with engine.begin() as conn:
        for start in range(0, len(rows), 5000):
            conn.execute(insert(Run), rows[start:start + 5000])
    return [row["id"] for row in rows]


def copy_metrics(engine, run_ids: Sequence[str], points_per_run: int) -> int:
    """COPY ``points_per_run`` points into ``metrics`` for each run (``METRIC_KEYS`` in turn, one
    step per key pair) and count them in ``runs.metric_points``; returns the rows written. Bests
    and summaries are not touched: the reads benchmarked here do not derive them from the points."""
    steps = -(-points_per_run // len(METRIC_KEYS))
    when = START.isoformat()
    raw = engine.raw_connection()
    try:
        with raw.cursor() as cursor:
            with cursor.copy("COPY metrics (run_id, step, key, value, time, attempt, superseded) FROM STDIN") as copy:
                for run_id in run_ids:
                    buffer = io.StringIO()
                    written = 0
                    for step in range(steps):
                        for key in METRIC_KEYS:
                            if written == points_per_run:
                                break
                            buffer.write(f"{run_id}\t{step}\t{key}\t{1.0 / (step + 1):.6f}\t{when}\t1\tf\n")
                            written += 1
                    copy.write(buffer.getvalue())
            # What the report route keeps with each stored batch (its point budget reads it).
            cursor.execute("UPDATE runs SET metric_points = metric_points + %s WHERE id = ANY(%s)",
                           (points_per_run, list(run_ids)))
        raw.commit()
    finally:
        raw.close()
    return len(run_ids) * points_per_run


def vacuum_analyze(engine) -> None:
    """A settled database, as autovacuum leaves it: statistics, and the GIN index's pending list
    (where a bulk insert's entries wait, scanned linearly) merged into the index."""
    from sqlalchemy import text

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50/p99 and mean (ms) and the count of ``samples`` (seconds)."""
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_ms": round(pick(0.50) * 1000, 2), "p99_ms": round(pick(0.99) * 1000, 2),
            "mean_ms": round(sum(ordered) / len(ordered) * 1000, 2), "n": len(ordered)}


def timed(action) -> tuple[object, float]:
    """``action()``'s result and how long it took (s)."""
    began = time.perf_counter()
    result = action()
    return result, time.perf_counter() - began
