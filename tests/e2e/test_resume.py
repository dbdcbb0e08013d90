"""Auto-resume through the service, end to end: a Ray job lost while the service was down is
re-queued and its new attempt resumes from the newest committed checkpoint (path 2), and a
canceled run resumed by the user continues on a different number of workers (path 3)."""

from __future__ import annotations

import contextlib
import copy
import re
import shutil
from datetime import datetime, timezone

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


def lose_with_its_head(service: ServiceProcess) -> list[str]:
    """SIGKILL a service with an embedded Ray head and every process of the head at once, as a
    lost machine would; return once all are gone (their command lines), the head's session folder
    removed. Ray fate-shares the head with the service, but left to that the rest dies over
    seconds, and a job's driver (``workers.launch``) not at all: it waits for the lost GCS for
    RAY_gcs_rpc_server_reconnect_timeout_s (60 s) before it exits."""
    if service.proc is None or service.proc.poll() is not None:
        return []
    processes = psutil.Process(service.proc.pid).children(recursive=True)
    command_lines = [command_line(p) for p in processes]
    # ``ray.init(_temp_dir=...)``'s folder, which only a graceful stop removes (stop_embedded_ray).
    temp_dirs = {match[1] for line in command_lines
                 if (match := re.search(r"--session[-_]dir=(/\S*/tsr[^/\s]+)/session_", line))}
    service.kill()
    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    wait_until(lambda: all(map(ended, processes)), timeout=60, interval=0.1, what="the head's processes to end")
    for temp_dir in temp_dirs:
        shutil.rmtree(temp_dir, ignore_errors=True)
    return command_lines


def ended(proc: psutil.Process) -> bool:
    """Gone, or a zombie that only waits for its parent to reap it."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


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
        lost_at = datetime.now(timezone.utc)  # the service heard of the run last before this
        command_lines = lose_with_its_head(service)
        assert any("workers.launch" in line for line in command_lines), command_lines  # the job's driver
        # The new head's attempt 2 needs no time to act on: it trains without the per-batch delay.
        del service.env["TESSERA_TEST_BATCH_DELAY_S"]
        service.start()  # a fresh embedded head that has never heard of attempt 1

        client = service.client()
        final = wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=300)
        events = client.run_events(run.id).data
        resumed = running_messages(client, run.id, 2)
        checkpoints = client.list_checkpoints(run.id)
    finally:
        # Killed rather than stopped: a graceful stop of the embedded head takes seconds (the
        # driver's shutdown in ray.shutdown) and nothing here is about how the service stops.
        lose_with_its_head(service)
    assert final.status is RunStatus.COMPLETED, final.error
    assert final.attempt == 2 and final.summary["time/batch"] == BATCHES
    assert any("not found after a service restart; re-queued as attempt 2" in (e.message or "") for e in events)
    assert len(resumed) == 1 and "resuming from file://" in resumed[0] and f"/runs/{run.id}/checkpoints/" in resumed[0]
    # Nothing of attempt 1 ran on after the restart: every later checkpoint is attempt 2's.
    assert checkpoints[-1].step == BATCHES and checkpoints[-1].committed and len(checkpoints) == 2
    assert [c.attempt for c in checkpoints] == [2, 2]
    assert [e.to_status for e in events].count(RunStatus.STARTING) == 2
    # The time trained leaves out the outage and attempt 2's wait: attempt 1 trained until the service
    # last heard of it (not until the restarted service found its job lost), attempt 2 from its start.
    second = (final.finished_at - final.attempt_started_at).total_seconds()
    assert second < final.trained_seconds <= (lost_at - final.started_at).total_seconds() + second
    assert final.trained_seconds < final.span_seconds_at()


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
