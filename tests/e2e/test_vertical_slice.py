"""The vertical slice end to end: REST → database → Ray job → DDP workers → metrics → COMPLETED.

Real components: uvicorn on a loopback port, PostgreSQL, a Ray head with its job server, two
gloo DDP workers. ~2 minutes on a 2-core machine.
"""

from __future__ import annotations

import copy
import socket
import time
from pathlib import Path

import pytest
import yaml
from ray.job_submission import JobSubmissionClient

from api.views import TERMINAL_STATUSES, RunStatus
from tests.e2e.conftest import wait_for_status, wait_until

pytestmark = pytest.mark.integration

EXAMPLE = yaml.safe_load((Path(__file__).parents[2] / "examples" / "digits_resnet.yaml").read_text())


def long_synthetic_spec(name: str, batches: int) -> dict:
    """A run that keeps training for a while, to have something RUNNING to act on."""
    spec = copy.deepcopy(EXAMPLE)
    spec.update(name=name, model={"name": "simple_cnn", "params": {"width": 8, "hidden": 32}},
                data={"train": {"name": "synthetic", "num_samples": 512, "image_size": 16},
                      "eval": {"name": "synthetic", "split": "test", "num_samples": 128, "image_size": 16},
                      "batch_size": 32},
                max_duration=f"{batches}ba", eval_interval=None, algorithms=[],
                parallelism={"strategy": "none", "num_workers": 1})
    return spec


def test_example_run_trains_on_two_ddp_workers_and_completes(service):
    client = service.client()
    submitted = time.monotonic()
    run = client.create_run(EXAMPLE)
    assert run.status is RunStatus.QUEUED and run.attempt == 1

    pages, after = [], 0

    def finished():
        nonlocal after
        page = client.metrics(run.id, after=after)
        if page.data:
            pages.append(page)
            after = page.last_seq
        return client.get_run(run.id).status in TERMINAL_STATUSES

    wait_until(finished, timeout=300, interval=0.5, what="the example run to finish")
    elapsed = time.monotonic() - submitted
    final = client.get_run(run.id)
    assert final.status is RunStatus.COMPLETED, final.error
    print(f"\nexample run: submit -> COMPLETED in {elapsed:.1f}s, summary {final.summary}")

    # Metrics arrived in several polls, each carrying only points after the previous cursor.
    seqs = [p.seq for page in pages for p in page.data]
    assert len(pages) >= 2
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
    assert client.metrics(run.id, after=after).data == []
    keys = {p.key for page in pages for p in page.data}
    assert {"train/loss", "eval/loss", "eval/accuracy", "throughput/samples_per_sec", "lr",
            "time/epoch", "time/batch"} <= keys
    eval_points = [p for page in pages for p in page.data if p.key == "eval/accuracy"]
    assert len(eval_points) == 5  # eval_interval 1ep over 5 epochs

    assert final.summary["eval/accuracy"] > 0.6
    assert final.summary["time/epoch"] == 5
    assert final.started_at and final.finished_at and final.started_at <= final.finished_at

    events = client.run_events(run.id).data
    assert [(e.from_status, e.to_status) for e in events] == [
        (None, RunStatus.QUEUED), (RunStatus.QUEUED, RunStatus.STARTING),
        (RunStatus.STARTING, RunStatus.RUNNING), (RunStatus.RUNNING, RunStatus.COMPLETED)]


def test_a_worker_that_raises_fails_the_run_with_its_message(service):
    client = service.client()
    spec = copy.deepcopy(EXAMPLE)
    spec.update(name="missing-data", data={"train": {"name": "fashion_mnist", "root": "/nonexistent/fmnist"},
                                            "batch_size": 64},
                eval_interval=None, algorithms=[])
    run = client.create_run(spec)
    final = wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=180)
    assert final.status is RunStatus.FAILED
    assert "FileNotFoundError" in final.error and "/nonexistent/fmnist" in final.error
    assert [e.to_status for e in client.run_events(run.id).data][-1] is RunStatus.FAILED


