"""Sweep trial start-up: how long a trial takes to start once the sweep is going.

    PYTHONPATH=. .venv/bin/python bench/sweep_startup.py --out /tmp/sweep-startup.json   # ~8 min

Sweeps of one-batch trials (``simple_cnn`` on digits, one batch, then one evaluation), one
trial at a time, FIFO, on a local Ray started here (``ray.init``, 4 logical CPUs), run
(``workers.tune.run_sweep``) four ways taking turns, round by round, in this process:

- ``in_actor``: one-worker trials, each trained in its Tune actor, which Tune reuses for the
  next trial (the default for such sweeps, ``workers.tune.space.trains_in_trial_actor``);
- ``ray_train``: the same trials, each starting its own Ray Train controller and worker group
  (``run_sweep(in_actor=False)``, what every sweep did before);
- ``ddp_in_actor``: 2-worker DDP trials (gloo), rank 0 in the reused trial actor and rank 1 in
  the peer actor it keeps with their process group (``workers.tune.actor_ranks``, the default
  for CPU DDP/FSDP sweeps);
- ``ddp_ray_train``: the same DDP trials, each on its own Ray Train worker group.

A trial's figure is the driver's wall time from Tune's trial start to its end
(``TrialOutcome.wall_time_s``): start-up plus one batch and one evaluation of ~360 images (a
few ms here), so an upper bound on the trial's start. For a reused actor Tune's trial start comes
after the actor's reset, whose wait for the last trial's thread is not counted (these trials
end by themselves, so that thread has already ended). The first trial of a sweep also pays for
the first actor's start (and its peer's, and the process group); the goal is about the others
("a sweep trial's start <= 3 s after the first trial"), reported as their median.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import sys
import time
from typing import Any

_HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent)] + [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]

BASE = {
    "name": "sweep-startup",
    "model": {"name": "simple_cnn", "params": {"width": 8, "hidden": 32}},
    "data": {"train": {"name": "digits", "image_size": 8},
             "eval": {"name": "digits", "split": "test", "image_size": 8}, "batch_size": 64},
    "optimizer": {"name": "sgd", "lr": 0.1},
    "max_duration": "1ba",
}
DDP = {"strategy": "ddp", "num_workers": 2}
# mode: (the trials' parallelism, in_actor)
MODES = {"in_actor": (None, True), "ray_train": (None, False),
         "ddp_in_actor": (DDP, True), "ddp_ray_train": (DDP, False)}


def one_sweep(trials: int, *, parallelism: dict | None, in_actor: bool) -> list[float]:
    """The wall time of each trial of one sweep, in trial order."""
    from workers.tune import run_sweep

    base = BASE if parallelism is None else {**BASE, "parallelism": parallelism}
    spec = {"name": "sweep-startup", "base": base, "max_concurrent_trials": 1,
            "search": {"params": {"optimizer.lr": {"grid": [0.01 * (i + 1) for i in range(trials)]}}}}
    outcome = run_sweep(spec, verbose=0, in_actor=in_actor)
    failed = [t for t in outcome.trials if t.status != "COMPLETED"]
    if failed:
        raise SystemExit(f"{len(failed)} trial(s) did not complete: {failed[0].error}")
    ordered = sorted(outcome.trials, key=lambda t: t.trial_id)  # Tune numbers its trials in start order
    return [t.wall_time_s for t in ordered]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6, help="trials per sweep (default 6)")
    parser.add_argument("--rounds", type=int, default=2, help="sweeps per mode, taking turns (default 2)")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()

    import ray

    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(_HERE.parent)}})
    walls: dict[str, list[list[float]]] = {mode: [] for mode in MODES}
    try:
        for round_ in range(args.rounds):
            order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
            for mode in order:
                started = time.monotonic()
                parallelism, in_actor = MODES[mode]
                walls[mode].append(one_sweep(args.trials, parallelism=parallelism, in_actor=in_actor))
                print(f"round {round_ + 1} {mode}: sweep {time.monotonic() - started:.1f} s, trials "
                      + " ".join(f"{w:.2f}" for w in walls[mode][-1]), flush=True)
    finally:
        ray.shutdown()

    summary: dict[str, Any] = {}
    for mode, sweeps in walls.items():
        later = [w for sweep in sweeps for w in sweep[1:]]
        summary[mode] = {"first_trial_s": statistics.median(sweep[0] for sweep in sweeps),
                         "later_trials_median_s": statistics.median(later), "later_trials_max_s": max(later),
                         "trials_s": sweeps}
    ratios = {}
    for kept, fresh in (("in_actor", "ray_train"), ("ddp_in_actor", "ddp_ray_train")):
        ratios[kept] = summary[kept]["later_trials_median_s"] / summary[fresh]["later_trials_median_s"]
        print(f"later trials, median: {kept} {summary[kept]['later_trials_median_s']:.2f} s, "
              f"{fresh} {summary[fresh]['later_trials_median_s']:.2f} s ({ratios[kept]:.3f}x); first trial: "
              f"{summary[kept]['first_trial_s']:.2f} vs {summary[fresh]['first_trial_s']:.2f} s")
    if args.out:
        result = {"bench": "sweep_startup", "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
                  "trials_per_sweep": args.trials, "rounds": args.rounds,
                  "later_trials_ratio": ratios["in_actor"], "ddp_later_trials_ratio": ratios["ddp_in_actor"],
                  **summary}
        pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
