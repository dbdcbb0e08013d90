"""The Tune side of a SweepSpec without running Tune: search space, scheduler, concurrency, paths."""

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search.sample import Categorical, Float

from api.sweeps import SweepSpec, grace_fraction
from workers.paths import failed_trials_url
from workers.paths import sweep_experiment_path as experiment_path
from workers.tune import (
    TRIAL_ACTOR_CPUS,
    build_param_space,
    build_scheduler,
    max_concurrent_trials,
)
from workers.tune import run_sweep
from workers.tune.space import trains_in_trial_actor, trial_resources

BASE = {
    "name": "digits",
    "model": {"name": "simple_cnn"},
    "data": {"train": {"name": "digits"}, "eval": {"name": "digits", "split": "test"}, "batch_size": 64},
    "optimizer": {"name": "sgd", "lr": 0.1},
    "max_duration": "4ep",
    "eval_interval": "1ep",
}


def sweep(**changes) -> SweepSpec:
    body = {"name": "s", "base": BASE,
            "search": {"algorithms": {"sets": [[], ["label_smoothing"]]},
                       "params": {"optimizer.lr": {"grid": [0.1, 0.05]},
                                  "optimizer.momentum": {"choice": [0.0, 0.9]},
                                  "optimizer.weight_decay": {"uniform": [0.0, 0.01]},
                                  "algorithms.label_smoothing.smoothing": {"loguniform": [0.01, 0.2]}}}}
    body.update(changes)
    return SweepSpec.model_validate(body)


def test_the_param_space_grids_the_algorithm_sets_and_maps_each_domain_kind():
    space = build_param_space(sweep())
    assert space["algorithms"] == tune.grid_search([[], ["label_smoothing"]])
    params = space["params"]
    assert params["optimizer.lr"] == tune.grid_search([0.1, 0.05])
    assert isinstance(params["optimizer.momentum"], Categorical)
    assert params["optimizer.momentum"].categories == [0.0, 0.9]
    weight_decay, smoothing = params["optimizer.weight_decay"], params["algorithms.label_smoothing.smoothing"]
    assert isinstance(weight_decay, Float) and (weight_decay.lower, weight_decay.upper) == (0.0, 0.01)
    assert isinstance(smoothing, Float) and (smoothing.lower, smoothing.upper) == (0.01, 0.2)
    assert type(smoothing.get_sampler()).__name__ == "_LogUniform"


def test_without_an_algorithm_search_the_only_set_is_the_base_list():
    spec = sweep(base={**BASE, "algorithms": [{"name": "channels_last"}]}, search={"params": {}})
    assert build_param_space(spec) == {"algorithms": tune.grid_search([["channels_last"]]), "params": {}}


def test_fifo_is_tunes_fifo():
    assert isinstance(build_scheduler(sweep()), FIFOScheduler)


def test_asha_decides_on_progress_with_the_grace_period_as_a_fraction_of_the_duration():
    spec = sweep(scheduler={"name": "asha", "grace_period": "1ep", "reduction_factor": 2}, mode="max")
    scheduler = build_scheduler(spec)
    assert isinstance(scheduler, ASHAScheduler)
    assert grace_fraction(spec) == 0.25
    assert scheduler._time_attr == "time/progress" and scheduler._max_t == 1.0
    assert scheduler._metric == "eval/accuracy" and scheduler._mode == "max"
    assert scheduler._reduction_factor == 2
    # Rungs at 1/4 and 1/2 of the duration (a hair under, so a float progress reaches them).
    assert [round(m, 4) for m, _ in scheduler._brackets[0]._rungs] == [0.5, 0.25]
    assert scheduler._stop_last_trials is False  # a trial at max_t finishes and reports COMPLETED


def test_a_grace_period_in_dur_is_used_as_is():
    spec = sweep(scheduler={"name": "asha", "grace_period": "0.5dur"})
    assert grace_fraction(spec) == 0.5
    assert [round(m, 4) for m, _ in build_scheduler(spec)._brackets[0]._rungs] == [0.5]


@pytest.mark.parametrize("cpus, num_workers, cpus_per_worker, asked, expected", [
    (4, 1, 1, 2, 2),    # the spec's cap binds
    (4, 1, 1, 8, 3),    # 3 × (0.25 + 1) fit in 4 CPUs
    (4, 2, 1, 8, 1),    # 2.25 each
    (4, 1, 2, 8, 1),
    (2, 2, 1, 8, 1),    # never below one: that trial fails fast and Tune retries it
])
def test_concurrency_is_capped_by_what_the_cluster_cpus_hold(cpus, num_workers, cpus_per_worker, asked, expected):
    base = {**BASE, "parallelism": {"strategy": "ddp" if num_workers > 1 else "none", "num_workers": num_workers,
                                    "cpus_per_worker": cpus_per_worker}}
    spec = sweep(base=base, max_concurrent_trials=asked, search={"params": {}})
    assert max_concurrent_trials(spec, {"CPU": cpus}) == expected