def log_text(client, run_id: str) -> str:
    return client.logs(run_id).text  # the first page holds the entrypoint's first lines


def fork_exec_line(client, run_id: str) -> str | None:
    return next((line for line in log_text(client, run_id).splitlines() if line.startswith("workers.fork_exec:")),
                None)


def serves(socket_path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(socket_path))  # a liveness check: the server closes it
            return True
        except OSError:
            return False


def wait_for_warm_driver_interpreter(client) -> None:
    """Once a driver on this service's head has started (or used) the node's fork server
    (workers.fork_exec logs where), wait until that server serves: the next driver is forked."""
    lines = (fork_exec_line(client, r.id) for r in client.iter_runs() if r.status is RunStatus.COMPLETED)
    line = next((line for line in lines if line), None)  # a trial's is its sweep driver's
    if line is None:  # this test alone: a short run first
        warm = client.create_run(long_synthetic_spec("warms-the-node", batches=2))
        assert wait_for_status(client, warm.id, TERMINAL_STATUSES, timeout=180).status is RunStatus.COMPLETED
        line = fork_exec_line(client, warm.id)
    socket_path = Path(line.split(" at ")[1].split(":")[0])
    wait_until(lambda: serves(socket_path), timeout=120, what=f"the fork server at {socket_path} to serve")


def test_cancel_of_a_running_run_stops_its_ray_job(service, ray_head):
    client = service.client()
    wait_for_warm_driver_interpreter(client)
    run = client.create_run(long_synthetic_spec("to-cancel", batches=100_000))
    wait_for_status(client, run.id, {RunStatus.RUNNING}, timeout=180)
    # Its driver was forked from the warm interpreter; Ray's stop reaches it through the stand-in.
    assert "workers.launch forked as pid" in log_text(client, run.id)
    assert client.cancel_run(run.id).status in (RunStatus.CANCELING, RunStatus.CANCELED)
    final = wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=120)
    assert final.status is RunStatus.CANCELED
    events = client.run_events(run.id).data
    assert [e.to_status for e in events][-2:] == [RunStatus.CANCELING, RunStatus.CANCELED]
    # The service saw Ray stop the job; then, its final log stored, had Ray forget it.
    assert f"Ray job run-{run.id}-attempt-1 is STOPPED" in events[-1].message
    jobs = JobSubmissionClient(ray_head.dashboard_url)
    wait_until(lambda: f"run-{run.id}-attempt-1" not in {j.submission_id for j in jobs.list_jobs()}, timeout=60,
               what="Ray to forget the stopped job")


def test_cancel_of_a_finished_run_is_a_conflict(service):
    client = service.client()
    finished = next(r for r in client.iter_runs() if r.status in TERMINAL_STATUSES)
    from api.errors import ApiError

    with pytest.raises(ApiError) as info:
        client.cancel_run(finished.id)
    assert info.value.status_code == 409


def test_service_restart_during_two_runs_neither_loses_nor_duplicates_them(service):
    client = service.client()
    batches = {"survives-restart": 300, "survives-restart-too": 250}
    runs = [client.create_run(long_synthetic_spec(name, batches=n)) for name, n in batches.items()]
    for run in runs:
        wait_until(lambda: client.metrics(run.id).data, timeout=180, what=f"first metrics of run {run.name}")

    service.kill()  # SIGKILL with both in flight
    service.start()  # same database, same Ray head: the reconciler must find both jobs still running

    client = service.client()
    for run in runs:
        final = wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=300)
        assert final.status is RunStatus.COMPLETED, final.error
        assert final.attempt == 1  # one attempt: the restart submitted no second job
        assert final.summary["time/batch"] == batches[run.name]
        transitions = [e.to_status for e in client.run_events(run.id).data]
        assert transitions == [RunStatus.QUEUED, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.COMPLETED]
        # The worker kept its points while the service was down and delivered them afterwards.
        steps = {p.step for p in client.metrics(run.id, limit=100_000).data if p.key == "train/loss"}
        assert max(steps) == batches[run.name]
