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
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.seed import COMMON_TAGS, RARE_TAG, IdleJobs, fill, percentiles, scratch_database  # noqa: E402

BENCH_KEY = "tsk_bench-run-list-0123456789abcdef0123456789"


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

    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.db.engine import make_engine
    from service.settings import Settings

    with scratch_database(args.pg) as url:
        engine = make_engine(url)
        try:
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
        finally:
            engine.dispose()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")

if __name__ == "__main__":
    main()
