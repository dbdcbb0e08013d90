"""Recipes on Fashion-MNIST, CPU: does a speedup recipe reach the baseline's accuracy sooner, and
does ASHA find the best set of methods for less compute than a full grid?

    .venv/bin/python bench/recipes.py --out /tmp/recipes.json     # 20-40 min on 2 busy cores
    .venv/bin/python bench/recipes.py --quick --parts a --out /tmp/quick.json   # smoke test, ~15 s
    .venv/bin/python bench/recipes.py --quick --parts b --out /tmp/quick_b.json # Ray smoke test, ~2.5 min
    .venv/bin/python bench/recipes.py --show /tmp/recipes.json    # print an earlier run's tables
    # rerun one side of part B, keeping the rest of an earlier result:
    .venv/bin/python bench/recipes.py --parts b --sweeps asha --reuse /tmp/old.json --out /tmp/new.json

Part A, time to target (in this process, no Ray). The target of seed s is the final eval
accuracy of the baseline trained with seed s. Time to target = training time (evaluation
excluded, see ``TrainClock``) until the first evaluation at or above the target; "not reached"
if none. A screen on one seed (every pool method alone, then the methods that helped combined,
on full and shortened schedules) picks the recipe; it is then measured on fresh seeds, each
interleaved with the baseline of the same seed so that machine load hits both alike.

Part B, ASHA vs grid (``workers.tune.run_sweep`` without a service, local Ray): the same
algorithm sets, the same base run, once with every trial trained to the end (FIFO) and once
with ASHA stopping trials at its rungs. Compute = the batches the trials trained (exact), and
the sum of Tune's per-trial time, which includes every trial's Ray Train start-up (tens of
seconds here, so it favours the grid's few long trials less than batches do); a start-up
estimate from each trial's reports gives a third figure.

Times on a shared 2-core machine are noisy: wall-clock training time is the headline, the
process CPU time (one torch thread per run) is printed beside it as a load-robust check.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Any

# This script sits next to bench/algorithms.py, which is named like Tessera's `algorithms`
# package: drop bench/ from the import path and put the repository root first.
_HERE = pathlib.Path(__file__).resolve().parent
REPO_ROOT = _HERE.parent
sys.path[:] = [str(REPO_ROOT)] + [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]

import torch  # noqa: E402

from api.specs import RunSpec  # noqa: E402
from bench.local_s3 import free_port  # noqa: E402
from workers.events import Event  # noqa: E402
from workers.trainer import Trainer, process_settings  # noqa: E402


# --- what is measured --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Scale:
    """Sizes of one bench run (``FULL`` or ``QUICK``)."""

    model: dict[str, Any]
    image_size: int
    train_limit: int
    eval_limit: int
    batch_size: int
    lr: float
    epochs: int                      # the baseline's schedule (part A)
    evals_per_epoch: int             # time-to-target resolution
    screen_seed: int
    seeds: tuple[int, ...]           # fresh seeds for the chosen recipe
    screen_methods: tuple[str, ...]  # each is tried alone on the screen seed
    schedule_fractions: tuple[float, ...]  # recipes also run on shortened schedules
    sweep_model: dict[str, Any]
    sweep_train_limit: int
    sweep_eval_limit: int
    sweep_epochs: int                # ASHA rungs sit at 1/9, 1/3, 1 of 9 epochs (grace 1ep, factor 3)
    sweep_pool: tuple[str, ...]
    sweep_max_size: int
    sweep_concurrency: int


POOL = ("channels_last", "blurpool", "label_smoothing", "progressive_resizing", "ema", "mixup", "cutout", "colout")

FULL = Scale(
    model={"name": "cifar_resnet20"}, image_size=16, train_limit=2560, eval_limit=1000, batch_size=128,
    lr=0.1, epochs=5, evals_per_epoch=2, screen_seed=0, seeds=(1, 2, 3), screen_methods=POOL,
    schedule_fractions=(1.0, 0.7, 0.5),
    sweep_model={"name": "cifar_resnet20", "params": {"width": 8}}, sweep_train_limit=2048, sweep_eval_limit=1000,
    sweep_epochs=9, sweep_pool=("label_smoothing", "progressive_resizing", "ema", "mixup"), sweep_max_size=4,
    sweep_concurrency=2,
)

QUICK = Scale(
    model={"name": "simple_cnn", "params": {"width": 8, "hidden": 32}}, image_size=12, train_limit=1024,
    eval_limit=256, batch_size=64, lr=0.05, epochs=3, evals_per_epoch=2, screen_seed=0, seeds=(1, 2, 3),
    screen_methods=("label_smoothing", "progressive_resizing"), schedule_fractions=(1.0, 0.5),
    sweep_model={"name": "simple_cnn", "params": {"width": 8, "hidden": 32}}, sweep_train_limit=512,
    sweep_eval_limit=128, sweep_epochs=3, sweep_pool=("label_smoothing",), sweep_max_size=1,
    sweep_concurrency=2,
)

# Hyperparameters for these short runs (a few hundred batches). EMA's default half-life of
# 1000 batches would evaluate weights that are still mostly the initial ones.
METHOD_PARAMS: dict[str, dict[str, Any]] = {
    "label_smoothing": {"smoothing": 0.1},
    "ema": {"half_life": "20ba"},
    "mixup": {"alpha": 0.2},
    "progressive_resizing": {"initial_scale": 0.5, "delay_fraction": 0.4, "finetune_fraction": 0.2},
}


def algorithm_list(names: tuple[str, ...] | list[str]) -> list[dict[str, Any]]:
    """Methods in the catalog's pool order (the engine runs them in list order)."""
    ordered = sorted(names, key=lambda n: POOL.index(n) if n in POOL else len(POOL))
    return [{"name": n, **METHOD_PARAMS.get(n, {})} for n in ordered]


