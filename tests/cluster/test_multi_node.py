"""Tessera on a multi-node Ray cluster (one machine, four Ray nodes on four addresses, token
auth, S3 storage): a DDP run spans two nodes, and so do a DDP sweep's ranks, kept from trial to
trial; losing a node mid-run or the head itself costs no run and no result.

One cluster and one service serve the module; each test leaves the cluster whole again.
"""

from __future__ import annotations

import copy

import httpx
import pytest

from api.views import TERMINAL_STATUSES, RunStatus
from tests.cluster.conftest import NODE_NAMES
from tests.e2e.conftest import wait_for_status, wait_until
from tests.e2e.test_vertical_slice import EXAMPLE
from tests.workers.checkpoint_helpers import assert_bitwise_equal

pytestmark = pytest.mark.integration

BATCHES, INTERVAL = 48, 8


def cluster_spec(name: str) -> dict:
    """Two DDP workers of one logical CPU each (every node has one), deterministic, with a
    checkpoint every INTERVAL batches and one worker-group restart allowed."""
    spec = copy.deepcopy(EXAMPLE)
    spec.update(name=name, model={"name": "simple_cnn", "params": {"width": 8, "hidden": 16}},
                data={"train": {"name": "synthetic", "num_samples": 512, "image_size": 8, "num_classes": 4},
                      "batch_size": 16},
                max_duration=f"{BATCHES}ba", eval_interval=None, algorithms=[], deterministic=True,
                max_restarts=1, checkpoint={"interval": f"{INTERVAL}ba", "keep_last": 2},
                parallelism={"strategy": "ddp", "num_workers": 2, "cpus_per_worker": 1})
    return spec


def first_commit(client, run_id: str):
    return wait_until(lambda: [c for c in client.list_checkpoints(run_id) if c.committed], timeout=240,
                      what=f"a committed checkpoint of run {run_id}")[0]


def final_checkpoint(client, run_id: str):
    last = client.list_checkpoints(run_id)[-1]
    assert last.committed and last.step == BATCHES and last.url.startswith("s3://")
    return last


def running_messages(client, run_id: str) -> list[str]:
    return [e.message or "" for e in client.run_events(run_id).data if e.to_status is RunStatus.RUNNING]


def resumed(client, run_id: str) -> bool:
    """Whether an attempt of the run has started again from a checkpoint in S3."""
    return any("resuming from s3://" in m for m in running_messages(client, run_id))


@pytest.fixture(scope="module")
def uninterrupted(cluster_svc, ray_cluster):
    """The spec run once without incident: ``(final run view, node names of its two workers)``."""
    client = cluster_svc.client()
    run = client.create_run(cluster_spec("uninterrupted"))

    def both_workers_placed():
        if client.get_run(run.id).status in TERMINAL_STATUSES:
            raise AssertionError("the run ended before both of its workers were seen")
        nodes = ray_cluster.train_worker_nodes()
        return nodes if len(nodes) == 2 else None

    nodes = wait_until(both_workers_placed, timeout=240, interval=0.2, what="two live Ray Train workers")
    return wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=300), nodes


def test_a_two_worker_ddp_run_spans_two_nodes_and_completes(cluster_svc, uninterrupted):
    final, nodes = uninterrupted
    assert final.status is RunStatus.COMPLETED, final.error
    assert final.summary["time/batch"] == BATCHES
    assert len(set(nodes)) == 2 and set(nodes) <= set(NODE_NAMES), nodes
    final_checkpoint(cluster_svc.client(), final.id)
    assert "workers.launch forked as pid" in cluster_svc.client().logs(final.id).text  # warm on its first run


def test_a_node_lost_mid_run_costs_nothing_the_run_resumes_elsewhere_bitwise_equal(
        cluster_svc, ray_cluster, uninterrupted):
    client = cluster_svc.client()
    run = client.create_run(cluster_spec("node-loss"))
    committed = first_commit(client, run.id)
    nodes = ray_cluster.train_worker_nodes()
    assert len(nodes) == 2, nodes
    victim = nodes[0]
    try:
        ray_cluster.kill_raylet(victim)
        # The run goes on with the two nodes left; the replacement joins once it has resumed
        # (or ended), as an autoscaler's would, while the run trains.
        wait_until(lambda: resumed(client, run.id) or client.get_run(run.id).status in TERMINAL_STATUSES,
                   timeout=300, what=f"run {run.id} to resume after losing {victim}")
    finally:
        ray_cluster.stop_node(victim)  # what is left of it
        ray_cluster.start_nodes(victim)
    final = wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=300)
    assert final.status is RunStatus.COMPLETED, final.error
    assert final.summary["time/batch"] == BATCHES
    # Ray Train restarted the worker group on the nodes left (max_restarts: 1), from S3.
    assert RunStatus.RESTARTING in [e.to_status for e in client.run_events(run.id).data]
    assert resumed(client, run.id), running_messages(client, run.id)
    # Resumed from a committed checkpoint at or after the one seen before the kill.
    steps = [c.step for c in client.list_checkpoints(run.id) if c.committed]
    assert steps[-1] == BATCHES and committed.step <= BATCHES
    assert_bitwise_equal(final_checkpoint(client, run.id).url,
                         final_checkpoint(client, uninterrupted[0].id).url)


def probe(url: str, path: str) -> tuple[int, dict]:
    response = httpx.get(f"{url}{path}", timeout=10)
    return response.status_code, response.json()


