"""A live service (``tessera serve`` in a subprocess) on a free loopback port, against a real
Ray head and a real PostgreSQL database. It can be killed and restarted around running jobs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from api.client import Client
from api.errors import ApiError
from api.views import TERMINAL_STATUSES, RunStatus, RunView
from tests.conftest import REPO_ROOT, free_port

TESSERA = str(Path(sys.executable).with_name("tessera"))


def wait_until(condition, *, timeout: float, interval: float = 0.25, what: str = "condition"):
    """Poll ``condition`` until it returns a truthy value; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class ServiceProcess:
    """``tessera serve`` as a child process with a fixed port, database and Ray address."""

    def __init__(self, *, home: Path, env: dict[str, str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / "service.log"
        self.env = {**os.environ, "TESSERA_HOME": str(home), "TESSERA_PUBLIC_URL": self.url, **env}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90) -> None:
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen([TESSERA, "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                                     env=self.env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        wait_until(self._healthy, timeout=timeout, what=f"service health at {self.url} (log: {self.log_path})")

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"service exited with {self.proc.returncode}:\n{self.log_path.read_text()[-4000:]}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).json().get("ray") == "ok"
        except (httpx.HTTPError, ValueError):
            return False

    def kill(self) -> None:
        """SIGKILL: the hardest way a control plane can die."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def client(self) -> Client:
        return Client(self.url)


@contextlib.contextmanager
def cluster_service(home: Path, *, ray_address: str, postgres_url: str, env: dict[str, str] | None = None):
    """A started service in the cluster shape (PostgreSQL + an external Ray cluster + storage: a
    local folder unless ``env`` names ``TESSERA_STORAGE_URL``). On exit it cancels whatever still
    runs, so nothing is left training on the shared Ray cluster, then stops."""
    svc = ServiceProcess(home=home, env={"TESSERA_DATABASE_URL": postgres_url, "TESSERA_RAY_ADDRESS": ray_address,
                                         **(env or {})})
    svc.start()
    try:
        yield svc
    finally:
        try:
            _cancel_unfinished(svc.client())
        except Exception as exc:  # teardown must still stop the service (Ray or the service may be gone)
            print(f"warning: could not cancel unfinished runs: {exc}")
        svc.stop()


def _cancel_unfinished(client: Client) -> None:
    # Sweeps first: their active trials refuse a run cancel (409) and end with their sweep.
    for sweep in client.list_sweeps(limit=500).data:
        if not sweep.status.is_terminal:
            try:
                client.cancel_sweep(sweep.id)
            except ApiError:  # it ended meanwhile
                pass
    for run in client.iter_runs():
        if run.status not in TERMINAL_STATUSES:
            try:
                client.cancel_run(run.id)
            except ApiError:  # it ended meanwhile
                pass
    wait_until(lambda: all(r.status in TERMINAL_STATUSES for r in client.iter_runs()), timeout=60,
               what="every run to end after cancel")


@pytest.fixture(scope="module")
def service(tmp_path_factory, ray_head, postgres_url):
    with cluster_service(tmp_path_factory.mktemp("tessera-home"), ray_address=ray_head.dashboard_url,
                         postgres_url=postgres_url) as svc:
        yield svc


@pytest.fixture(scope="module")
def s3_service(request, tmp_path_factory, ray_head, postgres_url, s3_server):
    """Like ``service``, with its storage in S3 (moto) under a prefix named after the test module
    (``s3_service.storage_prefix``), so modules never see each other's objects."""
    prefix = request.module.__name__.rsplit(".", 1)[-1]
    with cluster_service(tmp_path_factory.mktemp(f"{prefix}-home"), ray_address=ray_head.dashboard_url,
                         postgres_url=postgres_url, env={"TESSERA_STORAGE_URL": s3_server.url(prefix)}) as svc:
        svc.storage_prefix = prefix
        yield svc


def wait_for_status(client: Client, run_id: str, statuses: set[RunStatus], timeout: float) -> RunView:
    def reached():
        run = client.get_run(run_id)
        return run if run.status in statuses else None

    return wait_until(reached, timeout=timeout, what=f"run {run_id} to reach {sorted(s.value for s in statuses)}")
