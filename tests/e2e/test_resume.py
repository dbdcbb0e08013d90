"""Auto-resume through the service, end to end: a Ray job lost while the service was down is
re-queued and its new attempt resumes from the newest committed checkpoint (path 2), and a
canceled run resumed by the user continues on a different number of workers (path 3)."""

from __future__ import annotations

import copy

import psutil
import pytest

from api.views import TERMINAL_STATUSES, RunStatus
from tests.e2e.conftest import ServiceProcess, wait_for_status, wait_until
from tests.e2e.test_vertical_slice import long_synthetic_spec

pytestmark = pytest.mark.integration

BATCHES, INTERVAL = 120, 20


@pytest.fixture(scope="module")
def slow_service(tmp_path_factory, ray_head, postgres_url):
    """A service whose runs sleep 50 ms per batch (a test hook the dispatcher forwards to the
    workers), so there is time to act on a run between two checkpoints."""
    home = tmp_path_factory.mktemp("tessera-resume-home")
    svc = ServiceProcess(home=home, env={"TESSERA_DATABASE_URL": postgres_url,
                                         "TESSERA_RAY_ADDRESS": ray_head.dashboard_url,
                                         "TESSERA_TEST_BATCH_DELAY_S": "0.05"})
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


def checkpointed_spec(name: str, **parallelism) -> dict:
    spec = copy.deepcopy(long_synthetic_spec(name, batches=BATCHES))
    spec["checkpoint"] = {"interval": f"{INTERVAL}ba", "keep_last": 2}
    spec["parallelism"] = {"strategy": "ddp", "num_workers": 1, **parallelism}
    return spec


def first_commit(client, run_id: str):
    return wait_until(lambda: [c for c in client.list_checkpoints(run_id) if c.committed], timeout=240,
                      what=f"a committed checkpoint of run {run_id}")[0]


def command_line(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.NoSuchProcess:  # it ended while the list was read
        return ""


def running_messages(client, run_id: str, attempt: int) -> list[str]:
    return [e.message or "" for e in client.run_events(run_id).data
            if e.to_status is RunStatus.RUNNING and e.from_status is not RunStatus.RUNNING
            and e.attempt == attempt]


def test_a_job_lost_with_its_ray_head_resumes_from_the_newest_checkpoint_without_running_twice(
        tmp_path, postgres_url):
    # The embedded Ray head lives and dies with the service (Ray fate-shares its processes):
    # killing the service loses the running job, as losing a cluster would.
    service = ServiceProcess(home=tmp_path, env={"TESSERA_DATABASE_URL": postgres_url,
                                                 "TESSERA_TEST_BATCH_DELAY_S": "0.05"})
    service.start()
    try:
        client = service.client()
        run = client.create_run(checkpointed_spec("lost-job"))
        first_commit(client, run.id)
        ray_processes = psutil.Process(service.proc.pid).children(recursive=True)
        drivers = [p for p in ray_processes if "workers.launch" in command_line(p)]
        assert drivers, [command_line(p) for p in ray_processes]
        service.kill()
        # Let the old head finish dying (Ray fate-shares it with the service) before a new one
        # starts. The job's driver (``workers.launch``) does not die with the head: it waits for
        # the lost GCS for RAY_gcs_rpc_server_reconnect_timeout_s (60 s) before it exits, so we
        # end it now, as a lost machine would; whatever else outlives the wait is ours to end too.
        for driver in drivers:
            driver.kill()
        _, alive = psutil.wait_procs(ray_processes, timeout=60)
        for proc in alive:
            proc.kill()
        service.start()  # a fresh embedded head that has never heard of attempt 1

        client = service.client()
        final = wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=300)
        events = client.run_events(run.id).data
        resumed = running_messages(client, run.id, 2)
        checkpoints = client.list_checkpoints(run.id)
    finally:
        service.stop()
    assert final.status is RunStatus.COMPLETED, final.error
    assert final.attempt == 2 and final.summary["time/batch"] == BATCHES
    assert any("not found after a service restart; re-queued as attempt 2" in (e.message or "") for e in events)
    assert len(resumed) == 1 and "resuming from file://" in resumed[0] and f"/runs/{run.id}/checkpoints/" in resumed[0]
    # Nothing of attempt 1 ran on after the restart: every later checkpoint is attempt 2's.
    assert checkpoints[-1].step == BATCHES and checkpoints[-1].committed and len(checkpoints) == 2
    assert [c.attempt for c in checkpoints] == [2, 2]
    assert [e.to_status for e in events].count(RunStatus.STARTING) == 2


def test_a_canceled_run_resumed_on_two_workers_continues_from_its_checkpoint(slow_service):
    client = slow_service.client()
    run = client.create_run(checkpointed_spec("resume-elastic"))
    checkpoint = first_commit(client, run.id)
    assert checkpoint.world_size == 1 and checkpoint.url.startswith("file://")
    client.cancel_run(run.id)
    assert wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=120).status is RunStatus.CANCELED

    resumed = client.resume_run(run.id, num_workers=2)
    assert resumed.status is RunStatus.QUEUED and resumed.attempt == 2
    assert resumed.spec["parallelism"]["num_workers"] == 2
    final = wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=300)
    assert final.status is RunStatus.COMPLETED, final.error
    assert final.summary["time/batch"] == BATCHES
    [message] = running_messages(client, run.id, 2)
    assert "training on 2 worker(s)" in message and "resuming from file://" in message
    last = client.list_checkpoints(run.id)[-1]
    assert (last.step, last.world_size, last.committed, last.attempt) == (BATCHES, 2, True, 2)