def test_a_lost_head_makes_the_service_unready_and_its_run_finishes_once_ray_is_back(cluster_svc, ray_cluster):
    client = cluster_svc.client()
    run = client.create_run(cluster_spec("head-loss"))
    first_commit(client, run.id)
    # Without GCS fault tolerance a restarted head is a new cluster: the running job is gone
    # and the worker nodes exit (after RAY_gcs_rpc_server_reconnect_timeout_s); end them now.
    ray_cluster.stop_head()
    for name in NODE_NAMES:
        ray_cluster.stop_node(name)
    try:
        assert probe(cluster_svc.url, "/readyz") == (503, {"status": "not ready", "database": "ok",
                                                          "ray": "unreachable"})
        assert probe(cluster_svc.url, "/healthz") == (200, {"status": "ok", "database": "ok", "ray": "unreachable"})
        assert probe(cluster_svc.url, "/livez")[0] == 200
        # The service keeps the run as it was while Ray cannot be asked about it.
        assert client.get_run(run.id).status in (RunStatus.RUNNING, RunStatus.STARTING, RunStatus.RESTARTING)
    finally:
        ray_cluster.start_head()
        ray_cluster.start_nodes(*NODE_NAMES)
    wait_until(lambda: probe(cluster_svc.url, "/readyz")[0] == 200, timeout=120, what="the service to be ready")
    final = wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=300)
    assert final.status is RunStatus.COMPLETED, final.error
    assert final.attempt == 2 and final.summary["time/batch"] == BATCHES
    events = client.run_events(run.id).data
    assert any("not found; re-queued as attempt 2" in (e.message or "") for e in events)
    assert any("resuming from s3://" in m for m in running_messages(client, run.id)[1:])


def test_a_sweep_spreads_its_trials_across_the_nodes_and_one_whose_node_is_lost_is_retried(cluster_svc, ray_cluster):
    from api.views import SweepStatus
    from tests.workers.helpers_specs import SWEEP_BASE

    client = cluster_svc.client()
    # A one-worker trial trains in its Tune actor, which asks for the worker's one CPU: on
    # one-CPU nodes two trials at once run on two nodes.
    created = client.create_sweep({"name": "node-loss", "base": SWEEP_BASE, "max_concurrent_trials": 2,
                                   "search": {"params": {"data.batch_size": {"grid": [32, 64]}}}})

    def training_trial_nodes():
        sweep = client.get_sweep(created.id)
        if sweep.status.is_terminal:
            raise AssertionError("the sweep ended before a trial trained")
        # Both trial actors (ImplicitFunc) placed, and a trial of the sweep training.
        trial_nodes = ray_cluster.actor_nodes("ImplicitFunc")
        training = any(t.status is RunStatus.RUNNING for t in sweep.trials)
        return trial_nodes if len(set(trial_nodes)) == 2 and training else None

    trial_nodes = wait_until(training_trial_nodes, timeout=240, interval=0.3, what="two trials to train")
    assert set(trial_nodes) <= set(NODE_NAMES), trial_nodes  # on two worker nodes
    victim = trial_nodes[0]
    ray_cluster.kill_raylet(victim)
    # A replacement node joins, as an autoscaler would bring one.
    ray_cluster.stop_node(victim)
    ray_cluster.start_nodes(victim)
    sweep = client.wait_sweep(created.id, timeout=300)
    assert sweep.status is SweepStatus.COMPLETED, (sweep.error, sweep.message)
    assert sweep.counts == {"COMPLETED": 2}
    runs = list(client.iter_runs(sweep_id=sweep.id))
    assert all(r.status is RunStatus.COMPLETED for r in runs)
    assert max(r.attempt for r in runs) >= 2, [(r.id, r.attempt) for r in runs]  # the lost trial ran again


def test_a_ddp_sweep_trains_every_trial_on_ranks_kept_across_two_nodes(cluster_svc, ray_cluster):
    # A DDP trial of two one-CPU ranks trains in its Tune actor (rank 0) with a peer actor
    # (rank 1) in the trial's second bundle: on one-CPU nodes the two are on two nodes. The
    # second trial reuses the actor, its peer and their process group (workers.tune.actor_ranks).
    from api.views import SweepStatus
    from tests.workers.helpers_specs import SWEEP_BASE

    client = cluster_svc.client()
    base = {**SWEEP_BASE, "max_duration": "1ep",
            "parallelism": {"strategy": "ddp", "num_workers": 2, "cpus_per_worker": 1}}
    peers_before = ray_cluster.actors_ever("_PeerRank")
    created = client.create_sweep({"name": "ddp-peers", "base": base, "max_concurrent_trials": 1,
                                   "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}})

    def rank_nodes():
        if client.get_sweep(created.id).status.is_terminal:
            raise AssertionError("the sweep ended before its ranks were seen")
        trial_actors, peers = ray_cluster.actor_nodes("ImplicitFunc"), ray_cluster.actor_nodes("_PeerRank")
        return (trial_actors, peers) if len(trial_actors) == 1 and len(peers) == 1 else None

    trial_actors, peers = wait_until(rank_nodes, timeout=240, interval=0.3, what="a trial actor and its peer")
    assert set(trial_actors + peers) <= set(NODE_NAMES) and trial_actors != peers, (trial_actors, peers)
    sweep = client.wait_sweep(created.id, timeout=300)
    assert sweep.status is SweepStatus.COMPLETED, (sweep.error, sweep.message)
    assert sweep.counts == {"COMPLETED": 2}
    runs = list(client.iter_runs(sweep_id=sweep.id))
    assert all(r.attempt == 1 and r.summary.get("eval/accuracy", 0) > 0.2 for r in runs), \
        [(r.id, r.attempt, r.summary) for r in runs]
    assert ray_cluster.actors_ever("_PeerRank") - peers_before == 1  # both trials on one peer
