"""Run-list benchmark: ``GET /runs`` at 100k runs on PostgreSQL.

    PYTHONPATH=. .venv/bin/python bench/run_list.py [--runs 100000] [--requests 200] \
        [--pg postgresql://postgres@127.0.0.1:5432/test] [--out docs/bench/run-list-DATE.json]

Makes a throwaway database, migrates it, inserts ``--runs`` ended runs (each with bests for
``eval/accuracy`` and ``train/loss`` in ``run_bests``, and 0-3 tags), then times through the real
app (FastAPI TestClient, no network) the first page (limit=50) of:

- ``order_by=best:eval/accuracy`` (index ``ix_run_bests_key_max``) and ``best:train/loss`` (``_min``),
  and the page after (cursor);
- ``tag=<common>`` (on ~10% of runs) and ``tag=<rare>`` (on ~0.1%);
- the default newest-first list.

Reports p50/p99 in ms per query and PostgreSQL's ``EXPLAIN (ANALYZE, BUFFERS)`` for the SQL
behind each. The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BENCH_KEY = "tsk_bench-run-list-0123456789abcdef0123456789"
COMMON_TAGS = [f"tag{i}" for i in range(10)]
RARE_TAG = "rare"


class IdleJobs:
    """No Ray: the benchmark only reads."""

    def submit(self, *args): pass
    def status(self, submission_id): return None
    def stop(self, submission_id): pass
    def logs_tail(self, submission_id, lines=40): return ""
    def job_logs(self, submission_id): return None


def fill(engine, num_runs: int, seed: int = 0) -> None:
    """Insert ``num_runs`` COMPLETED runs with bests and tags, in batches."""
    from sqlalchemy import insert, text

    from service.db.models import Run, RunBest

    rng = random.Random(seed)
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    spec = {"name": "bench", "model": {"name": "cifar_resnet20"}, "optimizer": {"name": "sgd", "lr": 0.1}}
    batch = 5000
    with engine.begin() as conn:
        for first in range(0, num_runs, batch):
            runs, bests = [], []
            for i in range(first, min(first + batch, num_runs)):
                run_id = f"{i:012x}"
                accuracy, loss = round(rng.random(), 4), round(rng.uniform(0.05, 3.0), 4)  # rounded: ties happen
                tags = rng.sample(COMMON_TAGS, rng.randint(0, 3)) + ([RARE_TAG] if rng.random() < 0.001 else [])
                when = start + timedelta(seconds=i * 30)
                runs.append({"id": run_id, "project": "default", "name": f"run-{i}", "status": "COMPLETED",
                             "attempt": 1, "spec": spec, "created_at": when, "updated_at": when,
                             "started_at": when, "finished_at": when, "summary": {"eval/accuracy": accuracy},
                             "tags": tags, "extrema": {"eval/accuracy": [0.0, accuracy], "train/loss": [loss, 3.0]}})
                bests += [{"run_id": run_id, "key": "eval/accuracy", "min_value": 0.0, "max_value": accuracy},
                          {"run_id": run_id, "key": "train/loss", "min_value": loss, "max_value": 3.0}]
            conn.execute(insert(Run), runs)
            conn.execute(insert(RunBest), bests)
    # A settled table, as autovacuum leaves it: statistics, and the GIN index's pending list
    # (where a bulk insert's entries wait, scanned linearly) merged into the index.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_ms": round(pick(0.50) * 1000, 2), "p99_ms": round(pick(0.99) * 1000, 2), "n": len(ordered)}


def time_requests(client, params: dict, num: int) -> dict:
    samples = []
    for _ in range(num):
        began = time.perf_counter()
        response = client.get("/api/v1/runs", params=params)
        samples.append(time.perf_counter() - began)
        assert response.status_code == 200, response.text
    return {**percentiles(samples), "rows": len(response.json()["data"])}


def explain(engine, params: dict) -> list[str]:
    """PostgreSQL's plan for the SQL the repository runs for ``params``."""
    from sqlalchemy import select, text

    from service.db.models import Run
    from service.run_listing import RunFilter, best_first, filtered, newest_first

    where = RunFilter(projects=None, tag=params.get("tag"))
    query = filtered(select(Run), where, "postgresql")
    order = params.get("order_by")
    query = best_first(query, order.removeprefix("best:"), None) if order else newest_first(query, None)
    sql = str(query.limit(51).compile(engine, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        return [row[0] for row in conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS) {sql}"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--pg", default=os.environ.get("TESSERA_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import psycopg
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.db.engine import make_engine, migrate
    from service.settings import Settings

    name = f"tessera_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.pg, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = args.pg.replace("postgresql://", "postgresql+psycopg://").rsplit("/", 1)[0] + f"/{name}"
    engine = make_engine(url)
    try:
        migrate(engine)
        began = time.perf_counter()
        fill(engine, args.runs)
        fill_s = time.perf_counter() - began
        queries = {"best_accuracy": {"order_by": "best:eval/accuracy"}, "best_loss": {"order_by": "best:train/loss"},
                   "tag_common": {"tag": COMMON_TAGS[0]}, "tag_rare": {"tag": RARE_TAG}, "newest": {}}
        report = {"runs": args.runs, "fill_s": round(fill_s, 1), "limit": 50, "queries": {}, "explain": {}}
        with tempfile.TemporaryDirectory() as home:
            settings = Settings(home=Path(home), database_url=url, bootstrap_api_key=BENCH_KEY)
            app = create_app(settings, jobs=IdleJobs(), run_dispatcher=False)
            with TestClient(app, headers={"Authorization": f"Bearer {BENCH_KEY}"}) as client:
                for label, params in queries.items():
                    params = {**params, "limit": 50}
                    client.get("/api/v1/runs", params=params)  # warm the cache once
                    report["queries"][label] = time_requests(client, params, args.requests)
                    report["explain"][label] = explain(engine, params)
                cursor = client.get("/api/v1/runs", params={"order_by": "best:eval/accuracy", "limit": 50}).json()
                report["queries"]["best_accuracy_page_2"] = time_requests(
                    client, {"order_by": "best:eval/accuracy", "limit": 50, "cursor": cursor["next_cursor"]},
                    args.requests)
        text = json.dumps(report, indent=2)
        print(text)
        if args.out is not None:
            args.out.write_text(text + "\n")
    finally:
        engine.dispose()
        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
