"""``Idempotency-Key`` on POST /api/v1/runs: a retried submit returns the first run, on SQLite and
PostgreSQL, and two concurrent submits with one key make one run."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from api.specs import RunSpec

API = "/api/v1"


@pytest.fixture(params=["sqlite", "postgresql"])
def any_client(request):
    return request.getfixturevalue("client" if request.param == "sqlite" else "pg_client")


def _runs(client) -> list[dict]:
    return client.get(f"{API}/runs", params={"limit": 100}).json()["data"]


def test_a_retried_submit_with_the_same_key_returns_the_first_run(any_client, example_body):
    first = any_client.post(f"{API}/runs", json=example_body, headers={"Idempotency-Key": "submit-1"})
    again = any_client.post(f"{API}/runs", json=example_body, headers={"Idempotency-Key": "submit-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert [run["id"] for run in _runs(any_client)] == [first.json()["id"]]
    other = any_client.post(f"{API}/runs", json=example_body, headers={"Idempotency-Key": "submit-2"})
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]


def test_the_same_key_with_a_different_spec_is_refused_naming_the_header(any_client, example_body):
    assert any_client.post(f"{API}/runs", json=example_body, headers={"Idempotency-Key": "k"}).status_code == 201
    changed = any_client.post(f"{API}/runs", json={**example_body, "seed": 7}, headers={"Idempotency-Key": "k"})
    assert changed.status_code == 422
    [error] = changed.json()["detail"]
    assert error["field"] == "Idempotency-Key" and "different spec" in error["msg"]
    assert len(_runs(any_client)) == 1


@pytest.mark.parametrize("key", ["x" * 129, "caf\u00e9", "tab\there"])
def test_a_malformed_key_is_a_422_naming_the_header_and_stores_nothing(client, example_body, key):
    refused = client.post(f"{API}/runs", json=example_body, headers={"Idempotency-Key": key.encode("latin-1")})
    assert refused.status_code == 422
    [error] = refused.json()["detail"]
    assert error["field"] == "Idempotency-Key" and "printable ASCII" in error["msg"]
    assert _runs(client) == []


def test_a_key_is_scoped_to_its_project(client, example_body):
    other = f"idem-{uuid.uuid4().hex[:6]}"
    assert client.post(f"{API}/projects", json={"name": other}).status_code == 201
    here = client.post(f"{API}/runs", json=example_body, headers={"Idempotency-Key": "shared"})
    there = client.post(f"{API}/runs", json=example_body, headers={"Idempotency-Key": "shared"},
                        params={"project": other})
    assert (here.status_code, there.status_code) == (201, 201) and here.json()["id"] != there.json()["id"]


def test_concurrent_submits_with_one_key_make_one_run_on_postgresql(pg_client, example_body):
    start = threading.Barrier(6)

    def submit(_):
        start.wait()
        return pg_client.post(f"{API}/runs", json=example_body, headers={"Idempotency-Key": "race"})

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(submit, range(6)))
    assert sorted(a.status_code for a in answers) == [200] * 5 + [201]
    assert len({a.json()["id"] for a in answers}) == 1 and len(_runs(pg_client)) == 1


def test_the_loser_of_an_insert_race_reads_the_winners_run(repo, example_spec, monkeypatch):
    """Deterministic form of the race: the loser's pre-check saw no run, its insert hits the
    unique index (on SQLite and PostgreSQL), and it answers with the winner's run."""
    winner, created = repo.create_run_once(example_spec, project="default", idempotency_key="k")
    real_lookup = repo.run_by_idempotency_key
    calls = []

    def stale_first_lookup(project, key):
        calls.append(key)
        return None if len(calls) == 1 else real_lookup(project, key)

    monkeypatch.setattr(repo, "run_by_idempotency_key", stale_first_lookup)
    loser, loser_created = repo.create_run_once(RunSpec.model_validate(example_spec.model_dump()),
                                                project="default", idempotency_key="k")
    assert (created, loser_created, loser.id) == (True, False, winner.id) and len(calls) == 2
