"""A real ``mlflow server`` for the tests that read metrics back over HTTP: the session's
``mlflow_server`` fixture (``tests/conftest.py``) starts one and every such test shares it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.local_ray import free_port


@contextlib.contextmanager
def running_mlflow_server(folder: Path) -> Iterator[str]:
    """``mlflow server`` on a free loopback port with its SQLite store in ``folder``; its URL.
    Starting one takes up to a minute on a busy 2-core machine: the session starts one."""
    port = free_port()  # not the kernel's bind(0) choice, which another process may take first
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
         "--default-artifact-root", f"{folder}/artifacts", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _healthy(url):  # a poll of a process starting, not a sleep standing in for a test's sync
            assert server.poll() is None and time.monotonic() < deadline, "mlflow server did not start"
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


def _healthy(url: str) -> bool:
    """Whether the server at ``url`` answers ``/health``; not yet listening is not yet healthy."""
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
