"""Fixtures for the control-plane tests: the issue's example spec, a repository on SQLite and
on the session's PostgreSQL, a fake Ray Jobs client, and an app wired to both."""

from __future__ import annotations

import copy
import threading
from datetime import datetime
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from api.specs import RunSpec
from service.db.engine import make_engine, migrate
from service.ray_client import RayAmbiguous
from service.repository import Repository
from service.settings import Settings
from tests.conftest import ADMIN_HEADERS

EXAMPLE_SPEC_YAML = """
name: digits-resnet
model: {name: cifar_resnet20}
data: {train: {name: digits, split: train}, eval: {name: digits, split: test}, batch_size: 64}
optimizer: {name: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.0005}
scheduler: {name: cosine, warmup: "0.1dur"}
max_duration: "3ep"
eval_interval: "1ep"
precision: fp32
algorithms: [{name: label_smoothing, smoothing: 0.1}, {name: channels_last}, {name: cutmix, alpha: 1.0}]
parallelism: {strategy: ddp, num_workers: 2}
seed: 42
"""


@pytest.fixture
def example_body() -> dict[str, Any]:
    """The issue's example RunSpec as a request body (a fresh copy per test)."""
    return copy.deepcopy(yaml.safe_load(EXAMPLE_SPEC_YAML))


@pytest.fixture
def example_spec(example_body) -> RunSpec:
    return RunSpec.model_validate(example_body)


@pytest.fixture
def sweep_body(example_body) -> dict[str, Any]:
    """A sweep of the example spec over three algorithm sets and two learning rates."""
    return {"name": "digits-sweep", "base": example_body,
            "search": {"algorithms": {"sets": [[], ["channels_last"], ["ema", "swa"]]},
                       "params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}}


@pytest.fixture(scope="session")
def _postgres_engine(postgres_url):
    engine = make_engine(postgres_url)
    migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def repo(request, tmp_path) -> Repository:
    """A migrated, empty repository on a fresh SQLite file or on the session's PostgreSQL."""
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path}/tessera.db")
        migrate(engine)
        yield Repository(engine)
        engine.dispose()
    else:
        engine = request.getfixturevalue("_postgres_engine")
        with engine.begin() as conn:  # the database lives for the session; each test starts empty
            conn.execute(text("TRUNCATE metrics, run_events, runs, sweeps RESTART IDENTITY CASCADE"))
        yield Repository(engine)


@pytest.fixture
def sqlite_repo(tmp_path) -> Repository:
    engine = make_engine(f"sqlite:///{tmp_path}/tessera.db")
    migrate(engine)
    yield Repository(engine)
    engine.dispose()


class FakeJobs:
    """An in-memory Ray Jobs API with Ray's semantics: one job per submission id, stop is
    asynchronous-free (the job is STOPPED at once), unknown ids read as None."""

    def __init__(self):
        self.jobs: dict[str, dict[str, Any]] = {}
        self.submit_calls: list[str] = []
        self.stop_calls: list[str] = []
        self.fail_submit: Exception | None = None
        self.logs: dict[str, str] = {}
        self._lock = threading.Lock()

    def submit(self, submission_id: str, entrypoint: str, env_vars: dict[str, str]) -> None:
        with self._lock:
            self.submit_calls.append(submission_id)
            if self.fail_submit is not None:
                raise self.fail_submit
            if submission_id in self.jobs:
                return  # Ray refuses a duplicate id; the JobsClient contract makes that a no-op
            self.jobs[submission_id] = {"status": "PENDING", "entrypoint": entrypoint, "env": dict(env_vars)}

    def status(self, submission_id: str) -> str | None:
        job = self.jobs.get(submission_id)
        return job["status"] if job else None

    def stop(self, submission_id: str) -> None:
        self.stop_calls.append(submission_id)
        job = self.jobs.get(submission_id)
        if job and job["status"] in ("PENDING", "RUNNING"):
            job["status"] = "STOPPED"

    def logs_tail(self, submission_id: str, lines: int = 40) -> str:
        return "\n".join(self.logs.get(submission_id, "").splitlines()[-lines:])

    def job_logs(self, submission_id: str) -> str | None:
        return self.logs.get(submission_id, "") if submission_id in self.jobs else None

    def delete(self, submission_id: str) -> None:
        job = self.jobs.get(submission_id)
        if job is not None and job["status"] in ("PENDING", "RUNNING"):
            raise RayAmbiguous(f"Ray answered DELETE /api/jobs/{submission_id} with 500: not finished")
        self.jobs.pop(submission_id, None)

    def ended_at(self, submission_id: str) -> datetime | None:
        job = self.jobs.get(submission_id)
        return job.get("ended_at") if job else None

    # test helpers
    def set_status(self, submission_id: str, status: str, ended_at: datetime | None = None) -> None:
        """``ended_at``: when Ray says a finished job ended (None: Ray does not say)."""
        self.jobs[submission_id].update(status=status, ended_at=ended_at)

    def forget(self, submission_id: str) -> None:
        """Simulate a Ray head that lost the job (e.g. restarted)."""
        self.jobs.pop(submission_id, None)


@pytest.fixture
def fake_jobs() -> FakeJobs:
    return FakeJobs()


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "home", public_url="http://tessera.test:8000",
                    worker_python="/opt/venv/bin/python", storage_url="file:///tmp/tessera-test-storage")


@pytest.fixture
def client(settings, fake_jobs):
    """A TestClient on an app over SQLite and the fake Jobs client, dispatcher thread off."""
    from fastapi.testclient import TestClient

    from service.app import create_app

    app = create_app(settings, jobs=fake_jobs, run_dispatcher=False)
    with TestClient(app, headers=ADMIN_HEADERS) as test_client:
        yield test_client


@pytest.fixture(params=["sqlite", "postgresql"])
def admin(request):
    """A TestClient holding the admin key of every project, on either database (``client`` or
    ``pg_client``)."""
    return request.getfixturevalue("client" if request.param == "sqlite" else "pg_client")


@pytest.fixture
def pg_client(tmp_path, fake_jobs, postgres_url, _postgres_engine):
    """Like ``client``, but over the session's PostgreSQL database (emptied first)."""
    from fastapi.testclient import TestClient

    from service.app import create_app

    with _postgres_engine.begin() as conn:
        conn.execute(text("TRUNCATE metrics, run_events, runs, sweeps RESTART IDENTITY CASCADE"))
    settings = Settings(home=tmp_path / "home", database_url=postgres_url, public_url="http://tessera.test:8000")
    with TestClient(create_app(settings, jobs=fake_jobs, run_dispatcher=False), raise_server_exceptions=False,
                    headers=ADMIN_HEADERS) as test_client:
        yield test_client
