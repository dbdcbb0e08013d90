"""RayJobsClient: Ray's error shapes mapped to the JobsClient contract; one test on a real head."""

from __future__ import annotations

import sys
import time
import uuid
from types import SimpleNamespace

import pytest

from service.ray_client import RayJobsClient


class StubSDK:
    """Raises exactly what ray.job_submission.JobSubmissionClient raises (measured on Ray 2.60)."""

    def __init__(self):
        self.submitted: list[str] = []

    def submit_job(self, *, entrypoint, submission_id, runtime_env):
        if submission_id in self.submitted:
            raise RuntimeError("Request failed with status code 500: Traceback (most recent call last):\n"
                               f"ValueError: Job with submission_id {submission_id} already exists. "
                               "Please use a different submission_id.")
        self.submitted.append(submission_id)
        return submission_id

    def get_job_info(self, job_id):
        if job_id not in self.submitted:
            raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")
        return SimpleNamespace(status=SimpleNamespace(value="RUNNING"))

    def stop_job(self, job_id):
        if job_id not in self.submitted:
            raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")
        return True

    def get_job_logs(self, job_id):
        return "\n".join(f"line {i}" for i in range(100))


@pytest.fixture
def stubbed() -> RayJobsClient:
    client = RayJobsClient("http://127.0.0.1:1")
    client._client = StubSDK()
    return client


def test_second_submit_of_an_attempt_is_treated_as_already_submitted(stubbed):
    stubbed.submit("run-a-attempt-1", "echo", {})
    stubbed.submit("run-a-attempt-1", "echo", {})
    assert stubbed._client.submitted == ["run-a-attempt-1"]


def test_other_submit_errors_propagate(stubbed):
    stubbed._client.submit_job = lambda **kw: (_ for _ in ()).throw(RuntimeError("status code 400: bad env"))
    with pytest.raises(RuntimeError, match="bad env"):
        stubbed.submit("run-b-attempt-1", "echo", {})


def test_unknown_job_reads_as_none_and_stopping_it_is_harmless(stubbed):
    assert stubbed.status("run-x-attempt-1") is None
    stubbed.stop("run-x-attempt-1")
    assert stubbed.logs_tail("run-x-attempt-1", lines=3) == "line 97\nline 98\nline 99"


def test_unreachable_ray_raises_instead_of_reading_as_gone():
    client = RayJobsClient("http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(ConnectionError):
        client.status("run-x-attempt-1")


def _wait_for(client: RayJobsClient, job_id: str, states: set[str], timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while (status := client.status(job_id)) not in states:
        assert time.monotonic() < deadline, f"{job_id} still {status} after {timeout_s}s"
        time.sleep(0.2)
    return status


@pytest.mark.integration
def test_real_ray_head_runs_each_submission_once_and_stops_on_request(ray_head):
    client = RayJobsClient(ray_head.dashboard_url)
    job_id = f"tessera-test-{uuid.uuid4().hex[:8]}"
    entrypoint = f'{sys.executable} -c "import os; print(\'hi\', os.environ[\'TESSERA_TEST_MARK\'])"'
    client.submit(job_id, entrypoint, {"TESSERA_TEST_MARK": "first"})
    client.submit(job_id, entrypoint.replace("hi", "again"), {"TESSERA_TEST_MARK": "second"})  # already submitted
    assert _wait_for(client, job_id, {"SUCCEEDED", "FAILED"}) == "SUCCEEDED"
    assert client.logs_tail(job_id).splitlines()[-1] == "hi first"
    from ray.job_submission import JobSubmissionClient

    assert [j.submission_id for j in JobSubmissionClient(ray_head.dashboard_url).list_jobs()].count(job_id) == 1

    sleeper = f"{job_id}-sleep"
    client.submit(sleeper, "sleep 60", {})
    _wait_for(client, sleeper, {"RUNNING"})
    client.stop(sleeper)
    assert _wait_for(client, sleeper, {"STOPPED", "FAILED", "SUCCEEDED"}, timeout_s=30) == "STOPPED"
    assert client.status(f"{job_id}-never-submitted") is None
