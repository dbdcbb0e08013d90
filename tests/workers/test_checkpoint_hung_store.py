"""An S3 endpoint that accepts connections and never answers fails storage calls and checkpoint
saves in bounded time (``workers.checkpoint.s3_limits``); before, a save there never returned.

The endpoint is a real listening socket. The limits are shrunk through ``S3_LIMITS``, the one
place the production values come from, so each test costs a few seconds."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import replace

import pytest
import torch

from workers.checkpoint import s3_limits
from workers.checkpoint.manager import Checkpointer
from workers.checkpoint.s3_limits import S3NoAnswerError
from workers.checkpoint.storage import storage_for

LIMITS = replace(s3_limits.S3Limits(), connect_timeout_s=1.0, read_timeout_s=0.5, attempts=2)


class SilentServer:
    """Accepts TCP connections, counts them, reads nothing and answers nothing."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.connections: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.connections.append(conn)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (close alone does not, on Linux)
        self.sock.close()
        self._thread.join()
        for conn in self.connections:
            conn.close()


@pytest.fixture
def silent_s3(monkeypatch):
    """The silent server as the S3 endpoint, with ``LIMITS``. s3fs keeps a file system (and its
    client, which holds the endpoint) per set of options and thread: cleared before and after."""
    from s3fs import S3FileSystem

    server = SilentServer()
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(s3_limits, "S3_LIMITS", LIMITS)
    S3FileSystem.clear_instance_cache()
    try:
        yield server
    finally:
        S3FileSystem.clear_instance_cache()
        server.close()


def request_bound_s(body_bytes: int = 0) -> float:
    """Most one request may take with ``LIMITS``: every attempt to its deadline, botocore's
    standard backoff before each retry (rand * 2 ** (attempt - 1) s), then a generous margin."""
    deadline = LIMITS.read_timeout_s + body_bytes / LIMITS.min_upload_bytes_per_s
    backoff = sum(2 ** i for i in range(LIMITS.attempts - 1))
    return LIMITS.attempts * deadline + backoff + 5.0


@pytest.mark.timeout(60)  # before the bounds, this write never returned
def test_a_write_to_a_silent_s3_endpoint_fails_in_bounded_time_naming_the_endpoint(silent_s3):
    storage = storage_for("s3://bucket/hung")
    started = time.monotonic()
    with pytest.raises(S3NoAnswerError, match=f"No answer from {silent_s3.url}/bucket/hung/f"):
        storage.write_bytes("s3://bucket/hung/f", b"abc")
    assert time.monotonic() - started < request_bound_s(3)
    # One retry layer: botocore's attempts, no s3fs retries on top.
    assert len(silent_s3.connections) == LIMITS.attempts


@pytest.mark.timeout(120)
def test_a_save_to_a_silent_s3_endpoint_is_reported_not_committed_in_bounded_time(silent_s3):
    reports = []
    checkpointer = Checkpointer("s3://bucket/runs/hung/checkpoints", fingerprint={}, attempts=2, first_delay_s=0.01,
                                on_report=reports.append)
    model = torch.nn.Linear(2, 2)
    started = time.monotonic()
    checkpointer.save(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), trainer_state={},
                      rank_state={}, epoch=0, step=1)
    elapsed = time.monotonic() - started

    assert checkpointer.outcomes == {1: False}
    [report] = reports
    assert not report["committed"] and report["url"] == "s3://bucket/runs/hung/checkpoints/ep0-ba1"
    assert "S3NoAnswerError" in report["error"] and silent_s3.url in report["error"]
    # Each try of the save fails at its first request, the HEAD for an old marker, after
    # ``LIMITS.attempts`` tries of it (a PUT after it, were the HEAD read as "no file").
    assert len(silent_s3.connections) <= checkpointer.attempts * 2 * LIMITS.attempts
    assert elapsed < checkpointer.attempts * 2 * request_bound_s(1 << 16)


@pytest.mark.timeout(60)
def test_a_marker_that_cannot_be_read_is_an_error_not_a_missing_file(silent_s3):
    with pytest.raises(S3NoAnswerError):
        storage_for("s3://bucket/hung").isfile("s3://bucket/hung/ep0-ba2/COMMITTED")
