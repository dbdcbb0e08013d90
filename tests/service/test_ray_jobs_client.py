"""RayJobsClient: Ray's answers mapped to the JobsClient contract (refused, ambiguous, unavailable,\nbounded by a timeout); one test on a real head."""

from __future__ import annotations

import json
import socket
import sys
import time
import uuid
from datetime import datetime, timezone

import httpx
import pytest

from service.ray_client import RayAmbiguous, RayJobsClient, RayRefused, RayUnavailable


class FakeRayJobsAPI:
    """Ray 2.60's Jobs REST API as the dashboard answers it (shapes measured on a real head)."""

    def __init__(self):
        self.submitted: list[str] = []
        self.fail_with: tuple[int, str] | Exception | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if isinstance(self.fail_with, Exception):
            raise self.fail_with
        if self.fail_with is not None:
            return httpx.Response(self.fail_with[0], text=self.fail_with[1])
        path = request.url.path
        if request.method == "POST" and path == "/api/jobs/":
            job_id = json.loads(request.content)["submission_id"]
            if job_id in self.submitted:
                return httpx.Response(500, text="Traceback (most recent call last):\n"
                                                f"ValueError: Job with submission_id {job_id} already exists. "
                                                "Please use a different submission_id.")
            self.submitted.append(job_id)
            return httpx.Response(200, json={"job_id": None, "submission_id": job_id})
        if request.method == "GET" and path == "/api/jobs/":
            return httpx.Response(200, json=[{"submission_id": j, "status": "RUNNING"} for j in self.submitted])
        job_id = path.removeprefix("/api/jobs/").split("/")[0]
        if job_id not in self.submitted:
            return httpx.Response(404, text=f"Job {job_id} does not exist")
        if path.endswith("/logs"):
            return httpx.Response(200, json={"logs": "\n".join(f"line {i}" for i in range(100))})
        if path.endswith("/stop"):
            return httpx.Response(200, json={"stopped": True})
        return httpx.Response(200, json={"submission_id": job_id, "status": "RUNNING"})


@pytest.fixture
def ray_api() -> FakeRayJobsAPI:
    return FakeRayJobsAPI()


@pytest.fixture
def stubbed(ray_api) -> RayJobsClient:
    return RayJobsClient("http://ray.test:8265", transport=httpx.MockTransport(ray_api))


def test_second_submit_of_an_attempt_is_treated_as_already_submitted(stubbed, ray_api):
    stubbed.submit("run-a-attempt-1", "echo", {})
    stubbed.submit("run-a-attempt-1", "echo", {})
    assert ray_api.submitted == ["run-a-attempt-1"]
    assert stubbed.states() == {"run-a-attempt-1": "RUNNING"}


def test_a_4xx_is_a_definite_refusal(stubbed, ray_api):
    ray_api.fail_with = (400, "bad runtime_env")
    with pytest.raises(RayRefused, match="bad runtime_env"):
        stubbed.submit("run-b-attempt-1", "echo", {})


@pytest.mark.parametrize("failure", [(500, "no available agent to submit job"), (503, "busy"),
                                     httpx.ReadTimeout("timed out"), httpx.RemoteProtocolError("reset")])
def test_a_5xx_a_read_timeout_or_a_reset_is_ambiguous(stubbed, ray_api, failure):
    ray_api.fail_with = failure
    with pytest.raises(RayAmbiguous):
        stubbed.submit("run-c-attempt-1", "echo", {})
    with pytest.raises(RayUnavailable):  # and never reads as "no such job"
        stubbed.status("run-c-attempt-1")


def test_unknown_job_reads_as_none_and_stopping_it_is_harmless(stubbed):
    assert stubbed.status("run-x-attempt-1") is None
    stubbed.stop("run-x-attempt-1")
    assert stubbed.logs_tail("run-x-attempt-1", lines=3) == ""
    stubbed.submit("run-y-attempt-1", "echo", {})
    assert stubbed.logs_tail("run-y-attempt-1", lines=3) == "line 97\nline 98\nline 99"


def test_unreachable_ray_raises_instead_of_reading_as_gone():
    client = RayJobsClient("http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(RayUnavailable) as raised:
        client.status("run-x-attempt-1")
    assert not isinstance(raised.value, RayAmbiguous)  # refused: the request never reached Ray


def test_a_ray_that_accepts_and_never_answers_costs_one_timeout():
    with socket.socket() as silent:  # listens, never answers: a hung dashboard
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        client = RayJobsClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.3)
        started = time.monotonic()
        with pytest.raises(RayAmbiguous, match="did not answer"):
            client.submit("run-z-attempt-1", "echo", {})
        assert time.monotonic() - started < 5


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
    submitted = datetime.now(timezone.utc)
    client.submit(job_id, entrypoint, {"TESSERA_TEST_MARK": "first"})
    client.submit(job_id, entrypoint.replace("hi", "again"), {"TESSERA_TEST_MARK": "second"})  # already submitted
    assert _wait_for(client, job_id, {"SUCCEEDED", "FAILED"}) == "SUCCEEDED"
    assert submitted <= client.ended_at(job_id) <= datetime.now(timezone.utc)  # Ray's end_time
    assert client.logs_tail(job_id).splitlines()[-1] == "hi first"
    from ray.job_submission import JobSubmissionClient

    assert [j.submission_id for j in JobSubmissionClient(ray_head.dashboard_url).list_jobs()].count(job_id) == 1

    sleeper = f"{job_id}-sleep"
    client.submit(sleeper, "sleep 60", {})
    _wait_for(client, sleeper, {"RUNNING"})
    assert client.ended_at(sleeper) is None  # not ended yet
    stopped = datetime.now(timezone.utc)
    client.stop(sleeper)
    assert _wait_for(client, sleeper, {"STOPPED", "FAILED", "SUCCEEDED"}, timeout_s=30) == "STOPPED"
    assert stopped <= client.ended_at(sleeper) <= datetime.now(timezone.utc)
    assert client.status(f"{job_id}-never-submitted") is None
    assert client.ended_at(f"{job_id}-never-submitted") is None


def test_a_cluster_with_token_auth_gets_rays_token_on_every_call(tmp_path):
    """With ``RAY_AUTH_MODE=token`` every request carries ``Authorization: Bearer <token>`` as
    Ray's own SDK sends it (Ray reads the token once per process, so this runs in a fresh one)."""
    import os
    import subprocess

    from tests.conftest import REPO_ROOT

    script = (
        "import httpx\n"
        "from service.ray_client import RayJobsClient\n"
        "seen = []\n"
        "def answer(request):\n"
        "    seen.append(request.headers.get('authorization'))\n"
        "    return httpx.Response(200, json={'status': 'RUNNING'})\n"
        "client = RayJobsClient('http://ray.test:8265', transport=httpx.MockTransport(answer))\n"
        "client.status('run-x-attempt-1')\n"
        "print(seen)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "s3cr3t-token"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['Bearer s3cr3t-token']"
