"""The SDK's submit carries one Idempotency-Key per call and repeats it on its own retries."""

from __future__ import annotations

import httpx
import pytest

import api.client as client_module
from api.client import Client
from api.errors import ApiError

RUN = {"id": "r1", "name": "n", "status": "QUEUED", "attempt": 1, "spec": {}, "created_at": "2026-01-01T00:00:00Z",
       "updated_at": "2026-01-01T00:00:00Z"}


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(client_module, "SUBMIT_RETRY_DELAYS_S", (0.0, 0.0, 0.0))


def _client(answers: list) -> tuple[Client, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return Client("http://tessera.test", transport=httpx.MockTransport(handle), api_key="tsk_test"), seen


def test_a_lost_answer_is_retried_with_the_same_key_and_returns_the_first_run():
    client, seen = _client([httpx.ReadTimeout("lost"), httpx.Response(503, json={"detail": "restarting"}),
                            httpx.Response(200, json=RUN)])
    assert client.create_run({"name": "n"}).id == "r1"
    keys = {request.headers["Idempotency-Key"] for request in seen}
    assert len(seen) == 3 and len(keys) == 1 and next(iter(keys)).startswith("sdk-")


def test_replayed_says_what_this_call_knows_about_who_made_the_run():
    replay = httpx.Response(200, json=RUN | {"replayed": True})
    client, _ = _client([httpx.ReadTimeout("lost"), replay])
    assert client.create_run({"name": "n"}).replayed is False  # its own fresh key: its own lost first try
    client, _ = _client([httpx.ReadTimeout("lost"), replay])
    assert client.create_run({"name": "n"}, idempotency_key="nightly").replayed is None  # this call, or an earlier
    client, _ = _client([replay])
    assert client.create_run({"name": "n"}, idempotency_key="nightly").replayed is True  # answered at once
    client, _ = _client([httpx.Response(201, json=RUN | {"replayed": False})])
    assert client.create_run({"name": "n"}, idempotency_key="nightly").replayed is False
    sweep = {"id": "s1", "name": "n", "status": "QUEUED", "spec": {}, "created_at": "2026-01-01T00:00:00Z",
             "attempt": 1, "driver": "service", "metric": "eval/accuracy", "mode": "max", "replayed": True}
    client, _ = _client([httpx.ConnectError("down"), httpx.Response(200, json=sweep)])
    assert client.create_sweep({"name": "n"}, idempotency_key="nightly").replayed is None


def test_each_call_gets_its_own_key_unless_one_is_given():
    client, seen = _client([httpx.Response(201, json=RUN) for _ in range(3)])
    client.create_run({"name": "n"})
    client.create_run({"name": "n"})
    client.create_run({"name": "n"}, idempotency_key="mine")
    keys = [request.headers["Idempotency-Key"] for request in seen]
    assert keys[0] != keys[1] and keys[2] == "mine"


def test_a_4xx_is_not_retried_and_retries_are_bounded():
    client, seen = _client([httpx.Response(422, json={"detail": "bad"})])
    with pytest.raises(ApiError):
        client.create_run({"name": "n"})
    assert len(seen) == 1
    client, seen = _client([httpx.ConnectError("down")] * 4)
    with pytest.raises(httpx.ConnectError):
        client.create_run({"name": "n"})
    assert len(seen) == 4


def test_tessera_submit_sends_the_given_key(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import cli.main

    client, seen = _client([httpx.Response(201, json=RUN)])
    monkeypatch.setattr(cli.main, "_client", lambda url: client)
    spec = tmp_path / "spec.json"
    spec.write_text('{"name": "n"}')
    result = CliRunner().invoke(cli.main.app, ["submit", str(spec), "--idempotency-key", "nightly-2026-12-01"])
    assert result.exit_code == 0, result.output
    assert [request.headers["Idempotency-Key"] for request in seen] == ["nightly-2026-12-01"]

    # Its answer lost, the retry is answered as a replay: this command's run, or an earlier one's.
    client, seen = _client([httpx.ReadTimeout("lost"), httpx.Response(200, json=RUN | {"replayed": True})])
    result = CliRunner().invoke(cli.main.app, ["submit", str(spec), "--idempotency-key", "nightly-2026-12-01"])
    assert result.exit_code == 0 and "submitted by this command or an earlier one with this --idempotency-key" in \
        result.output and len(seen) == 2


SWEEP = {"id": "s1", "name": "n", "status": "QUEUED", "attempt": 1, "driver": "service", "spec": {},
         "metric": "eval/accuracy", "mode": "max", "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"}


def test_a_sweeps_lost_answer_is_retried_with_the_same_key():
    client, seen = _client([httpx.ConnectError("down"), httpx.Response(502, json={"detail": "proxy"}),
                            httpx.Response(200, json=SWEEP)])
    assert client.create_sweep({"name": "n"}).id == "s1"
    keys = {request.headers["Idempotency-Key"] for request in seen}
    assert len(seen) == 3 and len(keys) == 1 and next(iter(keys)).startswith("sdk-")


def test_tessera_sweeps_submit_sends_the_given_key(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import cli.main
    import cli.sweeps

    client, seen = _client([httpx.Response(201, json=SWEEP)])
    monkeypatch.setattr(cli.sweeps, "_client", lambda url: client)
    spec = tmp_path / "sweep.json"
    spec.write_text('{"name": "n"}')
    result = CliRunner().invoke(cli.main.app, ["sweeps", "submit", str(spec), "--idempotency-key", "grid-1"])
    assert result.exit_code == 0, result.output
    assert [request.headers["Idempotency-Key"] for request in seen] == ["grid-1"]