def fashion_mnist_base(scale: Scale, *, name: str, model: dict[str, Any], train_limit: int, eval_limit: int,
                       batches: int, eval_every: int, algorithms: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """The RunSpec (a dict) both parts train: Fashion-MNIST subsets, SGD + cosine, ``batches`` long."""
    return {
        "name": name,
        "model": model,
        "data": {"train": {"name": "fashion_mnist", "limit": train_limit, "image_size": scale.image_size},
                 "eval": {"name": "fashion_mnist", "split": "test", "limit": eval_limit,
                          "image_size": scale.image_size},
                 "batch_size": scale.batch_size, "eval_batch_size": 500},
        "optimizer": {"name": "sgd", "lr": scale.lr, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": True},
        "scheduler": {"name": "cosine", "warmup": "0.05dur"},
        "max_duration": f"{batches}ba",
        "eval_interval": f"{eval_every}ba",
        "algorithms": algorithms,
        "seed": seed,
    }


def run_spec(scale: Scale, *, methods: tuple[str, ...] = (), seed: int, fraction: float = 1.0) -> RunSpec:
    """The part-A run: ``fraction`` of the baseline's batches, evaluated ``evals_per_epoch`` times
    an epoch on the first ``eval_limit`` test images."""
    batches_per_epoch = scale.train_limit // scale.batch_size
    batches = max(1, round(fraction * scale.epochs * batches_per_epoch))
    eval_every = max(1, batches_per_epoch // scale.evals_per_epoch)
    return RunSpec.model_validate(fashion_mnist_base(
        scale, name="recipe-" + ("-".join(methods) or "baseline").replace("_", "") + f"-s{seed}",
        model=scale.model, train_limit=scale.train_limit, eval_limit=scale.eval_limit, batches=batches,
        eval_every=eval_every, algorithms=algorithm_list(methods), seed=seed))


class TrainClock:
    """A trainer callback: wall and CPU seconds of training, with evaluations left out.

    The clock runs from FIT_START and pauses from EVAL_START to EVAL_END. Callbacks run after
    the algorithms at each event, so EMA's swap of the averaged weights into the model counts
    as training (its cost) and the evaluation itself does not. ``at_eval`` holds the clock's
    reading at the start of the latest evaluation."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self._since: tuple[float, float] | None = None
        self.at_eval = (0.0, 0.0)

    def run_event(self, event: Event, state: Any) -> None:
        if event in (Event.FIT_START, Event.EVAL_END):
            self._since = (time.perf_counter(), time.process_time())
        elif event in (Event.EVAL_START, Event.FIT_END) and self._since is not None:
            wall, cpu = self._since
            self.wall += time.perf_counter() - wall
            self.cpu += time.process_time() - cpu
            self._since = None
            if event is Event.EVAL_START:
                self.at_eval = (self.wall, self.cpu)


def measure(spec: RunSpec) -> dict[str, Any]:
    """Train ``spec`` in this process; its accuracy curve against training time."""
    clock, points = TrainClock(), []

    def on_eval(results: dict[str, float]) -> None:
        wall, cpu = clock.at_eval
        points.append({"batch": int(results["time/batch"]), "train_s": wall, "cpu_s": cpu,
                       "accuracy": results["eval/accuracy"]})

    with process_settings(spec):
        trainer = Trainer(spec, callbacks=[clock], on_eval=on_eval)
        trainer.fit()
    return {"name": spec.name, "seed": spec.seed, "methods": [a.name for a in spec.algorithms],
            "batches": trainer.state.max_batches, "final_accuracy": points[-1]["accuracy"],
            "train_s": points[-1]["train_s"], "cpu_s": points[-1]["cpu_s"], "points": points}


def time_to_target(curve: dict[str, Any], target: float) -> dict[str, float] | None:
    """Training time (wall, CPU) at the first evaluation with accuracy >= ``target``."""
    for point in curve["points"]:
        if point["accuracy"] >= target - 1e-9:  # float noise: the baseline reaches its own final
            return {"train_s": point["train_s"], "cpu_s": point["cpu_s"], "batch": point["batch"]}
    return None


def mean_std(values: list[float]) -> dict[str, float]:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return {"mean": math.nan, "std": math.nan, "n": 0}
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}


# --- part A: time to target ----------------------------------------------------------------

def part_a(scale: Scale, log) -> dict[str, Any]:
    seed0 = scale.screen_seed
    baseline0 = measure(run_spec(scale, seed=seed0))
    target0 = baseline0["final_accuracy"]
    base_ttt0 = time_to_target(baseline0, target0)
    log(f"[A] screen seed {seed0}: baseline final acc {target0:.4f}, {baseline0['train_s']:.1f}s train, "
        f"time to target {base_ttt0['train_s']:.1f}s")

    def screened(curve: dict[str, Any], fraction: float) -> dict[str, Any]:
        ttt = time_to_target(curve, target0)
        row = {"methods": curve["methods"], "fraction": fraction, "final_accuracy": curve["final_accuracy"],
               "accuracy_delta": curve["final_accuracy"] - target0,
               "step_time_ratio": (curve["train_s"] / curve["batches"]) / (baseline0["train_s"] / baseline0["batches"]),
               "step_cpu_ratio": (curve["cpu_s"] / curve["batches"]) / (baseline0["cpu_s"] / baseline0["batches"]),
               "ttt_s": ttt and ttt["train_s"], "ttt_ratio": ttt and ttt["train_s"] / base_ttt0["train_s"],
               "ttt_cpu_ratio": ttt and ttt["cpu_s"] / base_ttt0["cpu_s"], "train_s": curve["train_s"]}
        log(f"[A]   {'+'.join(row['methods']) or 'baseline':60} x{fraction:<4} acc {row['final_accuracy']:.4f} "
            f"({row['accuracy_delta']:+.4f}) step x{row['step_time_ratio']:.2f} (cpu x{row['step_cpu_ratio']:.2f}) "
            f"ttt {'%.2fx (cpu %.2fx)' % (row['ttt_ratio'], row['ttt_cpu_ratio']) if ttt else 'not reached'}")
        return row

    screen = []
    for method in scale.screen_methods:
        screen.append(screened(measure(run_spec(scale, methods=(method,), seed=seed0)), 1.0))

    # Combine what helped alone: reached the target sooner, or cheaper steps at no accuracy
    # cost (so it can buy a shorter schedule). Methods that hurt stay out, and are reported.
    # Decided on CPU time: on a shared machine wall time also measures the neighbours.
    helpful = tuple(r["methods"][0] for r in screen
                    if (r["ttt_cpu_ratio"] is not None and r["ttt_cpu_ratio"] < 1.0)
                    or (r["step_cpu_ratio"] < 0.95 and r["accuracy_delta"] > -0.01))
    log(f"[A] helped alone on seed {seed0}: {', '.join(helpful) or 'none'}")
    for fraction in scale.schedule_fractions:  # the combination, on full and shortened schedules
        if helpful and (len(helpful) > 1 or fraction < 1.0):  # a single method at 1.0 is screened
            screen.append(screened(measure(run_spec(scale, methods=helpful, seed=seed0, fraction=fraction)),
                                   fraction))
    for fraction in scale.schedule_fractions[1:]:  # is it the methods, or only the shorter schedule?
        screen.append(screened(measure(run_spec(scale, seed=seed0, fraction=fraction)), fraction))

    reached = [r for r in screen if r["ttt_ratio"] is not None and r["methods"]]
    if reached:
        best = min(reached, key=lambda r: r["ttt_cpu_ratio"])
    else:  # still measured on the fresh seeds, so the report says how far off it is
        best = max((r for r in screen if r["methods"]), key=lambda r: (r["accuracy_delta"], -r["train_s"]))
        log("[A] no recipe reached the baseline's accuracy on the screen seed; confirming the closest")
    recipe = {"methods": best["methods"], "fraction": best["fraction"], "algorithms": algorithm_list(best["methods"])}
    log(f"[A] recipe: {'+'.join(best['methods'])} at x{best['fraction']} of the schedule; fresh seeds {scale.seeds}")

    per_seed = []
    for seed in scale.seeds:  # interleaved: the same load hits both
        baseline = measure(run_spec(scale, seed=seed))
        candidate = measure(run_spec(scale, methods=tuple(best["methods"]), seed=seed, fraction=best["fraction"]))
        target = baseline["final_accuracy"]
        base_ttt, cand_ttt = time_to_target(baseline, target), time_to_target(candidate, target)
        row = {"seed": seed, "target": target, "baseline_ttt_s": base_ttt["train_s"],
               "baseline_ttt_cpu_s": base_ttt["cpu_s"], "baseline_train_s": baseline["train_s"],
               "recipe_final_accuracy": candidate["final_accuracy"], "recipe_train_s": candidate["train_s"],
               "recipe_ttt_s": cand_ttt and cand_ttt["train_s"], "recipe_ttt_cpu_s": cand_ttt and cand_ttt["cpu_s"],
               "ratio": cand_ttt and cand_ttt["train_s"] / base_ttt["train_s"],
               "cpu_ratio": cand_ttt and cand_ttt["cpu_s"] / base_ttt["cpu_s"],
               "baseline_curve": baseline["points"], "recipe_curve": candidate["points"]}
        per_seed.append(row)
        log(f"[A]   seed {seed}: target {target:.4f}; baseline {base_ttt['train_s']:.1f}s, recipe "
            + (f"{cand_ttt['train_s']:.1f}s ({row['ratio']:.2f}x, cpu {row['cpu_ratio']:.2f}x)" if cand_ttt
               else f"not reached (final {candidate['final_accuracy']:.4f})"))
    ratios = [r["ratio"] for r in per_seed]
    return {
        "target_screen": target0, "screen": screen, "helpful_alone": list(helpful), "recipe": recipe,
        "seeds": per_seed,
        "summary": {
            "target": mean_std([r["target"] for r in per_seed]),
            "baseline_ttt_s": mean_std([r["baseline_ttt_s"] for r in per_seed]),
            "recipe_ttt_s": mean_std([r["recipe_ttt_s"] for r in per_seed]),
            "recipe_final_accuracy": mean_std([r["recipe_final_accuracy"] for r in per_seed]),
            "ratio": mean_std(ratios), "cpu_ratio": mean_std([r["cpu_ratio"] for r in per_seed]),
            "reached": sum(r is not None for r in ratios), "of": len(ratios),
            "goal_met": all(r is not None and r <= 0.5 for r in ratios),
        },
    }


# --- part B: ASHA vs grid ------------------------------------------------------------------

def sweep_spec(scale: Scale, scheduler: str) -> dict[str, Any]:
    batches_per_epoch = scale.sweep_train_limit // scale.batch_size
    # Hyperparameters for every pool method; each trial keeps only its set's.
    base = fashion_mnist_base(
        scale, name=f"asha-vs-grid-{scheduler}", model=scale.sweep_model, train_limit=scale.sweep_train_limit,
        eval_limit=scale.sweep_eval_limit, batches=scale.sweep_epochs * batches_per_epoch,
        eval_every=batches_per_epoch, algorithms=algorithm_list(scale.sweep_pool), seed=0)
    return {
        "name": base["name"], "base": base,
        "search": {"algorithms": {"pool": list(scale.sweep_pool), "max_size": scale.sweep_max_size}},
        "metric": "eval/accuracy", "mode": "max",
        "scheduler": ({"name": "asha", "grace_period": f"{batches_per_epoch}ba", "reduction_factor": 3}
                      if scheduler == "asha" else {"name": "fifo"}),
        "max_concurrent_trials": scale.sweep_concurrency,
    }


def _trial_row(trial: Any, max_batches: int, storage: str) -> dict[str, Any]:
    progress = trial.progress if trial.progress is not None else (1.0 if trial.status == "COMPLETED" else 0.0)
    return {"trial_id": trial.trial_id, "algorithms": list(trial.algorithms), "status": str(trial.status),
            "metric": trial.metric, "train_s": trial.train_time_s, "wall_s": trial.wall_time_s,
            "progress": progress, "batches": round(progress * max_batches),
            "reports": _reports(storage, trial.trial_id)}


def _reports(storage: str, trial_id: str) -> list[tuple[float, float]]:
    """(Tune's time_total_s, batches trained) at each of the trial's reports, from Tune's
    result.json. Tune's clock starts with the trial, so it includes starting Ray Train."""
    points = []
    for path in pathlib.Path(storage).glob(f"sweeps/*/tune/{trial_id}/result.json"):
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if "time/batch" in row and "time_total_s" in row:
                    points.append((float(row["time_total_s"]), float(row["time/batch"])))
    return sorted(points)


def startup_s(trials: list[dict[str, Any]]) -> float | None:
    """The median fixed cost of a trial before its first batch (actor, Ray Train controller and
    worker, data), extrapolated from trials with two or more reports: Tune's time is about
    startup + batches * (seconds per batch, evaluations included)."""
    estimates = []
    for trial in trials:
        points = trial["reports"]
        if len(points) >= 2 and points[-1][1] > points[0][1]:
            (t0, b0), (t1, b1) = points[0], points[-1]
            estimates.append(t0 - b0 * (t1 - t0) / (b1 - b0))
    return statistics.median(estimates) if estimates else None


def run_one_sweep(scale: Scale, scheduler: str, storage: str, log) -> dict[str, Any]:
    from api.sweeps import SweepSpec
    from workers.tune import run_sweep

    spec = SweepSpec.model_validate(sweep_spec(scale, scheduler))
    max_batches = scale.sweep_epochs * (scale.sweep_train_limit // scale.batch_size)
    started = time.perf_counter()
    outcome = run_sweep(spec, storage_url=storage, verbose=0)
    wall = time.perf_counter() - started
    trials = [_trial_row(t, max_batches, storage) for t in outcome.trials]
    startup = startup_s(trials)
    finished = [t for t in trials if t["metric"] is not None and math.isfinite(t["metric"])]
    best = max(finished, key=lambda t: t["metric"]) if finished else None
    log(f"[B] {scheduler}: {len(trials)} trials in {wall:.0f}s wall; "
        f"train {sum(t['train_s'] or 0 for t in trials):.0f}s, {sum(t['batches'] for t in trials)} batches; "
        f"best {best and '+'.join(best['algorithms']) or '[]'} ({best and best['metric']:.4f})")
    return {"scheduler": scheduler, "wall_s": wall, "trials": trials, "best": best,
            "train_s": sum(t["train_s"] or 0.0 for t in trials), "batches": sum(t["batches"] for t in trials),
            "startup_s": startup,
            "train_s_after_startup": None if startup is None else sum(
                max(0.0, (t["train_s"] or 0.0) - startup) for t in trials),
            "statuses": {s: sum(t["status"].endswith(s) for t in trials) for s in ("COMPLETED", "STOPPED", "FAILED")}}


def part_b(scale: Scale, log, storage: str, sweeps: tuple[str, ...] = ("fifo", "asha"),
           earlier: dict[str, Any] | None = None) -> dict[str, Any]:
    """ASHA vs grid. ``earlier``: a previous run's part B whose sweeps not named in ``sweeps``
    are reused (to rerun one side only)."""
    import ray

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")  # Train's controller polls less lazily
    # A worker that imports torch on a loaded 2-core machine can take more than the driver's
    # default 30 s to start; a timeout fails the trial attempt (Tune retries it twice).
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "120")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local throwaway cluster
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started_ray = False
    if not ray.is_initialized():
        # More logical CPUs than cores: on 2 cores with num_cpus=2, trials that start trainers
        # wait for each other's workers and hang (WorkerGroupStartupTimeoutError, forever).
        # The dashboard must run: Ray Train's PlacementGroupCleaner asks the State API (served by
        # the dashboard) whether a trial's Train controller is dead before it frees the trial's
        # placement group. Without it every trial ASHA stops keeps its workers' CPUs reserved
        # and later trials time out waiting for workers.
        # address="local": a new cluster of our own, never one a `ray start` left on the machine.
        ray.init(address="local", num_cpus=4, include_dashboard=True, dashboard_host="127.0.0.1",
                 dashboard_port=free_port(), log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT)}})
        started_ray = True
    try:
        grid = run_one_sweep(scale, "fifo", storage, log) if "fifo" in sweeps else earlier["grid"]
        asha = run_one_sweep(scale, "asha", storage, log) if "asha" in sweeps else earlier["asha"]
    finally:
        if started_ray:
            ray.shutdown()
    ranked = sorted((t for t in grid["trials"] if t["metric"] is not None), key=lambda t: -t["metric"])
    asha_best = asha["best"] and asha["best"]["algorithms"]
    rank = next((i + 1 for i, t in enumerate(ranked) if t["algorithms"] == asha_best), None)
    return {
        "grid": grid, "asha": asha,
        "train_time_ratio": asha["train_s"] / grid["train_s"] if grid["train_s"] else math.nan,
        "batch_ratio": asha["batches"] / grid["batches"] if grid["batches"] else math.nan,
        "wall_ratio": asha["wall_s"] / grid["wall_s"],
        "train_time_after_startup_ratio": (asha["train_s_after_startup"] / grid["train_s_after_startup"]
                                           if asha["train_s_after_startup"] and grid["train_s_after_startup"]
                                           else None),
        "same_best": bool(grid["best"] and asha["best"] and grid["best"]["algorithms"] == asha_best),
        "asha_best_rank_in_grid": rank,
        "asha_best_grid_metric_gap": (grid["best"]["metric"] - ranked[rank - 1]["metric"]) if rank else None,
    }


# --- report --------------------------------------------------------------------------------

def fmt(stat: dict[str, float], digits: int = 2, suffix: str = "") -> str:
    if not stat["n"]:
        return "n/a"
    return f"{stat['mean']:.{digits}f}{suffix} ± {stat['std']:.{digits}f}{suffix} (n={stat['n']})"


def print_tables(result: dict[str, Any]) -> None:
    a, b = result.get("part_a"), result.get("part_b")
    if a:
        print("\n== A: time to the baseline's final accuracy (training time, evaluation excluded) ==")
        print(f"screen (seed {result['scale']['screen_seed']}, target {a['target_screen']:.4f}):")
        print(f"  {'methods':58} {'sched':>5} {'final acc':>9} {'Δacc':>7} {'step':>6} {'cpu':>6} "
              f"{'ttt':>12} {'ttt cpu':>8}")
        for r in a["screen"]:
            ttt = f"{r['ttt_ratio']:.2f}x" if r["ttt_ratio"] is not None else "not reached"
            ttt_cpu = f"{r['ttt_cpu_ratio']:.2f}x" if r["ttt_cpu_ratio"] is not None else "-"
            print(f"  {'+'.join(r['methods']) or 'baseline':58} {r['fraction']:5.2f} {r['final_accuracy']:9.4f} "
                  f"{r['accuracy_delta']:+7.4f} {r['step_time_ratio']:5.2f}x {r['step_cpu_ratio']:5.2f}x "
                  f"{ttt:>12} {ttt_cpu:>8}")
        if a["recipe"]:
            s = a["summary"]
            print(f"recipe {'+'.join(a['recipe']['methods'])} on {a['recipe']['fraction']:.2f} of the schedule, "
                  f"seeds {[r['seed'] for r in a['seeds']]}:")
            print(f"  target (baseline final acc)  {fmt(s['target'], 4)}")
            print(f"  baseline time to target      {fmt(s['baseline_ttt_s'], 1, 's')}")
            print(f"  recipe time to target        {fmt(s['recipe_ttt_s'], 1, 's')}  (reached {s['reached']}/{s['of']})")
            print(f"  recipe final accuracy        {fmt(s['recipe_final_accuracy'], 4)}")
            print(f"  ratio recipe/baseline        {fmt(s['ratio'])} wall, {fmt(s['cpu_ratio'])} CPU  "
                  f"(goal <= 0.5: {'met' if s['goal_met'] else 'NOT met'})")
    if b:
        print("\n== B: ASHA vs full grid over the same algorithm sets ==")
        print(f"  {'methods':50} {'grid acc':>9} {'asha acc':>9} {'asha status':>12} {'asha batches':>12}")
        asha = {tuple(t["algorithms"]): t for t in b["asha"]["trials"]}
        for t in sorted(b["grid"]["trials"], key=lambda t: -(t["metric"] or -1)):
            other = asha.get(tuple(t["algorithms"]), {})
            print(f"  {'+'.join(t['algorithms']) or 'baseline':50} {t['metric'] or math.nan:9.4f} "
                  f"{other.get('metric') or math.nan:9.4f} {other.get('status', '-').split('.')[-1]:>12} "
                  f"{other.get('batches', 0):>12}")
        after = b["train_time_after_startup_ratio"]
        print(f"  compute ASHA/grid: batches {b['batch_ratio']:.2f}x; trial time (Tune's, with each trial's "
              f"Ray Train start-up) {b['train_time_ratio']:.2f}x; without start-up "
              f"{'%.2fx' % after if after else 'n/a'}; sweep wall {b['wall_ratio']:.2f}x  (goal <= 0.35)")
        print(f"  per-trial start-up (median estimate): grid {b['grid']['startup_s'] or math.nan:.1f}s, "
              f"asha {b['asha']['startup_s'] or math.nan:.1f}s; trials: grid {b['grid']['statuses']}, "
              f"asha {b['asha']['statuses']}")
        def name(best: dict[str, Any] | None) -> str:
            return "-" if best is None else "+".join(best["algorithms"]) or "baseline"

        print(f"  best: grid {name(b['grid']['best'])}, asha {name(b['asha']['best'])} -> "
              f"{'same' if b['same_best'] else 'different'} (ASHA's pick ranks {b['asha_best_rank_in_grid']} "
              f"in the grid)")


def environment() -> dict[str, Any]:
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import ray
        versions["ray"] = ray.__version__
    except ImportError:
        pass
    return {"versions": versions, "cpus": os.cpu_count(), "machine": platform.machine(),
            "script_sha256": hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    parser.add_argument("--out", help="where to write the JSON results")
    parser.add_argument("--show", metavar="JSON", help="print the tables of an earlier run's results and exit")
    parser.add_argument("--parts", default="ab", help="'a', 'b' or 'ab' (default)")
    parser.add_argument("--storage", default=None, help="Tune storage folder for part B (default: a temp dir)")
    parser.add_argument("--sweeps", default="fifo,asha",
                        help="part B: which sweeps to run; the others are taken from --reuse")
    parser.add_argument("--reuse", metavar="JSON", help="an earlier result: keep its part A (if --parts has "
                        "no 'a') and the part-B sweeps not rerun; the new result notes what was reused")
    args = parser.parse_args()
    if args.show:
        print_tables(json.loads(pathlib.Path(args.show).read_text()))
        return
    if not args.out:
        parser.error("--out is required (or --show an earlier result)")
    scale = QUICK if args.quick else FULL
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"{time.perf_counter() - started:7.1f}s {message}", flush=True)

    result: dict[str, Any] = {"quick": args.quick, "scale": dataclasses.asdict(scale),
                              "method_params": METHOD_PARAMS, **environment()}
    out = pathlib.Path(args.out)

    def save() -> None:  # after each part, so a long run leaves what it has
        result["elapsed_s"] = time.perf_counter() - started
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=str))

    earlier = json.loads(pathlib.Path(args.reuse).read_text()) if args.reuse else {}
    if "a" in args.parts:
        result["part_a"] = part_a(scale, log)
        save()
    elif "part_a" in earlier:
        result["part_a"], result["reused"] = earlier["part_a"], ["part_a"]
    if "b" in args.parts:
        import tempfile
        sweeps = tuple(args.sweeps.split(","))
        with tempfile.TemporaryDirectory(prefix="tsweep") as tmp:
            result["part_b"] = part_b(scale, log, args.storage or tmp, sweeps, earlier.get("part_b"))
        result["reused"] = result.get("reused", []) + [f"part_b.{'grid' if s == 'fifo' else s}"
                                                       for s in ("fifo", "asha") if s not in sweeps]
        save()
    print_tables(result)
    log(f"results in {out}")


if __name__ == "__main__":
    main()
