"""The sweep API over a real app and SQLite: create, read, cancel, and a driver's reports."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from sqlalchemy import update

from service.db.models import Run
from service.sweep_repository import TRIAL_OUTLIVED_SWEEP

API = "/api/v1"


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _external(client, body) -> tuple[dict, str]:
    response = client.post(f"{API}/sweeps", json=body, params={"driver": "external"})
    assert response.status_code == 201, response.text
    sweep = response.json()
    return sweep, sweep["driver_token"]


def _trial_spec(example_body, name: str, lr: float = 0.1) -> dict:
    spec = copy.deepcopy(example_body)
    spec.update(name=name, algorithms=[{"name": "channels_last"}])
    spec["optimizer"]["lr"] = lr
    return spec


def _register(client, sweep_id, token, trial_id, spec, params=None):
    return client.post(f"{API}/sweeps/{sweep_id}/trials", headers=_auth(token),
                       json={"trial_id": trial_id, "spec": spec, "params": params or {}})


def _ticket(client, sweep_id, token, trial_id, example_body, lr=0.1) -> dict:
    response = _register(client, sweep_id, token, trial_id, _trial_spec(example_body, trial_id, lr),
                         {"optimizer.lr": lr})
    assert response.status_code == 200, response.text
    return response.json()


def _report(client, run_id, token, status, **extra):
    response = client.post(f"{API}/runs/{run_id}/report/status", headers=_auth(token), json={"status": status, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def _metrics(client, run_id, token, key, values):
    points = [{"step": i, "key": key, "value": v, "time": "2026-11-29T12:00:00Z"} for i, v in enumerate(values)]
    response = client.post(f"{API}/runs/{run_id}/report/metrics", headers=_auth(token), json={"points": points})
    assert response.status_code == 200, response.text


def _set_times(client, run_id, started: datetime, seconds: float, *, span: float | None = None) -> None:
    # The wall time of a trial is the time it trained, real time between its reports; pin it so the
    # frontier is known. ``span``: its first start to its end, waits between attempts included.
    with client.app.state.repo.engine.begin() as conn:
        conn.execute(update(Run).where(Run.id == run_id)
                     .values(started_at=started, finished_at=started + timedelta(seconds=span or seconds),
                             trained_seconds=seconds))


def test_a_service_sweep_is_queued_with_its_skipped_sets_and_no_driver_token(client, sweep_body):
    response = client.post(f"{API}/sweeps", json=sweep_body)
    assert response.status_code == 201
    sweep = response.json()
    assert (sweep["status"], sweep["attempt"], sweep["driver"], sweep["driver_token"]) == ("QUEUED", 1, "service", None)
    assert (sweep["metric"], sweep["mode"], sweep["trials"], sweep["pareto"], sweep["best_run_id"]) == (
        "eval/accuracy", "max", [], [], None)
    [skipped] = sweep["skipped"]
    assert skipped["algorithms"] == ["ema", "swa"] and "do not compose" in skipped["reason"]
    assert sweep["replayed"] is False  # the create's answer says it made the sweep; a read does not say
    assert client.get(f"{API}/sweeps/{sweep['id']}").json() == sweep | {"replayed": None}


def test_sweeps_are_listed_newest_first_with_a_limit(client, sweep_body):
    first = client.post(f"{API}/sweeps", json=sweep_body).json()
    second = client.post(f"{API}/sweeps", json={**sweep_body, "name": "second"}).json()
    assert [s["id"] for s in client.get(f"{API}/sweeps").json()["data"]] == [second["id"], first["id"]]
    assert [s["id"] for s in client.get(f"{API}/sweeps", params={"limit": 1}).json()["data"]] == [second["id"]]


def test_an_external_sweep_runs_at_once_with_a_token_shown_only_in_the_creation_answer(client, fake_jobs, sweep_body):
    sweep, token = _external(client, sweep_body)
    assert sweep["status"] == "RUNNING" and sweep["driver"] == "external" and len(token) > 20
    assert client.get(f"{API}/sweeps/{sweep['id']}").json()["driver_token"] is None
    client.app.state.dispatcher.tick()
    assert fake_jobs.submit_calls == [] and client.get(f"{API}/sweeps/{sweep['id']}").json()["status"] == "RUNNING"


def _bad_param(b):
    b["search"]["params"]["optimizer.lr"] = {"grid": [-0.1]}


INVALID_SWEEPS = {
    "param_value_the_run_spec_refuses": (_bad_param, "search.params['optimizer.lr']", {"grid": [-0.1]},
                                         "value -0.1 is not allowed"),
    "bad_base_field": (lambda b: b["base"]["optimizer"].update(lr=-0.1), "base.optimizer.lr", -0.1, "greater than 0"),
    "unknown_scheduler": (lambda b: b.update(scheduler={"name": "hyperband"}), "scheduler.name", "hyperband",
                          "'fifo' or 'asha'"),
    "unknown_field": (lambda b: b.update(colour="red"), "colour", "red", "allowed fields here: name, base, search"),
    "asha_grace_past_the_end": (lambda b: b.update(scheduler={"name": "asha", "grace_period": "5ep"}),
                                "scheduler.grace_period", "5ep", "less than base.max_duration"),
}


@pytest.mark.parametrize("case", INVALID_SWEEPS)
def test_an_invalid_sweep_is_refused_naming_the_field_and_value_and_nothing_is_stored(client, sweep_body, case):
    mutate, field, value, msg = INVALID_SWEEPS[case]
    mutate(sweep_body)
    response = client.post(f"{API}/sweeps", json=sweep_body)
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert (item["field"], item["input"]) == (field, value) and msg in item["msg"], item
    assert client.get(f"{API}/sweeps").json() == {"data": [], "next_cursor": None}


def test_an_unknown_driver_is_refused_naming_the_query_parameter(client, sweep_body):
    response = client.post(f"{API}/sweeps", json=sweep_body, params={"driver": "laptop"})
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "driver"


def test_an_unknown_sweep_is_404(client):
    assert client.get(f"{API}/sweeps/nope").status_code == 404
    assert client.post(f"{API}/sweeps/nope/cancel").json() == {"detail": "sweep nope not found"}


def test_driver_endpoints_need_the_sweep_s_own_token(client, sweep_body, example_body):
    sweep, token = _external(client, sweep_body)
    other, other_token = _external(client, {**sweep_body, "name": "other"})
    spec = _trial_spec(example_body, "t")
    for headers in ({}, _auth("wrong"), _auth(other_token), {"Authorization": f"Basic {token}"}):
        assert client.post(f"{API}/sweeps/{sweep['id']}/report/status", headers=headers,
                           json={"status": "COMPLETED"}).status_code == 401
        assert client.post(f"{API}/sweeps/{sweep['id']}/trials", headers=headers,
                           json={"trial_id": "t1", "spec": spec}).status_code == 401
        assert client.post(f"{API}/sweeps/{sweep['id']}/trials/t1/end", headers=headers,
                           json={"outcome": "failed"}).status_code == 401
    assert client.post(f"{API}/sweeps/nope/report/status", headers=_auth(token),
                       json={"status": "RUNNING"}).status_code == 401
    assert client.get(f"{API}/sweeps/{sweep['id']}").json()["status"] == "RUNNING"


def test_registering_a_trial_creates_a_starting_run_of_the_sweep(client, sweep_body, example_body):
    sweep, token = _external(client, sweep_body)
    ticket = _ticket(client, sweep["id"], token, "trial_00001", example_body, lr=0.05)
    assert ticket["attempt"] == 1
    run = client.get(f"{API}/runs/{ticket['run_id']}").json()
    assert (run["status"], run["sweep_id"], run["trial_id"], run["name"]) == (
        "STARTING", sweep["id"], "trial_00001", "trial_00001")
    assert run["driven_by_sweep"] is True  # canceled with its sweep: the dashboard links there
    assert client.post(f"{API}/runs", json=example_body).json()["driven_by_sweep"] is False
    events = client.get(f"{API}/runs/{ticket['run_id']}/events").json()["data"]
    assert [(e["from_status"], e["to_status"]) for e in events] == [(None, "QUEUED"), ("QUEUED", "STARTING")]
    _report(client, ticket["run_id"], ticket["token"], "RUNNING")  # the trial reports like any run
    [trial] = client.get(f"{API}/sweeps/{sweep['id']}").json()["trials"]
    assert (trial["run_id"], trial["status"], trial["algorithms"], trial["params"]) == (
        ticket["run_id"], "RUNNING", ["channels_last"], {"optimizer.lr": 0.05})


def test_registering_a_trial_again_starts_attempt_two_of_the_same_run_and_revokes_the_old_token(
        client, sweep_body, example_body):
    sweep, token = _external(client, sweep_body)
    first = _ticket(client, sweep["id"], token, "t1", example_body)
    _report(client, first["run_id"], first["token"], "RUNNING")
    again = _ticket(client, sweep["id"], token, "t1", example_body)
    assert again["run_id"] == first["run_id"] and again["attempt"] == 2 and again["token"] != first["token"]
    assert client.post(f"{API}/runs/{first['run_id']}/report/status", headers=_auth(first["token"]),
                       json={"status": "COMPLETED"}).status_code == 401
    run = client.get(f"{API}/runs/{first['run_id']}").json()
    assert (run["status"], run["attempt"]) == ("STARTING", 2)
    assert len(client.get(f"{API}/runs", params={"sweep_id": sweep["id"]}).json()["data"]) == 1


def test_a_trial_whose_spec_is_not_a_run_spec_is_422_naming_the_field(client, sweep_body, example_body):
    sweep, token = _external(client, sweep_body)
    spec = _trial_spec(example_body, "t1", lr=-1.0)
    response = _register(client, sweep["id"], token, "t1", spec)
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert (item["field"], item["input"]) == ("spec.optimizer.lr", -1.0) and "greater than 0" in item["msg"]
    assert client.get(f"{API}/runs").json()["data"] == []


def test_a_completed_trial_cannot_be_registered_again(client, sweep_body, example_body):
    sweep, token = _external(client, sweep_body)
    ticket = _ticket(client, sweep["id"], token, "t1", example_body)
    _report(client, ticket["run_id"], ticket["token"], "RUNNING")
    _report(client, ticket["run_id"], ticket["token"], "COMPLETED")
    response = _register(client, sweep["id"], token, "t1", _trial_spec(example_body, "t1"))
    assert response.status_code == 409 and "COMPLETED" in response.json()["detail"]


def test_end_trial_stops_or_fails_an_active_trial_and_leaves_a_completed_one(client, sweep_body, example_body):
    sweep, token = _external(client, sweep_body)
    stopped, failed, completed = (_ticket(client, sweep["id"], token, t, example_body) for t in ("s", "f", "c"))
    for ticket in (stopped, failed, completed):
        _report(client, ticket["run_id"], ticket["token"], "RUNNING")
    _report(client, completed["run_id"], completed["token"], "COMPLETED")

    def end(trial_id, outcome, **extra):
        response = client.post(f"{API}/sweeps/{sweep['id']}/trials/{trial_id}/end", headers=_auth(token),
                               json={"outcome": outcome, **extra})
        assert response.status_code == 200, response.text
        return response.json()

    assert end("s", "stopped")["status"] == "STOPPED"
    failed_run = end("f", "failed", error="RuntimeError: CUDA error")
    assert (failed_run["status"], failed_run["error"]) == ("FAILED", "RuntimeError: CUDA error")
    assert end("c", "stopped")["status"] == "COMPLETED"
    assert end("s", "failed")["status"] == "STOPPED"  # already ended: a repeat changes nothing
    assert client.post(f"{API}/sweeps/{sweep['id']}/trials/nope/end", headers=_auth(token),
                       json={"outcome": "failed"}).status_code == 404
    assert client.get(f"{API}/sweeps/{sweep['id']}").json()["counts"] == {"STOPPED": 1, "FAILED": 1, "COMPLETED": 1}


def test_a_stopped_trial_can_be_resumed_as_a_standalone_run(client, sweep_body, example_body):
    sweep, token = _external(client, sweep_body)
    ticket = _ticket(client, sweep["id"], token, "t1", example_body)
    client.post(f"{API}/sweeps/{sweep['id']}/trials/t1/end", headers=_auth(token), json={"outcome": "stopped"})
    resumed = client.post(f"{API}/runs/{ticket['run_id']}/resume").json()
    assert (resumed["status"], resumed["attempt"]) == ("QUEUED", 2)
    client.app.state.dispatcher.tick()
    assert client.get(f"{API}/runs/{ticket['run_id']}").json()["status"] == "STARTING"
    assert client.app.state.jobs.submit_calls == [f"run-{ticket['run_id']}-attempt-2"]


def test_the_view_has_each_trial_s_best_metric_the_pareto_front_and_the_best_run(client, sweep_body, example_body):
    sweep, token = _external(client, sweep_body)
    t0 = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)
    # (accuracy points, end, wall time): fast-ok and slow-best are on the front; dominated is
    # slower and worse than fast-ok; the stopped trial is best of all but did not complete.
    # fast-ok waited an hour between two attempts: the wait is not its cost.
    trials = {"fast-ok": ([0.5, 0.9, 0.85], "COMPLETED", 10.0), "slow-best": ([0.6, 0.95], "COMPLETED", 60.0),
              "dominated": ([0.8], "COMPLETED", 20.0), "stopped": ([0.99], "stopped", 5.0)}
    spans = {"fast-ok": 3610.0}
    run_ids = {}
    for trial_id, (points, end, seconds) in trials.items():
        ticket = _ticket(client, sweep["id"], token, trial_id, example_body)
        run_ids[trial_id] = ticket["run_id"]
        _report(client, ticket["run_id"], ticket["token"], "RUNNING")
        _metrics(client, ticket["run_id"], ticket["token"], "eval/accuracy", points)
        _metrics(client, ticket["run_id"], ticket["token"], "time/progress", [0.5, 1.0])
        if end == "COMPLETED":
            _report(client, ticket["run_id"], ticket["token"], "COMPLETED")
        else:
            client.post(f"{API}/sweeps/{sweep['id']}/trials/{trial_id}/end", headers=_auth(token),
                        json={"outcome": end})
        _set_times(client, ticket["run_id"], t0, seconds, span=spans.get(trial_id))
    view = client.get(f"{API}/sweeps/{sweep['id']}").json()
    by_trial = {t["trial_id"]: t for t in view["trials"]}
    fast = by_trial["fast-ok"]
    assert (fast["metric"], fast["last_metric"], fast["wall_time_s"], fast["progress"]) == (0.9, 0.85, 10.0, 1.0)
    assert by_trial["stopped"]["status"] == "STOPPED" and by_trial["stopped"]["metric"] == 0.99
    assert view["pareto"] == [run_ids["fast-ok"], run_ids["slow-best"]]
    assert view["best_run_id"] == run_ids["slow-best"]
    assert view["counts"] == {"COMPLETED": 3, "STOPPED": 1}


def test_a_training_trial_s_wall_time_is_its_ended_attempts_and_the_one_training_now(client, sweep_body,
                                                                                      example_body):
    sweep, token = _external(client, sweep_body)
    ticket = _ticket(client, sweep["id"], token, "t", example_body)
    _report(client, ticket["run_id"], ticket["token"], "RUNNING")
    now = datetime.now(timezone.utc)
    # A first attempt trained 3 s, then it waited a day; the second has trained 5 s so far.
    with client.app.state.repo.engine.begin() as conn:
        conn.execute(update(Run).where(Run.id == ticket["run_id"])
                     .values(started_at=now - timedelta(days=1), trained_seconds=3.0,
                             training_since=now - timedelta(seconds=5)))
    (trial,) = client.get(f"{API}/sweeps/{sweep['id']}").json()["trials"]
    assert trial["status"] == "RUNNING" and 8.0 <= trial["wall_time_s"] < 68.0


def test_a_min_mode_sweep_picks_the_lowest_loss(client, sweep_body, example_body):
    sweep, token = _external(client, {**sweep_body, "metric": "eval/loss", "mode": "min"})
    run_ids = {}
    for trial_id, losses in (("a", [2.0, 0.7, 0.9]), ("b", [1.5, 0.8])):
        ticket = _ticket(client, sweep["id"], token, trial_id, example_body)
        run_ids[trial_id] = ticket["run_id"]
        _report(client, ticket["run_id"], ticket["token"], "RUNNING")
        _metrics(client, ticket["run_id"], ticket["token"], "eval/loss", losses)
        _report(client, ticket["run_id"], ticket["token"], "COMPLETED")
    view = client.get(f"{API}/sweeps/{sweep['id']}").json()
    assert {t["trial_id"]: t["metric"] for t in view["trials"]} == {"a": 0.7, "b": 0.8}
    assert view["best_run_id"] == run_ids["a"]


def test_a_run_s_best_follows_each_metric_s_mode_and_its_summary_the_last_value(client, fake_jobs, example_body):
    run = client.post(f"{API}/runs", json=example_body).json()
    client.app.state.dispatcher.tick()
    token = fake_jobs.jobs[f"run-{run['id']}-attempt-1"]["env"]["TESSERA_RUN_TOKEN"]
    _metrics(client, run["id"], token, "eval/loss", [2.0, 1.0, 1.5])
    _metrics(client, run["id"], token, "eval/accuracy", [0.5, 0.8, 0.7])
    _metrics(client, run["id"], token, "time/epoch_s", [3.0, 2.5])
    view = client.get(f"{API}/runs/{run['id']}").json()
    assert view["best"] == {"eval/loss": 1.0, "eval/accuracy": 0.8, "time/epoch_s": 2.5}
    assert view["summary"] == {"eval/loss": 1.5, "eval/accuracy": 0.7, "time/epoch_s": 2.5}


def test_runs_can_be_listed_by_sweep(client, sweep_body, example_body):
    sweep, token = _external(client, sweep_body)
    other, other_token = _external(client, {**sweep_body, "name": "other"})
    mine = [_ticket(client, sweep["id"], token, t, example_body)["run_id"] for t in ("a", "b")]
    _ticket(client, other["id"], other_token, "a", example_body)
    client.post(f"{API}/runs", json=example_body)
    listed = client.get(f"{API}/runs", params={"sweep_id": sweep["id"]}).json()["data"]
    assert [r["id"] for r in listed] == mine[::-1] and {r["sweep_id"] for r in listed} == {sweep["id"]}
    assert len(client.get(f"{API}/runs").json()["data"]) == 4


def test_sweep_reads_answer_304_when_nothing_changed(client, sweep_body):
    sweep, _ = _external(client, sweep_body)
    for path in (f"{API}/sweeps/{sweep['id']}", f"{API}/sweeps"):
        first = client.get(path)
        etag = first.headers["etag"]
        again = client.get(path, headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b""
    client.post(f"{API}/sweeps/{sweep['id']}/cancel")
    assert client.get(f"{API}/sweeps/{sweep['id']}", headers={"If-None-Match": etag}).status_code == 200


def test_the_driver_s_end_report_ends_the_sweep_and_fails_trials_that_never_reported(client, sweep_body, example_body):
    sweep, token = _external(client, sweep_body)
    done = _ticket(client, sweep["id"], token, "done", example_body)
    _report(client, done["run_id"], done["token"], "RUNNING")
    _report(client, done["run_id"], done["token"], "COMPLETED")
    lost = _ticket(client, sweep["id"], token, "lost", example_body)
    response = client.post(f"{API}/sweeps/{sweep['id']}/report/status", headers=_auth(token),
                           json={"status": "COMPLETED", "message": "Tune finished"})
    view = response.json()
    assert (view["status"], view["message"]) == ("COMPLETED", "Tune finished") and view["finished_at"] is not None
    lost_run = client.get(f"{API}/runs/{lost['run_id']}").json()
    assert (lost_run["status"], lost_run["error"]) == ("FAILED", TRIAL_OUTLIVED_SWEEP)
    assert client.get(f"{API}/runs/{done['run_id']}").json()["status"] == "COMPLETED"
    assert _register(client, sweep["id"], token, "late", _trial_spec(example_body, "late")).status_code == 409


def test_a_driver_may_report_only_running_completed_or_failed(client, sweep_body):
    sweep, token = _external(client, sweep_body)
    response = client.post(f"{API}/sweeps/{sweep['id']}/report/status", headers=_auth(token),
                           json={"status": "CANCELED"})
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "status"
    failed = client.post(f"{API}/sweeps/{sweep['id']}/report/status", headers=_auth(token),
                         json={"status": "FAILED", "error": "Traceback...\nValueError: boom"}).json()
    assert (failed["status"], failed["error"]) == ("FAILED", "Traceback...\nValueError: boom")


def test_canceling_an_external_sweep_cancels_it_and_its_active_trials_at_once(client, sweep_body, example_body):
    sweep, token = _external(client, sweep_body)
    ticket = _ticket(client, sweep["id"], token, "t1", example_body)
    _report(client, ticket["run_id"], ticket["token"], "RUNNING")
    canceled = client.post(f"{API}/sweeps/{sweep['id']}/cancel").json()
    assert canceled["status"] == "CANCELED" and canceled["counts"] == {"CANCELED": 1}
    assert client.get(f"{API}/runs/{ticket['run_id']}").json()["status"] == "CANCELED"
    again = client.post(f"{API}/sweeps/{sweep['id']}/cancel")
    assert again.status_code == 409 and "already ended" in again.json()["detail"]
    late = client.post(f"{API}/sweeps/{sweep['id']}/report/status", headers=_auth(token), json={"status": "COMPLETED"})
    assert late.status_code == 200 and late.json()["status"] == "CANCELED"  # the cancel wins


def test_an_active_trial_cannot_be_canceled_on_its_own(client, sweep_body, example_body):
    sweep, token = _external(client, sweep_body)
    ticket = _ticket(client, sweep["id"], token, "t1", example_body)
    response = client.post(f"{API}/runs/{ticket['run_id']}/cancel")
    assert response.status_code == 409 and "cancel its sweep instead" in response.json()["detail"]
    assert client.get(f"{API}/runs/{ticket['run_id']}").json()["status"] == "STARTING"


def test_the_sdk_drives_an_external_sweep_end_to_end(client, sweep_body, example_body):
    from api.client import Client
    from api.errors import ApiError
    from api.views import StatusReport, SweepStatusReport, TrialEnd, TrialRegistration

    class ThroughTestClient(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            answer = client.request(request.method, str(request.url), headers=dict(request.headers),
                                    content=request.read())
            return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    sdk = Client("http://testserver", transport=ThroughTestClient())
    sweep = sdk.create_sweep(sweep_body, driver="external")
    token = sweep.driver_token
    assert sdk.report_sweep_status(sweep.id, token, SweepStatusReport(status="RUNNING")).status.value == "RUNNING"
    tickets = {t: sdk.register_trial(sweep.id, token, TrialRegistration(trial_id=t, spec=_trial_spec(example_body, t),
                                                                         params={"optimizer.lr": 0.1}))
               for t in ("a", "b")}
    sdk.report_status(tickets["a"].run_id, tickets["a"].token, StatusReport(status="RUNNING"))
    sdk.report_status(tickets["a"].run_id, tickets["a"].token, StatusReport(status="COMPLETED"))
    assert sdk.end_trial(sweep.id, token, "b", TrialEnd(outcome="stopped")).status.value == "STOPPED"
    assert {r.trial_id for r in sdk.iter_runs(sweep_id=sweep.id)} == {"a", "b"}
    assert [r.id for r in sdk.list_runs(sweep_id=sweep.id, status="COMPLETED").data] == [tickets["a"].run_id]
    sdk.report_sweep_status(sweep.id, token, SweepStatusReport(status="COMPLETED"))
    done = sdk.wait_sweep(sweep.id, timeout=5)
    assert done.status.value == "COMPLETED" and done.counts == {"COMPLETED": 1, "STOPPED": 1}
    assert [s.id for s in sdk.list_sweeps().data] == [sweep.id]
    with pytest.raises(ApiError) as info:
        sdk.cancel_sweep(sweep.id)
    assert info.value.status_code == 409


def test_a_metric_decided_the_wrong_way_or_never_reported_is_refused_and_a_left_out_mode_follows_the_metric(
        client, sweep_body):
    def refused(**changes) -> list[tuple[str, object]]:
        response = client.post(f"{API}/sweeps", json={**sweep_body, **changes})
        assert response.status_code == 422, response.text
        return [(item["field"], item["input"]) for item in response.json()["detail"]]

    assert refused(metric="eval/loss", mode="max") == [("mode", "max")]  # ASHA would stop the best trials
    assert refused(metric="eval/perplexity", mode="min") == [("metric", "eval/perplexity")]  # digits is vision
    no_eval = copy.deepcopy(sweep_body)
    no_eval["base"]["data"].pop("eval")
    assert refused(**no_eval) == [("base.data.eval", None)]
    # A metric of the base's eval_metrics: only when the base lists it (or lists your own, which may return it).
    assert refused(metric="eval/f1_macro") == [("metric", "eval/f1_macro")]
    assert refused(metric="eval/F1") == [("metric", "eval/F1")]  # no such key: the pattern says what one is
    assert client.get(f"{API}/sweeps").json()["data"] == []  # nothing stored
    created = client.post(f"{API}/sweeps", json={**sweep_body, "metric": "eval/loss"})
    assert created.status_code == 201 and created.json()["mode"] == "min"
    listed = copy.deepcopy(sweep_body)
    listed["base"]["eval_metrics"] = ["f1_macro"]
    created = client.post(f"{API}/sweeps", json={**listed, "metric": "eval/f1_macro"})
    assert created.status_code == 201, created.text
    assert created.json()["mode"] == "max"
    # With a metric of your own listed, a name that is not a built-in may be what it returns; a built-in's is not.
    listed["base"]["eval_metrics"].append({"import": "my_project.metrics:pr_curve"})
    assert refused(**listed, metric="eval/balanced_accuracy") == [("metric", "eval/balanced_accuracy")]
    created = client.post(f"{API}/sweeps", json={**listed, "metric": "eval/pr_auc", "mode": "max"})
    assert created.status_code == 201, created.text
