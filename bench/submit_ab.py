"""Submit throughput, this tree against a baseline tree, side by side on one machine.

    git worktree add /tmp/baseline <commit>
    PYTHONPATH=. .venv/bin/python bench/submit_ab.py --baseline /tmp/baseline [--pairs 2] \
        [--submits 1000] [--active 1000] [--out docs/bench/submit-ab-DATE.json]

Each round starts ``bench/control_plane_server.py`` from one tree (the real app, Ray faked by
``ListingRay``) on a fresh scratch database seeded with ``--active`` RUNNING runs (the
dispatcher follows them) and 1,000 ended ones, then sends ``--submits`` ``POST /runs`` from 16
concurrent clients, as ``bench/control_plane.py``'s submit phase does, twice. Rounds alternate
baseline, this tree, this tree, baseline, ... so a machine that slows down mid-run weighs on
both sides. Prints each round and the medians' ratios (this tree over the baseline).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.control_plane import (BENCH_KEY, REPO_ROOT, cpu_seconds, server_command, settle,  # noqa: E402
                                 short_commit, stop_server, submit_phase, wait_until_up)
from bench.seed import fill, fill_active, scratch_database, vacuum_analyze  # noqa: E402
from tests.local_ray import free_port  # noqa: E402

FIGURES = ("per_s", "p99_ms", "all_submitted_to_ray_after_s", "server_cpu_s", "client_cpu_s")


def one_server(tree: Path, pg: str, active: int, submits: int, rounds: int) -> list[dict]:
    """``rounds`` bursts of ``submits`` against a server started from ``tree``."""
    import httpx

    from service.db.engine import make_engine

    with scratch_database(pg) as url, tempfile.TemporaryDirectory() as scratch:
        engine = make_engine(url)
        jobs_log = Path(scratch) / "jobs.jsonl"
        jobs_log.touch()
        seeded = fill_active(engine, active)
        fill(engine, 1000, first=0, settle=False)
        vacuum_analyze(engine)
        port = free_port()
        server = subprocess.Popen(server_command(tree, url, port, jobs_log, len(seeded)), cwd=tree,
                                  env={**os.environ, "PYTHONPATH": str(tree)})
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until_up(base, server)

            async def bursts() -> list[dict]:
                results = []
                limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
                async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {BENCH_KEY}"},
                                             limits=limits, timeout=120) as client:
                    for _ in range(rounds):
                        cpu, server_cpu = time.process_time(), cpu_seconds(server.pid)
                        result, ids = await submit_phase(client, submits)
                        result["client_cpu_s"] = round(time.process_time() - cpu, 2)
                        result["server_cpu_s"] = round(cpu_seconds(server.pid) - server_cpu, 2)
                        results.append({name: result[name] for name in FIGURES} | {"failed": result["failed"]})
                        settle(engine, ids)
                return results

            return asyncio.run(bursts())
        finally:
            stop_server(server, under_py_spy=False)
            engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the commit to compare against")
    parser.add_argument("--pairs", type=int, default=2, help="servers per side (alternating)")
    parser.add_argument("--submits", type=int, default=1000)
    parser.add_argument("--active", type=int, default=1000)
    parser.add_argument("--pg", default=os.environ.get("TESSERA_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    trees = {"baseline": args.baseline.resolve(), "this": REPO_ROOT}
    order = [side for pair in range(args.pairs) for side in (("baseline", "this") if pair % 2 == 0 else ("this", "baseline"))]
    rounds: dict[str, list[dict]] = {"baseline": [], "this": []}
    for side in order:
        for result in one_server(trees[side], args.pg, args.active, args.submits, rounds=2):
            rounds[side].append(result)
            print(side, json.dumps(result), file=sys.stderr, flush=True)
    medians = {side: {name: statistics.median(r[name] for r in results) for name in FIGURES}
               for side, results in rounds.items()}
    commits = {side: short_commit(tree) for side, tree in trees.items()}
    report = {"bench": "submit_ab", "date": date.today().isoformat(), "commits": commits, "order": order,
              "machine": f"{os.cpu_count()} cores, client, server and PostgreSQL on the same machine (loopback)",
              "settings": {"submits": args.submits, "clients": 16, "active_runs": args.active, "ended_runs": 1000},
              "rounds": rounds, "medians": medians,
              "this_over_baseline": {name: round(medians["this"][name] / medians["baseline"][name], 3)
                                     for name in FIGURES if medians["baseline"][name]},
              "all_requests_succeeded": all(r["failed"] == 0 for results in rounds.values() for r in results)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
