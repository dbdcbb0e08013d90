"""The SDK's waits (``on_poll``, what a timeout says) and downloads (whole or nothing, a
directory ``out`` refused before any request), over ``httpx.MockTransport``; and that every
public ``Client`` method says what it does."""

from __future__ import annotations

import hashlib
import inspect

import httpx
import pytest

import api.client as client_module
from api.client import Client
from api.code_package import CodePackageError
from api.errors import ApiError, InvalidInput

RUN = {"id": "r1", "name": "n", "status": "QUEUED", "attempt": 1, "spec": {}, "created_at": "2026-01-01T00:00:00Z"}


class FakeTime:
    """``time`` for ``api.client``: ``sleep`` moves ``monotonic`` on at once."""

    def __init__(self):
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(client_module, "time", fake)
    return fake


def _client(handle) -> tuple[Client, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handle(request)

    return Client("http://tessera.test", transport=httpx.MockTransport(record), api_key="tsk_test"), seen


def _answers(*views: dict):
    """A handler answering GETs with ``views`` in turn (the last one again once they run out)."""
    left = list(views)

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=left.pop(0) if len(left) > 1 else left[0])

    return handle


# --- wait ----------------------------------------------------------------------------------
def test_wait_hands_every_answer_to_on_poll_and_returns_the_terminal_view(clock):
    client, seen = _client(_answers({**RUN, "status": "QUEUED"}, {**RUN, "status": "RUNNING"},
                                    {**RUN, "status": "COMPLETED"}))
    polled = []
    final = client.wait("r1", poll_interval=2.0, on_poll=polled.append)
    assert final.status.value == "COMPLETED"
    assert [view.status.value for view in polled] == ["QUEUED", "RUNNING", "COMPLETED"]
    assert len(seen) == 3 and clock.slept == [2.0, 2.0]
    assert client.wait("r1").status.value == "COMPLETED"  # on_poll is optional, as wait_sweep's


def test_wait_times_out_saying_the_status_and_why_a_queued_run_waits(clock):
    queued = {**RUN, "queue": {"position": 2, "reason": "quota", "detail": "project default runs 4 of 4"}}
    client, _ = _client(_answers(queued))
    polled = []
    with pytest.raises(TimeoutError) as raised:
        client.wait("r1", timeout=3, poll_interval=1.0, on_poll=polled.append)
    message = str(raised.value)
    assert "run r1 still QUEUED" in message and "after 3s" in message
    assert "queue position 2, waiting for quota: project default runs 4 of 4" in message
    assert len(polled) >= 4  # every poll, the last one included

    client, _ = _client(_answers({**RUN, "queue": {"position": 1, "reason": "resources"}}))
    with pytest.raises(TimeoutError, match=r"still QUEUED \(queue position 1, waiting for resources\) after 1s"):
        client.wait("r1", timeout=1)

    client, _ = _client(_answers({**RUN, "status": "RUNNING"}))
    with pytest.raises(TimeoutError) as raised:
        client.wait("r1", timeout=1)
    assert str(raised.value) == "run r1 still RUNNING after 1s"


def test_wait_and_wait_sweep_take_the_same_options():
    def options(method) -> list[tuple[str, object, object]]:
        params = list(inspect.signature(method).parameters.values())[2:]  # after self and the id
        return [(p.name, p.kind, p.default if p.name == "on_poll" else None) for p in params]

    assert options(Client.wait) == options(Client.wait_sweep)


# --- downloads -----------------------------------------------------------------------------
class BrokenStream(httpx.SyncByteStream):
    """A body that sends some bytes and then loses the connection."""

    def __iter__(self):
        yield b"x" * 1000
        raise httpx.ReadError("connection reset by peer")


def _leftovers(folder) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_a_broken_model_download_leaves_nothing_behind(tmp_path):
    client, _ = _client(lambda request: httpx.Response(200, stream=BrokenStream(), headers={"X-Tessera-Step": "9"}))
    with pytest.raises(httpx.ReadError):
        client.download_model("r1", tmp_path / "model.safetensors")
    assert _leftovers(tmp_path) == []  # no model.safetensors, no .partial

    (tmp_path / "model.safetensors").write_bytes(b"the earlier model")
    with pytest.raises(httpx.ReadError):
        client.download_model("r1", tmp_path / "model.safetensors")
    assert _leftovers(tmp_path) == ["model.safetensors"]
    assert (tmp_path / "model.safetensors").read_bytes() == b"the earlier model"  # left as it was


