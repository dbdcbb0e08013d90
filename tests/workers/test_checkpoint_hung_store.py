"""An S3 endpoint that accepts connections and never answers fails storage calls and checkpoint
saves in bounded time (``workers.s3_limits``); before, a save there never returned.

The endpoint is a real listening socket (``tests.workers.s3_endpoints``), with the limits shrunk
through ``S3_LIMITS``, so each test costs a few seconds."""

from __future__ import annotations

import time

import pytest
import torch

from tests.workers.s3_endpoints import LIMITS, SilentServer, request_bound_s, serve_as_s3
from workers.checkpoint.manager import Checkpointer
from workers.checkpoint.reader import ParallelFsspecReader
from workers.checkpoint.storage import storage_for
from workers.s3_limits import S3NoAnswerError


@pytest.fixture
def silent_s3(monkeypatch):
    with serve_as_s3(SilentServer(), monkeypatch) as server:
        yield server


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


def test_checkpoint_file_systems_send_a_stalled_get_as_often_as_a_request_is_tried(silent_s3):
    """s3fs sends a GET whose answer stalled again ``retries`` times (5, a class attribute): each
    checkpoint file system has it set to the attempts. The reader first: fsspec shares one file
    system among the builders with the same options, so ``FsspecStorage``'s would set it for all
    (DCP's writer is built after the checkpointer's ``FsspecStorage``)."""
    assert ParallelFsspecReader("s3://bucket/ck").fs.fs.retries == LIMITS.attempts
    assert storage_for("s3://bucket/ck").fs.retries == LIMITS.attempts
