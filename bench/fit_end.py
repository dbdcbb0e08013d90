"""How long a Ray Train fit takes to end once its workers are done, by the controller's poll interval.

    .venv/bin/python bench/fit_end.py [--rounds 10] [--out docs/bench/fit-end-DATE.json]   # ~4 min

Ray Train's controller learns that its workers finished by polling the worker group, every
``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (2 s by default in Ray 2.x's Train v2,
``ray/train/v2/_internal/constants.py``); only then does it shut the group down and let
``TorchTrainer.fit()`` return. Every run's job driver waits for that return before it reports
the run COMPLETED, so the wait is paid once per run (and per sweep trial that trains in a Ray
Train worker group). ``workers.ray_train.fit_with_ray`` sets a shorter interval
(``CONTROLLER_POLL_INTERVAL_S``) unless the environment sets one.

Each round runs two ``TorchTrainer.fit()`` calls, one per interval, taking turns (which goes
first alternates by round), on one local Ray started here: 2 CPU workers, gloo, a train
function that sleeps 2-4 s (drawn per round, the same for both sides: it ends anywhere in a
poll's interval) and records when it was entered and when it returns (rank 0, Unix time). The
baseline leaves the variable unset, as runs did before, so that any cost of the workers' runtime
env carrying it (Ray Train hands its RAY_TRAIN_* variables on to them) shows in ``start_s``, from
the call of ``fit()`` to rank 0 entering the train function. ``end_s``: from rank 0's return to
``fit()``'s return in this process; ``fit_s``: the whole call. Medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import statistics
import sys
import tempfile
import time
from typing import Any

_HERE = pathlib.Path(__file__).resolve().parent
REPO_ROOT = _HERE.parent
sys.path[:] = [str(REPO_ROOT)] + [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]

from workers.ray_train import CONTROLLER_POLL_ENV, CONTROLLER_POLL_INTERVAL_S  # noqa: E402

RAY_DEFAULT_S = 2.0  # DEFAULT_HEALTH_CHECK_INTERVAL_S in ray/train/v2/_internal/constants.py
NUM_WORKERS = 2


def _train_fn(config: dict[str, Any]) -> None:
    import ray.train

    entered = time.time()
    time.sleep(config["work_s"])  # stands for training: it ends at any point of a poll's interval
    if ray.train.get_context().get_world_rank() == 0:
        pathlib.Path(config["returned_path"]).write_text(json.dumps([entered, time.time()]))


def one_fit(interval_s: float | None, storage: str, work_s: float) -> dict[str, float]:
    """One fit with the controller polling every ``interval_s`` (None: the variable unset, Ray's
    default), whose workers work ``work_s``: ``start_s``, ``end_s`` and ``fit_s``."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    returned = pathlib.Path(tempfile.mkstemp(prefix="bench-fit-end-")[1])
    # Ray Train hands the driver's RAY_TRAIN_* variables to the controller it starts, and the
    # controller to the workers (get_env_vars_to_propagate); the controller reads the interval
    # when it is built. Unset, as before fit_with_ray set it, the workers' runtime env has none.
    if interval_s is not None:
        os.environ[CONTROLLER_POLL_ENV] = repr(interval_s)
    try:
        began = time.time()
        TorchTrainer(_train_fn, train_loop_config={"returned_path": str(returned), "work_s": work_s},
                     scaling_config=ScalingConfig(num_workers=NUM_WORKERS, resources_per_worker={"CPU": 1}),
                     run_config=RunConfig(name=f"bench-fit-end-{time.time_ns()}", storage_path=storage),
                     torch_config=TorchConfig(backend="gloo")).fit()
        ended = time.time()
        entered, left = json.loads(returned.read_text())
        return {"start_s": entered - began, "end_s": ended - left, "fit_s": ended - began}
    finally:
        os.environ.pop(CONTROLLER_POLL_ENV, None)
        returned.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", help="also write the JSON report here")
    args = parser.parse_args()
    import ray

    if CONTROLLER_POLL_ENV in os.environ:
        parser.error(f"unset {CONTROLLER_POLL_ENV}: this bench sets it for one side and leaves it unset for the other")
    sides = {"ray_default": None, "tessera": CONTROLLER_POLL_INTERVAL_S}
    storage = tempfile.mkdtemp(prefix="bench-fit-end-")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        one_fit(None, storage, 0.0)  # untimed: the cluster's first fit starts its worker pool
        rows: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        work = random.Random(0)
        for r in range(args.rounds):
            work_s = work.uniform(2.0, 4.0)  # the same for both sides of a round
            for side in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                rows[side].append(one_fit(sides[side], storage, work_s))
                print(f"round {r}: {side} " + " ".join(f"{k} {v:.2f}s" for k, v in rows[side][-1].items()),
                      file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
    figures = ("start_s", "end_s", "fit_s")
    medians = {side: {k: round(statistics.median(row[k] for row in runs), 3) for k in figures}
               for side, runs in rows.items()}
    report = {
        "command": "bench/fit_end.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPU cores shared with other jobs",
        "versions": {"ray": ray.__version__, "python": platform.python_version()},
        "workers": NUM_WORKERS, "rounds": args.rounds,
        "intervals_s": {side: RAY_DEFAULT_S if interval is None else interval for side, interval in sides.items()},
        "medians": medians,
        "per_round": {side: [{k: round(v, 3) for k, v in row.items()} for row in runs] for side, runs in rows.items()},
        "tessera_over_ray_default": {k: round(medians["tessera"][k] / medians["ray_default"][k], 3) for k in figures},
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
