"""A storage call that hangs gives up at ``storage_timeout_s``: a 503 naming the setting for a
request, never a blocked thread."""

from __future__ import annotations

import threading
import time

import pytest

from service.bounded_storage import StorageTimeout, bounded
from service.code_store import CodeStore

API = "/api/v1"
DIGEST = "a" * 64


@pytest.fixture
def hung():
    release = threading.Event()
    yield lambda *args, **kwargs: release.wait(30)
    release.set()  # let the abandoned threads finish


def test_a_hung_call_raises_at_its_deadline_and_a_quick_one_returns(hung):
    started = time.monotonic()
    with pytest.raises(StorageTimeout, match="TESSERA_STORAGE_TIMEOUT_S"):
        bounded("listing s3://bucket/x", 0.2, hung)
    assert time.monotonic() - started < 2
    assert bounded("adding", 1.0, lambda a, b: a + b, 2, 3) == 5


def test_a_request_that_reads_a_hung_store_is_a_503_with_retry_after(client, settings, tmp_path, hung, monkeypatch):
    store = CodeStore(f"file://{tmp_path}/store", timeout_s=0.2)
    # fsspec caches filesystem instances: this is the process's one LocalFileSystem, so the
    # patch must be undone after the test (a plain assignment made every later `exists` True).
    monkeypatch.setattr(store.fs, "exists", hung)
    client.app.state.__dict__["code_stores"] = {"default": store}  # where project_code_store keeps them
    started = time.monotonic()
    answer = client.get(f"{API}/code/{DIGEST}")
    assert answer.status_code == 503 and "storage did not answer within 0.2s" in answer.json()["detail"]
    assert answer.headers["Retry-After"] == "10" and time.monotonic() - started < 3
