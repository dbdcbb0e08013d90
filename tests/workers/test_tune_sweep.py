"""Real Ray Tune sweeps without a service, over the session's Ray head: one-worker trials train
in one reused trial actor, ASHA stops a weak trial, the outcome names statuses, the best trial
and the Pareto front, and every trial's MLflow run ends (the stopped one's by the driver); a
trial whose actor is killed is retried and resumes from its checkpoint; DDP trials train in the
reused actor and its kept peer, which a dead peer replaces.

Each sweep costs ~10-20 s (a trial actor training a small CNN on digits)."""

import json
import re
import time
from pathlib import Path

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
    # The trials log to MLflow (a store in an SQLite file, made here before the trials share it).
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(tracking_uri=store).search_experiments()
    spec = SweepSpec.model_validate({
        "name": "lr", "base": {**BASE, "loggers": [{"name": "mlflow", "tracking_uri": store, "experiment": "lr"}]},
        "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1, 1e-4]}}},
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
    # One-worker trials train in their trial actor, and Tune reused it for all three (a stopped
    # trial included): every result of every trial came from one process, an actor's.
    reporters = trial_processes(tmp_path)
    assert set(reporters) == {t.trial_id for t in outcome.trials}, reporters
    assert len(frozenset().union(*reporters.values())) == 1, reporters
    # Every actor the sweep started ends with it.
    wait_until(lambda: not set(live_training_actors(ray_head)) - before, timeout=60,
               what="every trial's actors to end")
    # Each trial's MLflow run ended once the sweep did: the completed ones by their rank 0, and
    # the stopped one, last (Tune ends its actor rather than reusing it, often before its rank 0
    # unwinds), by the driver: FINISHED, as a normal outcome of the sweep, tagged STOPPED.
    client = MlflowClient(tracking_uri=store)
    found = client.search_runs([client.get_experiment_by_name("lr").experiment_id])
    runs = {run.info.run_name.removeprefix("lr-"): run for run in found}  # trial specs are named so
    assert len(found) == len(runs) == 3
    assert {lr: (runs[t.trial_id].info.status, runs[t.trial_id].data.tags.get("tessera.status"))
            for lr, t in by_lr.items()} == {0.05: ("FINISHED", "COMPLETED"), 0.1: ("FINISHED", "COMPLETED"),
                                             1e-4: ("FINISHED", "STOPPED")}


def test_a_trial_that_never_reports_the_swept_metric_fails_naming_what_it_reported(ray_client, ray_head, tmp_path):
    """A metric of your own that returns other names than the sweep decides on: ASHA's Tune would
    abort the whole sweep at the first result without it; each trial fails instead, saying why."""
    spec = SweepSpec.model_validate({
        "name": "own", "base": {**BASE,
                                "eval_metrics": [{"import": "tests.workers.test_tune_sweep:constant_metric"}]},
        "search": {"params": {"optimizer.lr": {"grid": [0.1]}}}, "metric": "eval/pr_auc", "mode": "max",
        "scheduler": {"name": "asha", "grace_period": "1ep", "reduction_factor": 2}})
    outcome = run_sweep(spec, storage_url=f"file://{tmp_path}", verbose=0)
    [trial] = outcome.trials
    assert trial.status == "FAILED" and outcome.best is None
    assert ("metric: the sweep decides on eval/pr_auc, but this evaluation reported eval/accuracy, "
            "eval/constant_metric, eval/loss") in trial.error


def constant_metric(outputs, targets):
    """A metric of your own for the sweep above, importable on the workers (the tests are on their path)."""
    return 0.5


def test_a_trial_whose_actor_is_killed_is_retried_and_resumes_from_its_checkpoint(ray_client, ray_head, tmp_path,
                                                                                   monkeypatch):
    # 1437 digits / 64 = 22 full batches an epoch: a checkpoint at batch 22, a SIGKILL of the
    # trial actor (it is the worker) at batch 30, once.
    monkeypatch.setenv("TESSERA_TEST_KILL_AT_BATCH", "30")
    monkeypatch.setenv("TESSERA_TEST_KILL_MARKER", str(tmp_path / "killed"))
    spec = SweepSpec.model_validate({
        "name": "killed", "base": {**BASE, "checkpoint": {"interval": "1ep"}},
        "search": {"params": {"optimizer.lr": {"grid": [0.1]}}}, "max_concurrent_trials": 1})
    outcome = run_sweep(spec, storage_url=f"file://{tmp_path / 'storage'}", verbose=0)

    assert (tmp_path / "killed").is_file()  # the kill happened: the rest ran in a new actor
    [trial] = outcome.trials
    assert trial.status == "COMPLETED" and trial.progress == 1.0 and trial.metric > 0.5, trial
    assert_resumed_from_the_checkpoint_before_the_kill(tmp_path)


def assert_resumed_from_the_checkpoint_before_the_kill(tmp_path) -> None:
    """The retry resumed from batch 22: that checkpoint was written before the kill (at batch 30)
    and never again (a fresh start would have saved it anew), and the final one (44) after."""
    [run] = (tmp_path / "storage" / "runs").iterdir()
    checkpoints = {int(m.group(1)): p for p in (run / "checkpoints").iterdir() if (m := re.search(r"ba(\d+)$", p.name))}
    assert sorted(checkpoints) == [22, 44], sorted(checkpoints)
    killed_at = (tmp_path / "killed").stat().st_mtime
    assert newest_write(checkpoints[22]) < killed_at < newest_write(checkpoints[44])


def live_training_actors(ray_head) -> list[str]:
    """Ids of the live trial actors, Train controllers and Train workers on the head."""
    from ray.util.state import list_actors

    alive = list_actors(address=ray_head.dashboard_url, filters=[("state", "=", "ALIVE")], limit=1000)
    return [a.actor_id for a in alive
            if a.class_name in ("TrainController", "RayTrainWorker", "ImplicitFunc", "_PeerRank")]


def newest_write(folder) -> float:
    return max(p.stat().st_mtime for p in folder.rglob("*") if p.is_file())


def trial_processes(storage) -> dict[str, frozenset[tuple[str, int]]]:
    """Each trial's reporting processes, as (node, pid), from the results Tune wrote to the
    sweep's experiment folder (every result carries its process's ``pid`` and ``node_ip``).

    Read from the results, not from Ray's state API: in three full suite runs (hundreds of
    actors on the session's head) ``list_actors``, filtered by class and then by job and
    class, never listed the trial actor of a sweep that had completed, while the test passed
    alone and with the rest of ``tests/workers``. Why was not found (the GCS keeps 100,000
    dead actors); the results are what the trials themselves wrote."""
    processes: dict[str, set[tuple[str, int]]] = {}
    for results in Path(storage, "sweeps").rglob("result.json"):
        for line in results.read_text().splitlines():
            result = json.loads(line)
            processes.setdefault(result["trial_id"], set()).add((result["node_ip"], result["pid"]))
    return {trial_id: frozenset(found) for trial_id, found in processes.items()}


def wait_until(condition, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(1)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ddp_and_fsdp_trials_train_on_one_kept_process_group_across_a_stop(strategy, ray_client, ray_head, tmp_path,
                                                                           monkeypatch):
    # CPU DDP/FSDP trials train in their trial actor (rank 0) and one peer actor (rank 1), whose
    # process group the next trial reuses (FSDP's device mesh included). lr 1e-4, second of three, is stopped by ASHA at the
    # rung (as in the one-worker test above): the third trial then trains on the same group.
    monkeypatch.setenv("TESSERA_TEST_RANKS_DIR", str(tmp_path / "ranks"))
    (tmp_path / "ranks").mkdir()
    spec = SweepSpec.model_validate({
        "name": strategy, "base": {**BASE, "parallelism": {"strategy": strategy, "num_workers": 2}},
        "search": {"params": {"optimizer.lr": {"grid": [0.05, 1e-4, 0.1]}}},
        "scheduler": {"name": "asha", "grace_period": "1ep", "reduction_factor": 2}, "max_concurrent_trials": 1})
    before = set(live_training_actors(ray_head))
    outcome = run_sweep(spec, storage_url=f"file://{tmp_path / 'storage'}", verbose=0)

    by_lr = {t.params["optimizer.lr"]: t for t in outcome.trials}
    assert {lr: t.status for lr, t in by_lr.items()} == {0.05: "COMPLETED", 1e-4: "STOPPED", 0.1: "COMPLETED"}
    assert by_lr[1e-4].progress == pytest.approx(0.5) and by_lr[0.1].progress == 1.0
    assert by_lr[0.1].metric > 0.5, by_lr[0.1]
    # Every trial's rank 0 was the one trial actor, and its rank 1 the one peer.
    ranks = rank_processes(tmp_path / "ranks")
    assert len(ranks) == 3 and all(sorted(pids) == [0, 1] for pids in ranks.values()), ranks
    [rank0] = set().union(*(pids[0] for pids in ranks.values()))
    [rank1] = set().union(*(pids[1] for pids in ranks.values()))
    [actor] = frozenset().union(*trial_processes(tmp_path / "storage").values())
    assert rank0 == actor[1] != rank1
    # Both ranks checkpointed every completed trial in step (DCP's files are __{rank}_{n}).
    for trial in (by_lr[0.05], by_lr[0.1]):
        [final] = (tmp_path / "storage" / "runs").glob(f"*{trial.trial_id}/checkpoints/*ba44")
        assert {re.match(r"__(\d+)_", p.name)[1] for p in final.glob("*.distcp")} == {"0", "1"}
    wait_until(lambda: not set(live_training_actors(ray_head)) - before, timeout=60,
               what="the trial actor and its peer to end")


def test_a_ddp_trial_whose_peer_dies_restarts_on_a_new_group_from_its_checkpoint(ray_client, ray_head, tmp_path,
                                                                                  monkeypatch):
    # Rank 1 (the peer) SIGKILLs itself at batch 30, once: the trial actor kills the group,
    # trains again (max_restarts 1) on a new peer from the checkpoint at batch 22, and completes.
    monkeypatch.setenv("TESSERA_TEST_KILL_AT_BATCH", "30")
    monkeypatch.setenv("TESSERA_TEST_KILL_MARKER", str(tmp_path / "killed"))
    monkeypatch.setenv("TESSERA_TEST_RANKS_DIR", str(tmp_path / "ranks"))
    (tmp_path / "ranks").mkdir()
    spec = SweepSpec.model_validate({
        "name": "peer-killed",
        "base": {**BASE, "parallelism": {"strategy": "ddp", "num_workers": 2}, "max_restarts": 1,
                 "checkpoint": {"interval": "1ep"}},
        "search": {"params": {"optimizer.lr": {"grid": [0.1]}}}, "max_concurrent_trials": 1})
    outcome = run_sweep(spec, storage_url=f"file://{tmp_path / 'storage'}", verbose=0)

    assert (tmp_path / "killed").is_file()
    [trial] = outcome.trials
    assert trial.status == "COMPLETED" and trial.progress == 1.0 and trial.metric > 0.5, trial
    # Rank 0 stayed in the trial actor; rank 1 trained in two processes, the second after the kill.
    [pids] = rank_processes(tmp_path / "ranks").values()
    assert len(pids[0]) == 1 and len(pids[1]) == 2, pids
    assert_resumed_from_the_checkpoint_before_the_kill(tmp_path)


def rank_processes(folder) -> dict[str, dict[int, set[int]]]:
    """Each run's ranks and the processes that trained them, from ``TESSERA_TEST_RANKS_DIR``."""
    found: dict[str, dict[int, set[int]]] = {}
    for path in Path(folder).iterdir():
        run_id, rank, pid = re.fullmatch(r"(.+)\.rank(\d+)\.pid(\d+)", path.name).groups()
        found.setdefault(run_id, {}).setdefault(int(rank), set()).add(int(pid))
    return found


def test_a_kept_peer_that_died_between_trials_is_replaced_before_the_next(ray_client, ray_head):
    # This process plays the trial actor (rank 0); its peer is a real Ray actor.
    import psutil
    import torch.distributed as dist

    from api.specs import RunSpec
    from workers.tune import actor_ranks

    spec = RunSpec.model_validate({**BASE, "parallelism": {"strategy": "ddp", "num_workers": 2}})
    try:
        first = actor_ranks._peer_group(spec)
        assert actor_ranks._peer_group(spec) is first  # it answers: kept
        peer_process = psutil.Process(first.pids[0])
        ray_client.kill(first.peers[0])  # asynchronous: a ping right after may still be answered
        peer_process.wait(timeout=60)
        second = actor_ranks._peer_group(spec)  # the ping fails: a new peer and a new process group
        assert second is not first and second.pids != first.pids
        assert dist.get_world_size() == 2 and ray_client.get(second.peers[0].ping.remote()) == second.pids[0]
    finally:
        actor_ranks._tear_down()
    assert not dist.is_initialized()


def test_a_peer_still_in_the_trial_after_rank_0_finished_it_costs_the_group_not_the_result(
        ray_client, monkeypatch):
    # Rank 0 (faked here) trained the trial to its end, so its final checkpoint is committed; a
    # peer (a real actor) that has not left the trial PEERS_END_S later is killed with the group,
    # and rank 0's metrics are still the trial's.
    import threading

    from api.specs import RunSpec
    from workers.tune import actor_ranks

    class LatePeer:
        def train(self, config, rank, world_size):
            threading.Event().wait()  # never leaves the trial

        def ping(self):
            return "alive"

    peer = ray_client.remote(LatePeer).remote()
    assert ray_client.get(peer.ping.remote()) == "alive"
    group = actor_ranks._PeerGroup(key=(2, 1), peers=[peer], pids=[0])

    def kept_group(spec):
        monkeypatch.setattr(actor_ranks, "_GROUP", group)
        return group

    monkeypatch.setattr(actor_ranks, "_peer_group", kept_group)
    monkeypatch.setattr(actor_ranks, "_train_rank", lambda config, rank, world_size, on_eval: {"eval/accuracy": 0.9})
    monkeypatch.setattr(actor_ranks, "PEERS_END_S", 0.5)
    spec = RunSpec.model_validate({**BASE, "parallelism": {"strategy": "ddp", "num_workers": 2}})
    assert actor_ranks._train_with_peers(spec, {"run_id": "r"}, report=lambda results: None) == {"eval/accuracy": 0.9}
    assert actor_ranks._GROUP is None  # dropped: the next trial makes a new group
    with pytest.raises(ray_client.exceptions.RayActorError):  # and the late peer was killed
        ray_client.get(peer.ping.remote(), timeout=60)