def test_a_searched_worker_count_is_planned_at_its_largest():
    base = {**BASE, "parallelism": {"strategy": "ddp", "num_workers": 1}}
    spec = sweep(base=base, max_concurrent_trials=8,
                 search={"params": {"parallelism.num_workers": {"grid": [1, 4]}}})
    assert max_concurrent_trials(spec, {"CPU": 8}) == int(8 // (TRIAL_ACTOR_CPUS + 4))


def test_the_experiment_lives_under_the_sweep_in_storage():
    assert experiment_path("file:///data/tessera", "sw1") == "/data/tessera/sweeps/sw1/tune"
    assert experiment_path("/data/tessera/", "sw1") == "/data/tessera/sweeps/sw1/tune"
    assert experiment_path("s3://bucket/root", "sw1") == "s3://bucket/root/sweeps/sw1/tune"
    # Beside the experiment, not in it: Tune owns its experiment folder.
    assert failed_trials_url("s3://bucket/root", "sw1") == "s3://bucket/root/sweeps/sw1/failed-trials"


def test_one_worker_trials_train_in_their_trial_actor_with_the_workers_resources():
    spec = sweep()  # strategy none, nothing under parallelism searched
    assert trains_in_trial_actor(spec)
    assert trial_resources(spec, in_actor=True) == {"CPU": 1}
    gpu = sweep(base={**BASE, "parallelism": {"use_gpu": True, "cpus_per_worker": 2}})
    assert trains_in_trial_actor(gpu) and trial_resources(gpu, in_actor=True) == {"CPU": 2, "GPU": 1}
    # The actor is the worker: 4 CPUs hold 4 one-CPU trials, not 3 (0.25 + 1 each).
    assert max_concurrent_trials(sweep(max_concurrent_trials=8), {"CPU": 4}, in_actor=True) == 4
    assert max_concurrent_trials(sweep(max_concurrent_trials=8), {"CPU": 4}, in_actor=False) == 3


def test_cpu_ddp_and_fsdp_trials_train_in_their_actor_with_a_bundle_per_rank():
    for strategy in ("ddp", "fsdp"):
        spec = sweep(base={**BASE, "parallelism": {"strategy": strategy, "num_workers": 4, "cpus_per_worker": 2}})
        assert trains_in_trial_actor(spec)
        resources = trial_resources(spec, in_actor=True)
        # Bundle 0 is the trial actor's (rank 0), the others its peers'.
        assert resources.bundles == [{"CPU": 2}] * 4 and resources.required_resources == {"CPU": 8}
    # A process group of one: the actor alone.
    one = sweep(base={**BASE, "parallelism": {"strategy": "ddp", "num_workers": 1}})
    assert trains_in_trial_actor(one) and trial_resources(one, in_actor=True) == {"CPU": 1}
    # Tune accounts for every rank's bundle: 8 CPUs hold two 2 x 2-CPU trials.
    spec = sweep(base={**BASE, "parallelism": {"strategy": "ddp", "num_workers": 2, "cpus_per_worker": 2}},
                 max_concurrent_trials=8)
    assert max_concurrent_trials(spec, {"CPU": 8}, in_actor=True) == 2


@pytest.mark.parametrize("parallelism, searched", [
    ({"strategy": "ddp", "num_workers": 2, "use_gpu": True}, {}),  # NCCL: see workers.tune.actor_ranks
    ({"strategy": "ddp", "num_workers": 1}, {"parallelism.num_workers": {"grid": [1, 2]}}),
    ({"strategy": "none"}, {"parallelism.cpus_per_worker": {"grid": [1, 2]}}),  # trials would differ in resources
])
def test_gpu_process_groups_or_searched_resources_start_a_worker_group(parallelism, searched):
    spec = sweep(base={**BASE, "parallelism": parallelism}, search={"params": searched})
    assert not trains_in_trial_actor(spec)
    assert trial_resources(spec, in_actor=False) == {"CPU": TRIAL_ACTOR_CPUS}
    # Forcing such trials into their actor would train ranks of several shapes: refused, before Ray.
    with pytest.raises(ValueError, match="in_actor=True needs trials of one shape"):
        run_sweep(spec, in_actor=True)


def test_run_sweep_creates_the_external_sweep_in_the_project_it_is_given():
    asked = []

    class Refusing:
        def create_sweep(self, spec, **options):
            asked.append(options)
            raise RuntimeError("stop before Ray")

    spec = sweep(base=BASE, search={})
    with pytest.raises(RuntimeError, match="stop before Ray"):
        run_sweep(spec, client=Refusing(), project="vision")
    assert asked == [{"driver": "external", "project": "vision"}]
    with pytest.raises(ValueError, match="pass client= as well"):
        run_sweep(spec, project="vision")


def test_ray_asha_keeps_its_rungs_where_the_driver_edits_them():
    """Pins the Ray behaviour ``workers.tune.space._drop_rung_at_max_t`` depends on: ASHA keeps
    its rungs as ``_brackets[i]._rungs``, ``(milestone, recorded)`` pairs highest first, and
    puts one at ``max_t`` when grace × rf^k lands on it. A Ray that changes either fails here."""
    raw = ASHAScheduler(time_attr="time/progress", metric="eval/accuracy", mode="max", max_t=1.0,
                        grace_period=0.25 * (1 - 1e-6), reduction_factor=2, stop_last_trials=False)
    rungs = raw._brackets[0]._rungs
    assert all(isinstance(recorded, dict) for _, recorded in rungs)
    assert [round(m, 4) for m, _ in rungs] == [1.0, 0.5, 0.25]
