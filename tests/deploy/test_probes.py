"""The probes Kubernetes and compose use: ``/healthz/live`` (alias ``/livez``) answers while the
process serves and its dispatcher ticks; ``/healthz/ready`` (alias ``/readyz``) is 503 while the
database or Ray cannot be reached, and names which."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.db.engine import make_engine
from service.repository import Repository
from service.settings import Settings
from tests.conftest import free_port
from tests.service.conftest import FakeJobs


@pytest.fixture
def app_and_jobs(tmp_path):
    jobs = FakeJobs()
    settings = Settings(home=tmp_path / "home", public_url="http://tessera.test:8000",
                        storage_url=f"file://{tmp_path}/storage")
    app = create_app(settings, jobs=jobs, run_dispatcher=False)
    with TestClient(app) as client:
        yield app, jobs, client


def ray_down(_job_id):
    raise ConnectionError("Failed to connect to Ray at http://127.0.0.1:8265")


def test_ready_and_live_while_the_database_and_ray_answer(app_and_jobs):
    _, _, client = app_and_jobs
    assert client.get("/livez").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert (ready.status_code, ready.json()) == (200, {"status": "ready", "database": "ok", "ray": "ok"})


def test_not_ready_but_alive_and_healthy_while_ray_is_unreachable(app_and_jobs):
    _, jobs, client = app_and_jobs
    jobs.status = ray_down
    ready = client.get("/readyz")
    assert (ready.status_code, ready.json()) == (503, {"status": "not ready", "database": "ok", "ray": "unreachable"})
    assert client.get("/livez").status_code == 200
    health = client.get("/healthz")
    assert (health.status_code, health.json()["ray"]) == (200, "unreachable")


def test_not_ready_while_the_database_is_unreachable(app_and_jobs):
    app, _, client = app_and_jobs
    # A PostgreSQL URL on a port nothing listens on: every query fails to connect.
    app.state.repo = Repository(make_engine(f"postgresql+psycopg://tessera@127.0.0.1:{free_port()}/tessera"))
    ready = client.get("/readyz")
    assert (ready.status_code, ready.json()) == (503, {"status": "not ready", "database": "unreachable", "ray": "ok"})
    assert client.get("/healthz").status_code == 503
    assert client.get("/livez").status_code == 200


def test_the_probes_stay_out_of_the_published_api(app_and_jobs):
    _, _, client = app_and_jobs
    paths = set(client.get("/api/v1/openapi.json").json()["paths"])
    assert "/healthz" in paths and not {"/livez", "/readyz"} & paths


def test_the_healthz_paths_answer_like_their_aliases(app_and_jobs):
    _, jobs, client = app_and_jobs
    assert client.get("/healthz/live").json() == client.get("/livez").json() == {"status": "ok"}
    jobs.status = ray_down
    ready = client.get("/healthz/ready")
    assert (ready.status_code, ready.json()["ray"]) == (503, "unreachable")


def test_liveness_fails_once_the_dispatcher_thread_stops_ticking(app_and_jobs, monkeypatch):
    app, _, client = app_and_jobs
    dispatcher = app.state.dispatcher
    monkeypatch.setattr(type(dispatcher), "running", property(lambda self: True))
    dispatcher.last_tick_at = time.monotonic()
    assert client.get("/healthz/live").status_code == 200
    dispatcher.last_tick_at -= app.state.settings.liveness_max_tick_age_s + 1  # wedged since then
    stalled = client.get("/healthz/live")
    assert stalled.status_code == 503 and "liveness_max_tick_age_s" in stalled.json()["detail"]
