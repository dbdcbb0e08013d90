"""Kill-and-resume at 20 points: a deterministic run on 2 Ray Train workers whose last worker is
SIGKILLed at 20 different moments (before, at and after checkpoint saves, while an asynchronous
save is being written, mid-epoch, at epoch ends, during evaluation, just before the end). Each
killed run restarts its worker group (``max_restarts=1``), resumes from its newest committed
checkpoint, and must end bitwise equal to the same run uninterrupted, having lost no metric.

    PYTHONPATH=. .venv/bin/python bench/faults.py [--out /tmp/faults.json] [--only 3]   # ~75 s a point on 2 cores

Prints a JSON report: one entry per kill point (where, the step resumed from, whether the final
checkpoints are bitwise equal and how many tensors were compared, whether every step's loss was
reported) and the count of points that passed. The suite runs 3 of these points
(tests/workers/test_ray_resume.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BATCHES = 24  # 6 epochs of 4 batches; checkpoints every 3 batches (async), evaluation every 8
FINAL_CHECKPOINT = f"checkpoints/ep6-ba{BATCHES}"  # an interval save on the last batch: 6 epochs done
# (kill at batch, during): "batch" = at the end of that batch (before a save or evaluation due
# there); "eval" = as the evaluation at that batch starts; "save" = at the end of that batch
# without waiting for the asynchronous save in flight (a torn write).
# The most different kinds first, so that ``--only N`` samples them all.
KILL_POINTS = [(8, "eval"), (10, "save"), (5, "batch"), (24, "eval"), (22, "save"), (12, "batch"),
               (1, "batch"), (2, "batch"), (3, "batch"), (4, "batch"), (6, "batch"), (11, "batch"),
               (14, "batch"), (17, "batch"), (22, "batch"), (23, "batch"), (24, "batch"), (16, "eval"),
               (4, "save"), (19, "save")]


def bench_spec():
    from tests.workers.helpers_specs import tiny_spec

    return tiny_spec(max_duration=f"{BATCHES}ba", deterministic=True, max_restarts=1, eval_interval="8ba",
                     algorithms=[{"name": "cutmix"}],
                     checkpoint={"interval": "3ba", "keep_last": 2, "async_save": True},
                     parallelism={"strategy": "ddp", "num_workers": 2})


def run_point(spec, root: Path, plain_id: str, storage_url: str, kill_at: int, during: str) -> dict:
    from tests.workers.kill_and_resume import run_killed

    started = time.monotonic()
    entry = {"kill_at": kill_at, "during": during}
    try:
        run = run_killed(spec, storage_url=storage_url, ray_dir=root / "ray",
                         marker=root / f"killed-{kill_at}-{during}", plain_id=plain_id, kill_at_batch=kill_at,
                         during=during)
        steps = run.service.steps("train/loss")
        entry.update(resumed_from=run.service.statuses[-1].get("step"),
                     statuses=[s["status"] for s in run.service.statuses],
                     every_step_reported=set(steps) == set(range(1, BATCHES + 1)),
                     tensors_compared=run.assert_final_checkpoints_bitwise_equal(FINAL_CHECKPOINT),
                     bitwise_equal=True)
    except AssertionError as exc:
        entry.update(bitwise_equal=False, error=str(exc)[:500])
    except BaseException as exc:  # a run that failed outright (DCP raises CheckpointException, a
        # BaseException) is a failed point, not a crashed bench
        if isinstance(exc, KeyboardInterrupt):
            raise
        entry.update(bitwise_equal=False, error=f"{type(exc).__name__}: {exc}"[:500])
    entry["seconds"] = round(time.monotonic() - started, 1)
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", type=int, help="run only the first N kill points")
    args = parser.parse_args()

    import ray

    from tests.workers.kill_and_resume import run_plain

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    points = KILL_POINTS[: args.only] if args.only else KILL_POINTS
    with tempfile.TemporaryDirectory(prefix="tessera-faults-") as tmp:
        root = Path(tmp)
        storage_url = f"file://{root}/storage"
        spec = bench_spec()
        plain_id = run_plain(spec, storage_url=storage_url, ray_dir=root / "ray")
        results = []
        for kill_at, during in points:
            results.append(run_point(spec, root, plain_id, storage_url, kill_at, during))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    passed = sum(1 for r in results if r["bitwise_equal"] and r.get("every_step_reported"))
    report = {"points": len(results), "passed": passed, "results": results}
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text)
    print(text)
    ray.shutdown()


if __name__ == "__main__":
    main()
