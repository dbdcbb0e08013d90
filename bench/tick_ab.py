"""The dispatcher's tick, this tree against a baseline tree, side by side on one machine.

    git worktree add /tmp/baseline <commit>
    PYTHONPATH=. .venv/bin/python bench/tick_ab.py --baseline /tmp/baseline [--rounds 6] [--ticks 100] \
        [--active 1000] [--out docs/bench/tick-ab-DATE.json]

One scratch PostgreSQL database, seeded once with ``--active`` RUNNING runs, serves every round.
A round is a fresh process started from one tree that runs that tree's own
``bench.control_plane.tick_phase``: ``--ticks`` timed ``Dispatcher.tick()`` calls over the active
runs, Ray faked by ``ListingRay`` (every job listed RUNNING, so no run changes and each round
sees the same database), each tree's log archiver as that tree's service runs it. Rounds
alternate baseline, this tree, this tree, baseline, ... so a machine that slows down mid-run
weighs on both sides. Prints each round and the ratios of the medians (this tree over the
baseline: below 1 is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import date
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.control_plane import short_commit  # noqa: E402
from bench.seed import fill_active, scratch_database  # noqa: E402

ROUND = """
import json, sys
from bench.control_plane import tick_phase
url, active, ticks = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
print(json.dumps(tick_phase(url, active, ticks)))
"""
FIGURES = ("p50_ms", "p99_ms", "mean_ms")


def one_round(tree: Path, url: str, active: list[str], ticks: int) -> dict:
    done = subprocess.run([sys.executable, "-c", ROUND, url, json.dumps(active), str(ticks)], cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"a round in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the baseline commit")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per tree (default 6)")
    parser.add_argument("--ticks", type=int, default=100, help="ticks timed per round (default 100)")
    parser.add_argument("--active", type=int, default=1000, help="RUNNING runs the dispatcher follows")
    parser.add_argument("--pg", default=os.environ.get("TESSERA_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    trees = {"baseline": args.baseline.resolve(), "this": REPO_ROOT}
    rounds: dict[str, list[dict]] = {"baseline": [], "this": []}
    with scratch_database(args.pg) as url:
        from service.db.engine import make_engine

        engine = make_engine(url)
        try:
            active = fill_active(engine, args.active)
        finally:
            engine.dispose()
        for index in range(args.rounds * 2):
            side = ("baseline", "this", "this", "baseline")[index % 4]
            result = one_round(trees[side], url, active, args.ticks)
            rounds[side].append(result)
            print(f"{side:8s} " + "  ".join(f"{name} {result[name]:7.2f}" for name in FIGURES), flush=True)

    medians = {side: {name: statistics.median(r[name] for r in results) for name in FIGURES}
               for side, results in rounds.items()}
    ratios = {name: round(medians["this"][name] / medians["baseline"][name], 3) for name in FIGURES}
    print("medians:", json.dumps(medians), "\nthis / baseline:", json.dumps(ratios))
    if args.out:
        report = {"bench": "tick_ab", "date": date.today().isoformat(),
                  "commits": {side: short_commit(tree) for side, tree in trees.items()},
                  "settings": {"rounds": args.rounds, "ticks": args.ticks, "active": args.active},
                  "rounds": rounds, "medians": medians, "this_over_baseline": ratios}
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
