"""A Ray head whose Jobs API hangs, then answers 5xx, then loses the answer to a submit it acted
on: the service stays live and responsive, is not ready while it lasts, fails no run, and the
run completes afterwards with exactly one Ray job."""

from __future__ import annotations

import time
from urllib.parse import urlparse

import httpx
import pytest

from api.views import TERMINAL_STATUSES, RunStatus
from tests.conftest import ADMIN_HEADERS
from tests.e2e.conftest import cluster_service, wait_for_status, wait_until
from tests.e2e.test_vertical_slice import long_synthetic_spec
from tests.faults.ray_proxy import Mode, RayProxy

pytestmark = pytest.mark.integration

QUICK_S = 2.0  # a request the service answers from its database must never wait on Ray


@pytest.fixture
def proxy(ray_head):
    address = urlparse(ray_head.dashboard_url)
    proxy = RayProxy(address.hostname, address.port)
    yield proxy
    proxy.close()


def _quick(svc, path: str) -> httpx.Response:
    started = time.monotonic()
    answer = httpx.get(f"{svc.url}{path}", headers=ADMIN_HEADERS, timeout=10)
    assert time.monotonic() - started < QUICK_S, f"{path} took {time.monotonic() - started:.1f}s"
    return answer


def _not_ready_yet_responsive(svc, run_id: str) -> bool:
    """One round of checks while Ray misbehaves; True once readiness says Ray is down."""
    assert _quick(svc, "/healthz/live").status_code == 200
    assert _quick(svc, "/api/v1/runs").status_code == 200
    assert svc.client().get_run(run_id).status is not RunStatus.FAILED
    ready = httpx.get(f"{svc.url}/healthz/ready", timeout=10)
    return ready.status_code == 503 and ready.json()["ray"] == "unreachable"


def _ray_jobs_of(ray_head, run_id: str) -> list[str]:
    listed = httpx.get(f"{ray_head.dashboard_url}/api/jobs/", timeout=30).json()
    return sorted(j["submission_id"] for j in listed if (j.get("submission_id") or "").startswith(f"run-{run_id}-"))


def test_a_hung_then_failing_ray_blocks_nothing_fails_no_run_and_the_run_completes_once(
        tmp_path, ray_head, postgres_url, proxy):
    (tmp_path / "home").mkdir()
    with cluster_service(tmp_path / "home", ray_address=proxy.url, postgres_url=postgres_url,
                         env={"TESSERA_RAY_TIMEOUT_S": "2", "TESSERA_RAY_SUBMIT_RETRIES": "1"}) as svc:
        client = svc.client()
        proxy.mode = Mode.HANG
        run = client.create_run(long_synthetic_spec("through-an-outage", batches=60))
        wait_until(lambda: _not_ready_yet_responsive(svc, run.id), timeout=60, what="readiness 503 while Ray hangs")
        for _ in range(3):  # several dispatcher ticks' worth of checks while it hangs
            assert _not_ready_yet_responsive(svc, run.id)
        assert client.get_run(run.id).status is RunStatus.QUEUED

        proxy.mode = Mode.ERROR_5XX
        for _ in range(3):
            assert _not_ready_yet_responsive(svc, run.id)

        proxy.mode = Mode.LOSE_SUBMIT_ANSWERS  # Ray makes the job; the service never hears so
        wait_until(lambda: proxy.lost_submits, timeout=60, what="a submit whose answer is lost")
        assert client.get_run(run.id).status is RunStatus.STARTING
        proxy.mode = Mode.PASS

        final = wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=300)
        assert final.status is RunStatus.COMPLETED, final.error
        assert final.attempt == 1 and _ray_jobs_of(ray_head, run.id) == [f"run-{run.id}-attempt-1"]
        assert RunStatus.FAILED not in [e.to_status for e in client.run_events(run.id).data]
        assert httpx.get(f"{svc.url}/healthz/ready", timeout=10).status_code == 200
