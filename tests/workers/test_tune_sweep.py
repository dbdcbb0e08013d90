"""A real Ray Tune sweep without a service, over the session's Ray head: trials train with Ray
Train, ASHA stops a weak trial, the outcome names statuses, the best trial and the Pareto front.

One sweep on purpose: it costs ~40 s and ~3 GB (a trial actor, a Train controller and a worker)."""

import time

import pytest

from api.sweeps import SweepSpec
from tests.workers.helpers_specs import SWEEP_BASE
from workers.paths import sweep_experiment_path as experiment_path
from workers.tune import run_sweep

pytestmark = pytest.mark.integration

BASE = SWEEP_BASE


def test_asha_stops_the_weak_trial_and_the_outcome_ranks_the_completed_ones(ray_client, ray_head, tmp_path):
    # One trial at a time makes ASHA's rung deterministic: after one epoch lr 0.05 reaches ~0.3
    # eval accuracy, lr 0.1 ~0.45 (at least the first, so it goes on) and lr 1e-4 ~0.1, below
    # the median of the two before it, so it is stopped at the rung (half the duration).
    spec = SweepSpec.model_validate({
        "name": "lr", "base": BASE, "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1, 1e-4]}}},
        "scheduler": {"name": "asha", "grace_period": "1ep", "reduction_factor": 2},
        "max_concurrent_trials": 1})

    # Other tests share this Ray head (and, rarely, leave a Train controller behind): only the
    # actors this sweep starts must be gone at the end.
    before = set(live_training_actors(ray_head))
    outcome = run_sweep(spec, storage_url=f"file://{tmp_path}", verbose=0)

    by_lr = {t.params["optimizer.lr"]: t for t in outcome.trials}
    assert sorted(by_lr) == [1e-4, 0.05, 0.1]
    assert {lr: t.status for lr, t in by_lr.items()} == {0.05: "COMPLETED", 0.1: "COMPLETED", 1e-4: "STOPPED"}
    assert by_lr[1e-4].progress == pytest.approx(0.5) and by_lr[0.1].progress == 1.0
    assert all(t.run_id is None and t.algorithms == [] and t.error is None for t in outcome.trials)
    assert all(t.wall_time_s > 0 and t.train_time_s > 0 for t in outcome.trials)
    assert by_lr[0.1].metric > by_lr[0.05].metric > by_lr[1e-4].metric
    assert outcome.best == by_lr[0.1] and outcome.sweep_id is None and outcome.skipped == []
    # The front holds the best trial and only COMPLETED ones; the stopped trial is never on it.
    assert by_lr[0.1].trial_id in outcome.pareto
    assert set(outcome.pareto) <= {by_lr[0.05].trial_id, by_lr[0.1].trial_id}
    # The experiment lives where a restarted driver would look for it.
    assert (tmp_path / "sweeps").is_dir() and experiment_path(f"file://{tmp_path}", "x").startswith(str(tmp_path))
    # Stopping a trial ends its trial actor, and with it the Train controller and workers it owns.
    wait_until(lambda: not set(live_training_actors(ray_head)) - before, timeout=60,
               what="every trial's actors to end")


def live_training_actors(ray_head) -> list[str]:
    """Ids of the live trial actors, Train controllers and Train workers on the head."""
    from ray.util.state import list_actors

    alive = list_actors(address=ray_head.dashboard_url, filters=[("state", "=", "ALIVE")], limit=1000)
    return [a.actor_id for a in alive if a.class_name in ("TrainController", "RayTrainWorker", "ImplicitFunc")]


def wait_until(condition, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(1)
