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
    assert (first.json()["replayed"], again.json()["replayed"]) == (False, True)
    assert again.json() == first.json() | {"replayed": True}
    assert [run["id"] for run in _runs(any_client)] == [first.json()["id"]]
    assert _runs(any_client)[0]["replayed"] is None  # only a create's answer says it
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


# --- sweeps --------------------------------------------------------------------------------

def _sweeps(client) -> list[dict]:
    return client.get(f"{API}/sweeps", params={"limit": 100}).json()["data"]


def _sweep(client, body, key, driver="service"):
    return client.post(f"{API}/sweeps", json=body, params={"driver": driver}, headers={"Idempotency-Key": key})


def test_a_retried_sweep_submit_returns_the_first_sweep(any_client, sweep_body):
    first, again = _sweep(any_client, sweep_body, "sweep-1"), _sweep(any_client, sweep_body, "sweep-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and again.json()["status"] == "QUEUED"
    assert [sweep["id"] for sweep in _sweeps(any_client)] == [first.json()["id"]]
    other = _sweep(any_client, sweep_body, "sweep-2")
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]


def test_a_sweep_key_reused_for_another_spec_or_driver_is_refused_naming_the_header(any_client, sweep_body):
    assert _sweep(any_client, sweep_body, "k").status_code == 201
    for answer, differs in ((_sweep(any_client, {**sweep_body, "num_samples": 2}, "k"), "different spec"),
                            (_sweep(any_client, sweep_body, "k", driver="external"), "different driver (service)")):
        assert answer.status_code == 422
        [error] = answer.json()["detail"]
        assert error["field"] == "Idempotency-Key" and differs in error["msg"] and "sweep" in error["msg"], error
    assert len(_sweeps(any_client)) == 1
    bad = _sweep(any_client, sweep_body, "caf\u00e9".encode("latin-1"))
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "Idempotency-Key"


def test_a_replayed_external_sweep_gets_a_new_driver_token_and_the_lost_one_stops_working(any_client, sweep_body):
    first = _sweep(any_client, sweep_body, "ext", driver="external")
    again = _sweep(any_client, sweep_body, "ext", driver="external")
    assert (first.status_code, again.status_code) == (201, 200) and again.json()["id"] == first.json()["id"]
    lost, kept = first.json()["driver_token"], again.json()["driver_token"]
    assert kept and kept != lost
    report = f"{API}/sweeps/{first.json()['id']}/report/status"
    assert any_client.post(report, headers={"Authorization": f"Bearer {lost}"},
                           json={"status": "RUNNING"}).status_code == 401
    assert any_client.post(report, headers={"Authorization": f"Bearer {kept}"},
                           json={"status": "COMPLETED"}).status_code == 200
    ended = _sweep(any_client, sweep_body, "ext", driver="external")  # nothing left to drive: no token
    assert ended.status_code == 200 and ended.json()["status"] == "COMPLETED" and ended.json()["driver_token"] is None


def test_concurrent_sweep_submits_with_one_key_make_one_sweep_on_postgresql(pg_client, sweep_body):
    start = threading.Barrier(4)

    def submit(_):
        start.wait()
        return _sweep(pg_client, sweep_body, "race")

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(submit, range(4)))
    assert sorted(a.status_code for a in answers) == [200] * 3 + [201]
    assert len({a.json()["id"] for a in answers}) == 1 and len(_sweeps(pg_client)) == 1


def test_a_driven_external_sweep_is_not_handed_a_new_token_by_a_replay(any_client, sweep_body, example_body):
    first = _sweep(any_client, sweep_body, "driven", driver="external").json()
    spec = {**example_body, "name": "t1"}
    registered = any_client.post(f"{API}/sweeps/{first['id']}/trials", json={"trial_id": "t1", "spec": spec},
                                 headers={"Authorization": f"Bearer {first['driver_token']}"})
    assert registered.status_code == 200, registered.text
    replay = _sweep(any_client, sweep_body, "driven", driver="external")
    assert replay.status_code == 409 and "being driven already" in replay.json()["detail"]
    still = any_client.post(f"{API}/sweeps/{first['id']}/report/status", json={"status": "COMPLETED"},
                            headers={"Authorization": f"Bearer {first['driver_token']}"})
    assert still.status_code == 200  # the driver's token still works


def test_a_driver_that_reported_keeps_its_token_through_a_replay(any_client, sweep_body):
    first = _sweep(any_client, sweep_body, "started", driver="external").json()
    auth = {"Authorization": f"Bearer {first['driver_token']}"}
    report = f"{API}/sweeps/{first['id']}/report/status"
    assert any_client.post(report, json={"status": "RUNNING"}, headers=auth).status_code == 200  # Tune starting
    assert _sweep(any_client, sweep_body, "started", driver="external").status_code == 409
    assert any_client.post(report, json={"status": "COMPLETED"}, headers=auth).status_code == 200


def test_a_token_replacement_from_a_stale_read_changes_nothing(repo, sweep_body):
    """Two replays at once: the one that read the sweep before the other replaced the token does
    not replace it again (the client holds the answer it got last)."""
    from dataclasses import replace
    from datetime import timedelta

    from api.sweeps import SweepSpec
    from service.sweep_repository import SweepRepository

    sweeps = SweepRepository(repo)
    sweep = sweeps.create_sweep(SweepSpec.model_validate(sweep_body), driver="external", token="t0", project="default")
    assert sweeps.replace_driver_token(sweep, "t1") == "replaced" and sweeps.check_token(sweep.id, "t1")
    assert sweeps.replace_driver_token(sweep, "t2") == "driven"  # read before t1's replacement
    assert sweeps.check_token(sweep.id, "t1") and not sweeps.check_token(sweep.id, "t2")
    stale = replace(sweep, updated_at=sweep.updated_at - timedelta(seconds=1))
    assert sweeps.replace_driver_token(stale, "t3") == "driven"


def test_the_loser_of_a_sweep_insert_race_reads_the_winners_sweep(repo, sweep_body, monkeypatch):
    from api.sweeps import SweepSpec
    from service.sweep_repository import SweepRepository

    sweeps, spec = SweepRepository(repo), SweepSpec.model_validate(sweep_body)
    winner, created = sweeps.create_sweep_once(spec, driver="service", token=None, project="default",
                                               idempotency_key="k")
    real_lookup, calls = sweeps.sweep_by_idempotency_key, []

    def stale_first_lookup(project, key):
        calls.append(key)
        return None if len(calls) == 1 else real_lookup(project, key)

    monkeypatch.setattr(sweeps, "sweep_by_idempotency_key", stale_first_lookup)
    loser, loser_created = sweeps.create_sweep_once(spec, driver="service", token=None, project="default",
                                                    idempotency_key="k")
    assert (created, loser_created, loser.id) == (True, False, winner.id) and len(calls) == 2
