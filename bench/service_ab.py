"""Submit or ingestion throughput, read latency, or reads during a sweep's expansion: this tree
against a baseline tree, side by side on one machine.

    git worktree add /tmp/baseline <commit>
    PYTHONPATH=. .venv/bin/python bench/service_ab.py --baseline /tmp/baseline [--phase submit|ingest|read|sweep] \
        [--pairs 2] [--submits 1000] [--active 1000] [--clients 16] [--workers N] [--baseline-workers N] \
        [--out docs/bench/PHASE-ab-DATE.json] [--py-spy FILE]

Each server starts ``bench/control_plane_server.py`` from one tree (the real app, Ray faked by
``ListingRay``) on a fresh scratch database seeded with ``--active`` RUNNING runs (the
dispatcher follows them) and 1,000 ended ones, then measures one phase of
``bench/control_plane.py`` twice:

- ``submit``: ``--submits`` ``POST /runs`` from ``--clients`` concurrent connections (the lean client);
- ``ingest``: 8 new runs (submitted and handed to Ray before the clock and the CPU counts
  start), each sending 20 metric reports of 1,000 points at once;
- ``read``: 300 ``GET /runs/{id}`` of ended runs, then 300 ``GET /runs?limit=50``, one client;
- ``sweep``: ``bench/control_plane.py``'s sweep phase: a 200-trial sweep's driver registers,
  starts and ends its trials 8 at a time while one client reads ``GET /runs/{id}`` (its p50 and
  p99 are the figures of the API's responsiveness during a sweep's expansion).

``--workers`` / ``--baseline-workers``: API processes of this tree's / the baseline's servers
(default 1; the baseline may be this tree, to compare process counts).

Servers alternate baseline, this tree, this tree, baseline, ... so a machine that slows down
mid-run weighs on both sides. Prints each round and the medians' ratios (this tree over the
baseline).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.control_plane import (API, BENCH_KEY, FULL, REPO_ROOT, _child_pid, cpu_seconds, ingest_phase,  # noqa: E402
                                 read_phase, server_command, settle, short_commit, stop_server, submit_phase,
                                 sweep_phase, tokens_of, under_py_spy, wait_until_up)
from bench.seed import fill, fill_active, scratch_database, vacuum_analyze  # noqa: E402
from tests.local_ray import free_port  # noqa: E402

FIGURES = {"submit": ("per_s", "p99_ms", "all_submitted_to_ray_after_s", "server_cpu_s", "client_cpu_s"),
           "ingest": ("points_per_s", "p99_ms", "server_cpu_s", "client_cpu_s"),
           "read": ("get_p50_ms", "get_p99_ms", "list_p50_ms", "list_p99_ms", "server_cpu_s", "client_cpu_s"),
           "sweep": ("driver_per_s", "driver_p99_ms", "get_p50_ms", "get_p99_ms", "server_cpu_s", "client_cpu_s")}
INGEST = {"runs": 8, "reports": 20, "points_per_report": 1_000}
READS = FULL["gets"]  # each of GET /runs/{id} and GET /runs?limit=50, one client, as bench/control_plane.py does
SWEEP_TRIALS = FULL["sweep_trials"]


async def prepare(phase: str, client, jobs_log: Path) -> tuple[dict[str, str], list[str]]:
    """What a round of ``phase`` needs before it is timed: for ``ingest``, 8 started runs and
    their tokens. Returns the tokens and the runs submitted (to be settled after the round)."""
    if phase != "ingest":
        return {}, []
    _, ids = await submit_phase(client, INGEST["runs"])
    tokens = await tokens_of(jobs_log, ids)
    if len(tokens) != len(ids):
        raise RuntimeError(f"only {len(tokens)} of {len(ids)} runs were handed to Ray within 60 s")
    return tokens, ids


async def measure(phase: str, client, submits: int, stored: list[str], tokens: dict[str, str],
                  clients: int = 16) -> tuple[dict, list[str]]:
    """One timed round of ``phase``: its figures, and the runs it submitted (to be settled after)."""
    if phase == "submit":
        return await submit_phase(client, submits, clients)
    if phase == "read":
        rng = random.Random(0)
        get = await read_phase(client, lambda r: f"{API}/runs/{r.choice(stored)}", READS, 1, rng)
        listed = await read_phase(client, lambda r: f"{API}/runs?limit=50", READS, 1, rng)
        figures = {f"{name}_{p}": result[p] for name, result in (("get", get), ("list", listed))
                   for p in ("p50_ms", "p99_ms")}
        return {**figures, "failed": get["failed"] + listed["failed"]}, []
    if phase == "sweep":
        result = await sweep_phase(client, SWEEP_TRIALS, lambda r: f"{API}/runs/{r.choice(stored)}", random.Random(0))
        driver, during = result["driver"], result["get_run_during"]
        return {"driver_per_s": driver["per_s"], "driver_p99_ms": driver["p99_ms"], "get_p50_ms": during["p50_ms"],
                "get_p99_ms": during["p99_ms"], "failed": driver["failed"] + during["failed"],
                "trials_incomplete": result["trials"] - result["trials_completed"]}, []
    return await ingest_phase(client, tokens, INGEST["reports"], INGEST["points_per_report"]), []


def one_server(tree: Path, pg: str, phase: str, active: int, submits: int, rounds: int,
               profile: Path | None = None, workers: int = 1, clients: int = 16) -> list[dict]:
    """``rounds`` rounds of ``phase`` against a server started from ``tree`` (under py-spy into
    ``profile`` if given)."""
    import httpx

    from service.db.engine import make_engine

    with scratch_database(pg) as url, tempfile.TemporaryDirectory() as scratch:
        engine = make_engine(url)
        jobs_log = Path(scratch) / "jobs.jsonl"
        jobs_log.touch()
        seeded = fill_active(engine, active)
        stored = fill(engine, 1000, first=0, settle=False)
        vacuum_analyze(engine)
        port = free_port()
        command = server_command(tree, url, port, jobs_log, len(seeded), workers)
        server = subprocess.Popen(command if profile is None else under_py_spy(command, profile), cwd=tree,
                                  env={**os.environ, "PYTHONPATH": str(tree)})
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until_up(base, server)
            server_pid = server.pid if profile is None else _child_pid(server.pid)

            async def bursts() -> list[dict]:
                results = []
                limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
                async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {BENCH_KEY}"},
                                             limits=limits, timeout=120) as client:
                    for _ in range(rounds):
                        tokens, started = await prepare(phase, client, jobs_log)
                        cpu, server_cpu = time.process_time(), cpu_seconds(server_pid)
                        result, ids = await measure(phase, client, submits, stored, tokens, clients)
                        result["client_cpu_s"] = round(time.process_time() - cpu, 2)
                        result["server_cpu_s"] = round(cpu_seconds(server_pid) - server_cpu, 2)
                        kept = FIGURES[phase] + ("failed", "trials_incomplete")
                        results.append({name: result[name] for name in kept if name in result})
                        settle(engine, started + ids)
                return results

            return asyncio.run(bursts())
        finally:
            stop_server(server, under_py_spy=profile is not None)
            engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the commit to compare against")
    parser.add_argument("--phase", choices=sorted(FIGURES), default="submit")
    parser.add_argument("--pairs", type=int, default=2, help="servers per side (alternating)")
    parser.add_argument("--submits", type=int, default=1000)
    parser.add_argument("--active", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16, help="concurrent connections of the submit phase")
    parser.add_argument("--workers", type=int, default=1, help="API processes of this tree's servers")
    parser.add_argument("--baseline-workers", type=int, default=1, help="API processes of the baseline's servers")
    parser.add_argument("--pg", default=os.environ.get("TESSERA_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--py-spy", type=Path, default=None,
                        help="record this tree's servers with py-spy into FILE.N (collapsed stacks; slows them: "
                             "for where the time goes, not for the ratios)")
    args = parser.parse_args()
    trees = {"baseline": args.baseline.resolve(), "this": REPO_ROOT}
    commits = {side: short_commit(tree) for side, tree in trees.items()}  # before: the trees may change meanwhile
    order = [side for pair in range(args.pairs) for side in (("baseline", "this") if pair % 2 == 0 else ("this", "baseline"))]
    rounds: dict[str, list[dict]] = {"baseline": [], "this": []}
    for index, side in enumerate(order):
        profile = args.py_spy.with_name(f"{args.py_spy.name}.{index}") if args.py_spy and side == "this" else None
        workers = args.workers if side == "this" else args.baseline_workers
        for result in one_server(trees[side], args.pg, args.phase, args.active, args.submits, rounds=2,
                                 profile=profile, workers=workers, clients=args.clients):
            rounds[side].append(result)
            print(side, json.dumps(result), file=sys.stderr, flush=True)
    figures = FIGURES[args.phase]
    medians = {side: {name: statistics.median(r[name] for r in results) for name in figures}
               for side, results in rounds.items()}
    settings = {"submit": {"submits": args.submits, "clients": args.clients}, "ingest": INGEST,
                "read": {"reads": READS, "clients": 1},
                "sweep": {"trials": SWEEP_TRIALS, "driver_connections": 8, "readers": 1}}[args.phase]
    report = {"bench": f"{args.phase}_ab", "date": date.today().isoformat(), "commits": commits, "order": order,
              "machine": f"{os.cpu_count()} cores, client, server and PostgreSQL on the same machine (loopback)",
              "settings": {**settings, "active_runs": args.active, "ended_runs": 1000,
                           "workers": {"baseline": args.baseline_workers, "this": args.workers},
                           "this_tree_under_py_spy": bool(args.py_spy)},  # then its ratios are not a fair A/B
              "rounds": rounds, "medians": medians,
              "this_over_baseline": {name: round(medians["this"][name] / medians["baseline"][name], 3)
                                     for name in figures if medians["baseline"][name]},
              "all_requests_succeeded": all(r["failed"] == 0 and r.get("trials_incomplete", 0) == 0
                                            for results in rounds.values() for r in results)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
