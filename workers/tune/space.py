"""A ``SweepSpec`` in Tune's terms: the search space, the trial scheduler, the concurrency."""

from __future__ import annotations

import logging
from typing import Any

from ray import tune

from api.sweeps import SweepSpec, algorithm_sets, grace_fraction

log = logging.getLogger("workers.tune")

PROGRESS = "time/progress"  # Tune's time attribute: the fraction of max_duration trained, 0..1
TRIAL_ACTOR_CPUS = 0.25     # a trial actor that only waits on its trainer; its workers ask for their own


def trained_to_end(progress: float | None) -> bool:
    """Whether a trial whose last report had ``progress`` (``PROGRESS``) trained its full duration."""
    return progress is not None and progress >= 1.0 - 1e-9


def trains_in_trial_actor(spec: SweepSpec) -> bool:
    """Whether every trial of ``spec`` trains in its Tune actor, which Tune reuses for the next
    trial (``workers.tune.actor_ranks``): nothing under ``parallelism`` searched (so every trial
    needs the same resources), and one worker (strategy ``none``) or DDP/FSDP on CPUs, whose
    other ranks are peer actors the trial actor keeps with their process group. No Ray Train
    controller and worker group to start per trial; the imports, the data set, the loader's
    fork server and the process group are already there. GPU DDP/FSDP trials take a Ray Train
    worker group (why: ``workers.tune.actor_ranks``)."""
    parallelism = spec.base.parallelism
    if any(path.startswith("parallelism.") for path in spec.search.params):
        return False
    return parallelism.strategy == "none" or not parallelism.use_gpu


def trial_resources(spec: SweepSpec, *, in_actor: bool) -> dict[str, float] | tune.PlacementGroupFactory:
    """What a trial asks Ray for: when it trains in its actor, one bundle per rank (the first is
    the actor's, the others its peers'); otherwise the actor that waits on its trainer."""
    if not in_actor:
        return {"CPU": TRIAL_ACTOR_CPUS}
    parallelism = spec.base.parallelism
    rank = {"CPU": parallelism.cpus_per_worker, **({"GPU": 1} if parallelism.use_gpu else {})}
    if parallelism.num_workers == 1:
        return rank
    return tune.PlacementGroupFactory([dict(rank) for _ in range(parallelism.num_workers)])


def build_param_space(spec: SweepSpec) -> dict[str, Any]:
    """Tune's ``param_space``: ``{"algorithms": grid over the valid sets, "params": {path: domain}}``."""
    sets, _ = algorithm_sets(spec)
    params: dict[str, Any] = {}
    for path, domain in spec.search.params.items():
        if domain.grid is not None:
            params[path] = tune.grid_search(list(domain.grid))
        elif domain.choice is not None:
            params[path] = tune.choice(list(domain.choice))
        elif domain.uniform is not None:
            params[path] = tune.uniform(*domain.uniform)
        else:
            params[path] = tune.loguniform(*domain.loguniform)
    return {"algorithms": tune.grid_search([list(s) for s in sets]), "params": params}


def build_scheduler(spec: SweepSpec):
    """FIFO, or ASHA on ``time/progress`` (``max_t=1.0``) with the grace period as a fraction."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if spec.scheduler.name == "fifo":
        return FIFOScheduler()
    scheduler = ASHAScheduler(
        time_attr=PROGRESS, metric=spec.metric, mode=spec.mode, max_t=1.0,
        # progress is batches / max_batches: a float that can land a hair under the rung.
        grace_period=grace_fraction(spec) * (1 - 1e-6),
        reduction_factor=spec.scheduler.reduction_factor,
        # A trial that reached max_t has trained fully: let its trainable finish and report
        # COMPLETED instead of being stopped at its last evaluation.
        stop_last_trials=False)
    _drop_rung_at_max_t(scheduler)
    return scheduler


def _drop_rung_at_max_t(scheduler: Any) -> None:
    """ASHA places a rung at max_t when grace × rf^k lands on it (0.25 × 2²); a decision there
    would only kill a finished trial before it reports COMPLETED, so drop that rung.

    Ray has no public way to say so: this edits Ray 2.60's private ``_brackets[i]._rungs``, a
    list of ``(milestone, recorded)`` tuples, highest first.
    ``tests/workers/test_tune_space.py::test_ray_asha_keeps_its_rungs_where_the_driver_edits_them``
    pins that layout and the rung at max_t, so a Ray upgrade that changes either fails there
    (without this edit the rung would only cost that one late decision)."""
    for bracket in getattr(scheduler, "_brackets", ()):
        if hasattr(bracket, "_rungs"):
            bracket._rungs = [rung for rung in bracket._rungs if rung[0] < 1.0 - 1e-3]


def max_concurrent_trials(spec: SweepSpec, cluster_resources: dict[str, float], *, in_actor: bool = False) -> int:
    """At most ``spec.max_concurrent_trials``, and no more trials than the cluster's CPUs (and
    GPUs) hold with every trial's actor and workers running; at least 1. ``in_actor``: the
    trial actor and its peers are the workers (``trains_in_trial_actor``).

    A trial's trainer workers are scheduled by Ray Train, outside Tune's accounting (Tune only
    sees the trial actor's ``TRIAL_ACTOR_CPUS``), so without this cap Tune would start trials
    whose workers can never be placed. (A trial that trains in its actor is accounted by Tune,
    its peers' bundles included; the cap then only keeps to the spec's.)"""
    base = spec.base.parallelism
    workers = max([base.num_workers, *_searched_values(spec, "parallelism.num_workers")])
    cpus = max([base.cpus_per_worker, *_searched_values(spec, "parallelism.cpus_per_worker")])
    needs = workers * cpus + (0 if in_actor else TRIAL_ACTOR_CPUS)
    fits = int(cluster_resources.get("CPU", 0) // needs)
    if base.use_gpu:
        fits = min(fits, int(cluster_resources.get("GPU", 0) // workers))
    if fits < 1:
        log.warning("a trial needs %.2f CPUs but the cluster has %s: trials will fail to get workers",
                    needs, cluster_resources.get("CPU", 0))
    return max(1, min(spec.max_concurrent_trials, fits))


def _searched_values(spec: SweepSpec, path: str) -> list[int]:
    domain = spec.search.params.get(path)
    return [int(v) for v in domain.extremes()] if domain is not None else []