def test_a_broken_code_download_leaves_nothing_behind(tmp_path):
    client, _ = _client(lambda request: httpx.Response(200, stream=BrokenStream()))
    with pytest.raises(httpx.ReadError):
        client.download_code("0" * 64, tmp_path / "pkg.zip")
    assert _leftovers(tmp_path) == []


def test_an_error_answer_or_a_bad_digest_leaves_nothing_behind(tmp_path):
    client, _ = _client(lambda request: httpx.Response(404, json={"detail": "run r1 (RUNNING) has no exported model"}))
    with pytest.raises(ApiError) as raised:
        client.download_model("r1", tmp_path / "model.safetensors")
    assert raised.value.status_code == 404 and "no exported model" in raised.value.detail
    assert _leftovers(tmp_path) == []

    client, _ = _client(lambda request: httpx.Response(200, content=b"not the package"))
    with pytest.raises(CodePackageError, match="cut short or changed"):
        client.download_code("0" * 64, tmp_path / "pkg.zip")
    assert _leftovers(tmp_path) == []


def test_a_whole_download_takes_outs_name_and_says_the_step(tmp_path):
    body = b"weights" * 1000
    client, seen = _client(lambda request: httpx.Response(200, content=body, headers={"X-Tessera-Step": "120"}))
    assert client.download_model("r1", tmp_path / "m.pt", fmt="torch", step=120) == (len(body), "120")
    assert (tmp_path / "m.pt").read_bytes() == body and _leftovers(tmp_path) == ["m.pt"]
    assert dict(seen[0].url.params) == {"format": "torch", "step": "120"}

    client, _ = _client(lambda request: httpx.Response(200, content=body))  # a proxy dropped the header
    assert client.download_model("r1", tmp_path / "m.safetensors") == (len(body), "?")

    digest = hashlib.sha256(body).hexdigest()
    client, _ = _client(lambda request: httpx.Response(200, content=body))
    assert client.download_code(digest, tmp_path / "pkg.zip") == len(body)
    assert (tmp_path / "pkg.zip").read_bytes() == body


def test_a_directory_out_is_refused_before_any_request(tmp_path):
    client, seen = _client(lambda request: httpx.Response(200, content=b"never asked for"))
    with pytest.raises(InvalidInput) as raised:
        client.download_model("r1", tmp_path)
    assert raised.value.detail[0]["field"] == "out" and str(tmp_path) in str(raised.value)
    with pytest.raises(InvalidInput):
        client.download_code("0" * 64, tmp_path)
    assert seen == [] and _leftovers(tmp_path) == []


def test_iter_sweeps_sends_the_filters_and_follows_next_cursor_to_the_last_page():
    sweep = {"id": "s1", "name": "n", "status": "RUNNING", "attempt": 1, "driver": "service", "spec": {},
             "metric": "eval/accuracy", "mode": "max", "created_at": "2026-01-01T00:00:00Z"}
    pages = {None: {"data": [sweep], "next_cursor": "c1"}, "c1": {"data": [{**sweep, "id": "s2"}], "next_cursor": None}}
    client, seen = _client(lambda request: httpx.Response(200, json=pages[request.url.params.get("cursor")]))
    assert [s.id for s in client.iter_sweeps(status="running", name="lr_0%", project="vision", limit=1)] == ["s1", "s2"]
    assert [dict(request.url.params) for request in seen] == [
        {"status": "RUNNING", "name": "lr_0%", "project": "vision", "limit": "1", "archived": "false"},
        {"status": "RUNNING", "name": "lr_0%", "project": "vision", "limit": "1", "archived": "false", "cursor": "c1"}]
    assert client.list_sweeps(cursor="c1").next_cursor is None
    seen.clear()
    with pytest.raises(ValueError, match="'STOPPED' is not a sweep status; one of QUEUED, STARTING"):
        client.list_sweeps(status="STOPPED")  # a run status, not a sweep's: refused before sending
    assert seen == []


# --- the API's shape -----------------------------------------------------------------------
def test_every_public_method_has_a_docstring():
    public = {name: member for name, member in vars(Client).items()
              if callable(member) and not name.startswith("_")}
    assert len(public) >= 56
    assert sorted(name for name, member in public.items() if not (member.__doc__ or "").strip()) == []


def test_resume_run_takes_num_workers_by_keyword_only():
    assert inspect.signature(Client.resume_run).parameters["num_workers"].kind is inspect.Parameter.KEYWORD_ONLY
