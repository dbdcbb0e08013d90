"""Worker-side S3 reads besides checkpoints (streamed WebDataset shards, image folders, code
packages) fail in bounded time, with an error naming what was read and the endpoint, when S3 never
answers or its answer stops after the head; and a body that keeps coming is read whole, however long
after the request's deadline (``workers.s3_limits``). Before, these reads used s3fs's defaults: a
silent endpoint cost 5 x 5 tries of 15 s, and a stalled answer 5 GETs and then an ``IndexError``.

The endpoints are real sockets (``tests.workers.s3_endpoints``) with the limits shrunk."""

from __future__ import annotations

import hashlib
import io
import tarfile
import time

import pytest

from api.data_specs import WebDatasetSpec
from api.model_specs import CodeRef
from tests.workers.s3_endpoints import LIMITS, SilentServer, StallingServer, request_bound_s, serve_as_s3
from workers.data.errors import DataError
from workers.data.image_folder import list_image_folder
from workers.data.webdataset_loader import WebDatasetLoader, read_shard
from workers.models.code_cache import UserCodeError
from workers.models.user_code import install_code, read_package
from workers.paths import code_package_url
from workers.s3_limits import bounded_fs

pytestmark = pytest.mark.timeout(60)  # s3fs's defaults took minutes here


def shard_bytes(samples: int = 4) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for index in range(samples):
            for suffix, data in (("png", bytes(range(256)) * 4), ("cls", b"1")):
                info = tarfile.TarInfo(f"{index:05d}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


SHARD = shard_bytes()
SHARD_URL = "s3://bucket/shards/train-0.tar"
DIGEST = hashlib.sha256(SHARD).hexdigest()  # the stalling server serves SHARD for every key
PACKAGE_URL = code_package_url("s3://bucket", DIGEST)


def read_whole_shard() -> list[str]:
    return [key for key, _, _ in read_shard(SHARD_URL, image_key="png", label_key="cls")]


def fetch_package() -> bytes:
    return read_package(DIGEST, PACKAGE_URL)[0]


@pytest.fixture
def silent_s3(monkeypatch):
    with serve_as_s3(SilentServer(), monkeypatch) as server:
        yield server


def test_a_streamed_shard_from_a_silent_endpoint_fails_in_bounded_time_naming_it(silent_s3):
    started = time.monotonic()
    with pytest.raises(DataError, match=rf"shard '{SHARD_URL}' cannot be opened: S3NoAnswerError: "
                                        rf"No answer from {silent_s3.url}/bucket/shards/train-0.tar.*; the store did "
                                        r"not answer; check that its endpoint is up and reachable$"):
        read_whole_shard()
    assert time.monotonic() - started < request_bound_s()
    assert len(silent_s3.connections) == LIMITS.attempts  # botocore's attempts, nothing on top


def test_a_webdataset_loader_on_a_silent_endpoint_fails_as_it_starts(silent_s3):
    spec = WebDatasetSpec.model_validate({"name": "webdataset", "urls": SHARD_URL, "num_samples": 4, "channels": 1,
                                          "num_workers": 0})
    started = time.monotonic()
    with pytest.raises(DataError, match=rf"shard '{SHARD_URL}' cannot be opened: S3NoAnswerError.*the store did not "
                                        r"answer; check that its endpoint is up and reachable$"):
        WebDatasetLoader(spec, batch_size=2)
    assert time.monotonic() - started < request_bound_s()


def test_an_image_folder_on_a_silent_endpoint_fails_in_bounded_time_naming_it(silent_s3):
    started = time.monotonic()
    with pytest.raises(DataError, match=r"image_folder root 's3://bucket/images' cannot be listed: S3NoAnswerError"):
        list_image_folder("s3://bucket/images")
    assert time.monotonic() - started < request_bound_s()


def test_a_code_package_from_a_silent_endpoint_fails_in_bounded_time_naming_it(silent_s3, tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CODE_CACHE", str(tmp_path / "cache"))
    started = time.monotonic()
    with pytest.raises(UserCodeError, match=rf"code.digest {DIGEST}: cannot fetch {PACKAGE_URL}: S3NoAnswerError: "
                                            rf"No answer from {silent_s3.url}/bucket/code/{DIGEST}.zip"):
        install_code(CodeRef(digest=DIGEST), storage_url="s3://bucket")
    assert time.monotonic() - started < request_bound_s()
    assert len(silent_s3.connections) == LIMITS.attempts


@pytest.mark.parametrize("read, error", [(read_whole_shard, DataError), (fetch_package, UserCodeError)],
                         ids=["streamed-shard", "code-package"])
def test_an_answer_that_stalls_after_its_head_fails_after_as_many_gets_as_a_request_has_attempts(monkeypatch, read,
                                                                                                 error):
    """The deadline ends at the head; the stalled body is s3fs's to retry, as often as botocore
    tries a request (s3fs's own default: 5), and the error says what happened."""
    server = StallingServer(SHARD, sent_before_stall=700)
    with serve_as_s3(server, monkeypatch):
        started = time.monotonic()
        with pytest.raises(error, match=rf"S3AnswerStalledError: The answer from {server.url}/bucket/\S+ stalled: "
                                        rf"no byte for 0\.5s after 700 of {len(SHARD)} bytes"):
            read()
        elapsed = time.monotonic() - started
        assert server.gets == LIMITS.attempts
    # Each GET: its stall, then s3fs's pause (0.1 s x 1.7 ** try), and a margin for a busy machine.
    assert elapsed < LIMITS.attempts * (LIMITS.read_timeout_s + 1.0) + 5.0


@pytest.mark.parametrize("read, whole", [(read_whole_shard, ["00000", "00001", "00002", "00003"]),
                                         (fetch_package, SHARD)], ids=["streamed-shard", "code-package"])
def test_a_body_that_keeps_coming_is_read_whole_however_long_after_the_request_deadline(monkeypatch, read, whole):
    """A GET's deadline (``read_timeout_s``: no body to send) bounds the wait for its head only:
    a large shard may stream for minutes. Here the body takes 3 deadlines, no pause a timeout long."""
    server = StallingServer(SHARD, chunks=12, interval_s=LIMITS.read_timeout_s / 4)
    with serve_as_s3(server, monkeypatch):
        started = time.monotonic()
        assert read() == whole
        assert time.monotonic() - started > 2 * LIMITS.read_timeout_s
        assert server.gets == 1


def test_every_worker_s3_file_system_sends_a_stalled_get_as_often_as_a_request_is_tried(monkeypatch):
    with serve_as_s3(SilentServer(), monkeypatch):
        fs, path = bounded_fs(SHARD_URL)
        assert (fs.retries, path) == (LIMITS.attempts, "bucket/shards/train-0.tar")
