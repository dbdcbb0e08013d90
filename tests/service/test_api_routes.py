"""The REST API over a real database and a fake Ray: status codes, error bodies, reports."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from api import catalog
from api.algorithm_specs import ALGORITHM_SPECS
from api.views import RunStatus

API = "/api/v1"


def _create(client, body) -> dict:
    response = client.post(f"{API}/runs", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def _start(client, fake_jobs, body) -> tuple[dict, str]:
    """Create a run and let the dispatcher submit it; returns the run and its worker token."""
    run = _create(client, body)
    client.app.state.dispatcher.tick()
    token = fake_jobs.jobs[f"run-{run['id']}-attempt-1"]["env"]["TESSERA_RUN_TOKEN"]
    return run, token


def _report(client, run_id, token, status, **extra):
    return client.post(f"{API}/runs/{run_id}/report/status", json={"status": status, **extra},
                       headers={"Authorization": f"Bearer {token}"})


def _points(*values: float, key: str = "loss", first_step: int = 0) -> dict:
    now = datetime.now(timezone.utc).isoformat()
    return {"points": [{"step": first_step + i, "key": key, "value": v, "time": now} for i, v in enumerate(values)]}


def test_example_spec_is_accepted_and_queued(client, example_body):
    run = _create(client, example_body)
    assert run["status"] == "QUEUED" and run["attempt"] == 1 and run["name"] == "digits-resnet"
    assert run["spec"]["algorithms"][2] == {"name": "cutmix", "alpha": 1.0, "uniform_sampling": False}
    assert run["replayed"] is False  # the create's answer says it made the run; a read does not say
    assert client.get(f"{API}/runs/{run['id']}").json() == run | {"replayed": None}
    assert [r["id"] for r in client.get(f"{API}/runs").json()["data"]] == [run["id"]]


INVALID_SPECS = {
    "unknown_algorithm": (lambda b: b["algorithms"].append({"name": "warp_drive"}),
                          "algorithms[3].name", "warp_drive",
                          "unknown algorithm 'warp_drive'; known: alibi, augmix, blurpool, channels_last"),
    "negative_lr": (lambda b: b["optimizer"].update(lr=-0.1), "optimizer.lr", -0.1, "greater than 0"),
    "duration_in_words": (lambda b: b.update(max_duration="3 epochs"), "max_duration", "3 epochs",
                          "expected an integer followed by ep, ba, sp or tok (e.g. '3ep', '100ba')"),
    "unknown_model": (lambda b: b.update(model={"name": "vit_b16"}), "model.name", "vit_b16",
                      "unknown model 'vit_b16'; did you mean {name: torchvision, arch: vit_b_16}? known: cifar_resnet20, "
                      "gpt_small, resnet18, simple_cnn, torchvision"),
    "model_close_to_a_built_in_one": (lambda b: b.update(model={"name": "resnet19"}), "model.name", "resnet19",
                                      "did you mean 'resnet18', or {name: torchvision, arch: resnet18}?"),
    "zero_workers": (lambda b: b["parallelism"].update(num_workers=0), "parallelism.num_workers", 0,
                     "greater than or equal to 1"),
    "unknown_top_level_field": (lambda b: b.update(colour="red"), "colour", "red",
                                "allowed fields here: name, model, data, optimizer"),
    "misspelled_field": (lambda b: b.update(schedular={"name": "cosine"}), "schedular", {"name": "cosine"},
                         "Extra inputs are not permitted; did you mean 'scheduler'? allowed fields here: name, model"),
    "misspelled_short_nested_field": (lambda b: b["optimizer"].update(lrr=0.1), "optimizer.lrr", 0.1,
                                      "did you mean 'lr'? allowed fields here: name, lr, momentum"),
    "parallelism_none_with_two_workers": (lambda b: b["parallelism"].update(strategy="none"),
                                          "parallelism.num_workers", 2, "exactly one worker"),
    # Accepted by RunSpec, so that stored specs still load, and refused in a new submission.
    "unused_loader_workers": (lambda b: b["data"].update(num_loader_workers=2), "data.num_loader_workers", 2,
                              "set num_workers on an image_folder or webdataset data set"),
    "webdataset_without_drop_last": (
        lambda b: b["data"].update(train={"name": "webdataset", "urls": "s3://bucket/train-{0..3}.tar", "num_samples": 64},
                                   eval=None, drop_last=False), "data.drop_last", False, "leave drop_last true"),
}


@pytest.mark.parametrize("case", INVALID_SPECS)
def test_invalid_spec_is_refused_with_field_value_and_what_is_allowed_and_nothing_stored(client, example_body, case):
    mutate, field, bad_value, allowed = INVALID_SPECS[case]
    mutate(example_body)
    response = client.post(f"{API}/runs", json=example_body)
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert item["field"] == field and item["input"] == bad_value and allowed in item["msg"]
    assert item["loc"][0] == "body"
    assert client.get(f"{API}/runs").json() == {"data": [], "next_cursor": None}


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"name: yaml-is-not-json", b""])
def test_malformed_bodies_get_422_not_500(client, content):
    response = client.post(f"{API}/runs", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["detail"][0]["msg"]


def test_unknown_run_is_404_with_a_stable_detail(client):
    for method, path in [("GET", "/runs/nope"), ("POST", "/runs/nope/cancel"), ("GET", "/runs/nope/events"),
                         ("GET", "/runs/nope/metrics")]:
        response = client.request(method, f"{API}{path}")
        assert (response.status_code, response.json()) == (404, {"detail": "run nope not found"})


def test_cancel_of_a_queued_run_marks_it_canceling(client, example_body):
    run = _create(client, example_body)
    response = client.post(f"{API}/runs/{run['id']}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "CANCELING"
    assert client.post(f"{API}/runs/{run['id']}/cancel").json()["status"] == "CANCELING"  # retry is harmless


def test_cancel_of_a_completed_run_is_409(client, fake_jobs, example_body):
    run, token = _start(client, fake_jobs, example_body)
    assert _report(client, run["id"], token, "RUNNING").json()["status"] == "RUNNING"
    assert _report(client, run["id"], token, "COMPLETED").json()["status"] == "COMPLETED"
    response = client.post(f"{API}/runs/{run['id']}/cancel")
    assert response.status_code == 409
    assert response.json() == {"detail": f"run {run['id']} is COMPLETED; cannot cancel"}


def test_reports_with_a_wrong_or_missing_token_are_401(client, fake_jobs, example_body):
    run, token = _start(client, fake_jobs, example_body)
    for headers in ({"Authorization": "Bearer not-the-token"}, {"Authorization": token}, {}):
        status = client.post(f"{API}/runs/{run['id']}/report/status", json={"status": "RUNNING"}, headers=headers)
        metrics = client.post(f"{API}/runs/{run['id']}/report/metrics", json=_points(1.0), headers=headers)
        assert status.status_code == metrics.status_code == 401
    assert client.get(f"{API}/runs/{run['id']}").json()["status"] == "STARTING"
    assert client.get(f"{API}/runs/{run['id']}/metrics").json()["data"] == []


def test_worker_reports_move_the_run_and_refuse_what_the_state_machine_refuses(client, fake_jobs, example_body):
    run, token = _start(client, fake_jobs, example_body)
    assert _report(client, run["id"], token, "RUNNING").json()["started_at"] is not None
    assert _report(client, run["id"], token, "RUNNING").status_code == 200  # a retried report
    queued = _report(client, run["id"], token, "QUEUED")
    assert queued.status_code == 422 and "RUNNING, RESTARTING, COMPLETED or FAILED" in queued.json()["detail"][0]["msg"]
    failed = _report(client, run["id"], token, "FAILED", error="RuntimeError: NaN loss")
    assert failed.json()["status"] == "FAILED" and failed.json()["error"] == "RuntimeError: NaN loss"
    late = _report(client, run["id"], token, "RUNNING")
    assert late.status_code == 409 and late.json() == {"detail": f"run {run['id']} is FAILED; cannot mark it RUNNING"}
    events = client.get(f"{API}/runs/{run['id']}/events").json()["data"]
    assert [e["to_status"] for e in events] == ["QUEUED", "STARTING", "RUNNING", "FAILED"]


def test_a_failed_report_says_whether_the_machine_or_the_code_failed_until_the_run_is_resumed(
        client, fake_jobs, example_body):
    lost, lost_token = _start(client, fake_jobs, example_body)
    _report(client, lost["id"], lost_token, "RUNNING")
    failed = _report(client, lost["id"], lost_token, "FAILED", error="WorkerHealthCheckFailedError: worker 1 lost",
                     failure="machine")
    assert failed.json()["failure"] == "machine"
    assert client.get(f"{API}/runs/{lost['id']}").json()["failure"] == "machine"
    resumed = client.post(f"{API}/runs/{lost['id']}/resume")
    assert resumed.status_code == 200 and resumed.json()["failure"] is None  # the new attempt has not failed

    broken, token = _start(client, fake_jobs, example_body)
    bad = _report(client, broken["id"], token, "FAILED", error="ValueError: x", failure="disk")
    assert bad.status_code == 422 and "failure" in bad.text
    code = _report(client, broken["id"], token, "FAILED", error="ValueError: x", failure="code")
    assert code.json()["failure"] == "code"
    old_worker, old_token = _start(client, fake_jobs, example_body)  # one that does not say: not known
    assert _report(client, old_worker["id"], old_token, "FAILED", error="ValueError: x").json()["failure"] is None


def test_metrics_after_returns_only_new_points(client, fake_jobs, example_body):
    run, token = _start(client, fake_jobs, example_body)
    auth = {"Authorization": f"Bearer {token}"}
    url = f"{API}/runs/{run['id']}/metrics"
    assert client.post(f"{API}/runs/{run['id']}/report/metrics", json=_points(2.0, 1.5), headers=auth).json() == {"stored": 2}
    first = client.get(url).json()
    assert [p["value"] for p in first["data"]] == [2.0, 1.5] and first["last_seq"] == first["data"][-1]["seq"]
    # Encoded by hand (not through the response model), so held to the model here: every field, as pydantic writes it
    from api.views import MetricPoint, MetricsPage

    assert MetricsPage.model_validate(first).model_dump(mode="json") == first
    assert set(first["data"][0]) == set(MetricPoint.model_fields)
    assert first["data"][0]["attempt"] == 1 and first["data"][0]["superseded"] is False
    assert first["data"][0]["time"].endswith("Z")
    client.post(f"{API}/runs/{run['id']}/report/metrics", json=_points(1.0, first_step=2), headers=auth)
    new = client.get(url, params={"after": first["last_seq"]}).json()
    assert [(p["step"], p["value"]) for p in new["data"]] == [(2, 1.0)]
    assert client.get(url, params={"after": new["last_seq"]}).json() == {"data": [], "last_seq": new["last_seq"]}
    assert client.get(f"{API}/runs/{run['id']}").json()["summary"] == {"loss": 1.0}
    # One key's points, its cursor its own.
    client.post(f"{API}/runs/{run['id']}/report/metrics", json=_points(0.7, 0.8, key="eval/auroc", first_step=3),
                headers=auth)
    auroc = client.get(url, params={"key": "eval/auroc"}).json()
    assert [(p["key"], p["step"], p["value"]) for p in auroc["data"]] == [("eval/auroc", 3, 0.7),
                                                                           ("eval/auroc", 4, 0.8)]
    assert client.get(url, params={"key": "eval/auroc", "after": auroc["last_seq"]}).json()["data"] == []
    assert client.get(url, params={"key": "eval/f1"}).json() == {"data": [], "last_seq": 0}


def test_reports_after_the_run_completed_are_refused_and_change_nothing(client, fake_jobs, example_body):
    # Issue 12: a worker token is good only while its attempt is live, so a finished run's
    # metrics, best values and checkpoints are final (this replaces "late metrics still count").
    run, token = _start(client, fake_jobs, example_body)
    _report(client, run["id"], token, "RUNNING")
    assert client.post(f"{API}/runs/{run['id']}/report/metrics", json=_points(0.5),
                       headers={"Authorization": f"Bearer {token}"}).json() == {"stored": 1}
    _report(client, run["id"], token, "COMPLETED")
    before = client.get(f"{API}/runs/{run['id']}").json()
    late = client.post(f"{API}/runs/{run['id']}/report/metrics", json=_points(0.01),
                       headers={"Authorization": f"Bearer {token}"})
    assert late.status_code == 409 and "COMPLETED" in late.json()["detail"]
    checkpoint = {"step": 9, "epoch": 1, "time": "2026-12-01T00:00:00Z", "bytes": 1, "committed": True,
                  "url": "file:///x/ep1-ba9", "world_size": 2}
    late = client.post(f"{API}/runs/{run['id']}/report/checkpoint", json=checkpoint,
                       headers={"Authorization": f"Bearer {token}"})
    assert late.status_code == 409
    late = client.post(f"{API}/runs/{run['id']}/report/status", json={"status": "FAILED", "error": "x"},
                       headers={"Authorization": f"Bearer {token}"})
    assert late.status_code == 409
    after = client.get(f"{API}/runs/{run['id']}").json()
    assert after["summary"] == before["summary"] == {"loss": 0.5}
    assert after["best"] == before["best"] and after["status"] == "COMPLETED"
    assert client.get(f"{API}/runs/{run['id']}/checkpoints").json()["data"] == []


def test_invalid_metric_batches_are_422(client, fake_jobs, example_body):
    run, token = _start(client, fake_jobs, example_body)
    auth = {"Authorization": f"Bearer {token}"}
    huge = _points(1.0, first_step=2**63)
    negative = _points(1.0, first_step=-1)
    for body, field in ((huge, "points[0].step"), (negative, "points[0].step"), ({"points": [{"step": 1}]}, "points[0].key")):
        response = client.post(f"{API}/runs/{run['id']}/report/metrics", json=body, headers=auth)
        assert response.status_code == 422 and response.json()["detail"][0]["field"] == field


def test_runs_page_through_cursors_and_filter_by_status(client, example_body):
    ids = [_create(client, example_body)["id"] for _ in range(3)]
    client.post(f"{API}/runs/{ids[0]}/cancel")
    first = client.get(f"{API}/runs", params={"limit": 2}).json()
    second = client.get(f"{API}/runs", params={"limit": 2, "cursor": first["next_cursor"]}).json()
    assert [r["id"] for r in first["data"] + second["data"]] == ids[::-1] and second["next_cursor"] is None
    canceling = client.get(f"{API}/runs", params={"status": "CANCELING"}).json()["data"]
    assert [r["id"] for r in canceling] == [ids[0]]


@pytest.mark.parametrize(("params", "field"), [({"cursor": "garbage"}, "cursor"), ({"status": "DONE"}, "status"),
                                               ({"limit": 0}, "limit"), ({"limit": "many"}, "limit")])
def test_bad_list_parameters_are_422_naming_the_parameter(client, params, field):
    response = client.get(f"{API}/runs", params=params)
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == field


def test_responses_never_carry_tokens_or_their_hashes(client, fake_jobs, example_body):
    run, token = _start(client, fake_jobs, example_body)
    bodies = [client.get(f"{API}/runs/{run['id']}").text, client.get(f"{API}/runs").text,
              client.get(f"{API}/runs/{run['id']}/events").text, _report(client, run["id"], token, "RUNNING").text]
    assert all(token not in body and "token" not in body for body in bodies)


@pytest.mark.parametrize(("path", "infos"), [("algorithms", catalog.ALGORITHMS), ("models", catalog.MODELS),
                                             ("datasets", catalog.DATASETS)])
def test_catalog_lists_exactly_the_catalog_names_with_metadata_and_schemas(client, path, infos):
    entries = client.get(f"{API}/{path}").json()["data"]
    assert [e["name"] for e in entries] == list(infos)
    for entry in entries:
        assert {k: v for k, v in entry.items() if k != "params_schema"} == catalog.as_dict(infos[entry["name"]])
        assert entry["params_schema"]["properties"]["name"]["const"] == entry["name"]
    if path == "algorithms":
        assert all(e["params_schema"] == ALGORITHM_SPECS[e["name"]].model_json_schema() for e in entries)


def test_healthz_reports_database_and_ray(client, fake_jobs):
    assert client.get("/healthz").json() == {"status": "ok", "database": "ok", "ray": "ok"}

    def unreachable(_job_id):
        raise ConnectionError("Failed to connect to Ray")

    fake_jobs.status = unreachable
    assert client.get("/healthz").json() == {"status": "ok", "database": "ok", "ray": "unreachable"}


def test_openapi_is_published_with_stable_operation_ids(client):
    spec = client.get(f"{API}/openapi.json").json()
    operation_ids = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert operation_ids == {"create_run", "list_runs", "get_run", "cancel_run", "list_run_events", "list_run_metrics",
                             "report_status", "report_metrics", "list_algorithms", "get_algorithm_card", "list_models",
                             "list_datasets", "healthz", "resume_run", "list_run_checkpoints", "report_checkpoint",
                             "create_sweep", "list_sweeps", "get_sweep", "cancel_sweep", "report_sweep_status",
                             "register_trial", "end_trial", "upload_code", "check_code", "get_code"} | {
                             "whoami", "create_key", "list_keys", "revoke_key", "create_project", "list_projects",
                             "set_project_quota", "update_project_quota", "get_run_logs", "get_sweep_logs", "get_run_model"} | {
                             "update_run", "archive_run", "unarchive_run", "delete_run", "archive_sweep",
                             "unarchive_sweep", "delete_sweep"} | {"request_run_export", "list_run_exports", "report_note"} | {
                             "fork_run", "continue_run", "list_run_children"} | {"download_code"}
    assert client.get(f"{API}/docs").status_code == 200
    assert RunStatus.QUEUED.value in spec["components"]["schemas"]["RunStatus"]["enum"]


def test_a_nan_metric_is_left_out_instead_of_breaking_the_run(client, fake_jobs, example_body):
    run, token = _start(client, fake_jobs, example_body)
    now = datetime.now(timezone.utc).isoformat()
    raw = ('{"points": [{"step": 0, "key": "loss", "value": NaN, "time": "%s"},'
           ' {"step": 0, "key": "acc", "value": 0.5, "time": "%s"}]}' % (now, now))
    response = client.post(f"{API}/runs/{run['id']}/report/metrics", content=raw,
                           headers={"Authorization": f"Bearer {token}", "content-type": "application/json"})
    assert response.json() == {"stored": 1}
    assert [p["key"] for p in client.get(f"{API}/runs/{run['id']}/metrics").json()["data"]] == ["acc"]
    assert client.get(f"{API}/runs/{run['id']}").json()["summary"] == {"acc": 0.5}


def test_hostile_input_on_postgresql_gets_a_4xx_never_a_500(pg_client, fake_jobs, example_body):
    import base64
    import json

    example_body["tags"] = ["nul\x00tag"]
    [item] = pg_client.post(f"{API}/runs", json=example_body).json()["detail"]
    assert item["field"] == "tags[0]" and "not allowed" in item["msg"]
    example_body["tags"] = ["ok"]
    run, token = _start(pg_client, fake_jobs, example_body)
    auth = {"Authorization": f"Bearer {token}"}
    assert pg_client.get(f"{API}/runs/a%00b").status_code == 404
    assert pg_client.post(f"{API}/runs/a%00b/report/status", json={"status": "RUNNING"}, headers=auth).status_code == 401
    forged = base64.urlsafe_b64encode(json.dumps(["2026-01-01T00:00:00+00:00", "a\x00b"]).encode()).decode()
    assert pg_client.get(f"{API}/runs", params={"cursor": forged}).status_code == 422
    nul_key = _points(1.0, key="lo\x00ss")
    assert pg_client.post(f"{API}/runs/{run['id']}/report/metrics", json=nul_key, headers=auth).status_code == 422
    _report(pg_client, run["id"], token, "RUNNING")
    failed = _report(pg_client, run["id"], token, "FAILED", error="bad\x00byte", message="m\x00")
    assert failed.status_code == 200 and failed.json()["error"] == "badbyte"


def test_a_value_refused_by_every_union_member_is_one_error_listing_the_alternatives(client, example_body):
    example_body["microbatch_size"] = "half"
    [item] = client.post(f"{API}/runs", json=example_body).json()["detail"]
    assert item["field"] == "microbatch_size" and item["input"] == "half"
    assert "valid integer" in item["msg"] and "'auto'" in item["msg"]


def test_unknown_nested_field_lists_the_fields_allowed_at_that_level(client, example_body):
    example_body["algorithms"][2]["beta"] = 0.5
    example_body["model"] = {}
    items = {i["field"]: i for i in client.post(f"{API}/runs", json=example_body).json()["detail"]}
    assert items["algorithms[2].beta"]["msg"].endswith("allowed fields here: name, alpha, uniform_sampling")
    assert items["model.name"]["msg"] == "Field required: 'name' must be one of 'cifar_resnet20', 'gpt_small', 'resnet18', 'simple_cnn', 'torchvision'"


@pytest.mark.parametrize("status", ["FAILED", "COMPLETED", "RUNNING"])
def test_reports_during_a_cancel_are_acknowledged_but_the_cancel_wins(client, fake_jobs, example_body, status):
    run, token = _start(client, fake_jobs, example_body)
    _report(client, run["id"], token, "RUNNING")
    client.post(f"{API}/runs/{run['id']}/cancel")
    response = _report(client, run["id"], token, status, error="SIGTERM received")
    assert response.status_code == 200 and response.json()["status"] == "CANCELING"
    assert response.json()["error"] is None
    client.app.state.dispatcher.tick()
    final = client.get(f"{API}/runs/{run['id']}").json()
    assert final["status"] == "CANCELED"
    events = [e["to_status"] for e in client.get(f"{API}/runs/{run['id']}/events").json()["data"]]
    assert events[-2:] == ["CANCELING", "CANCELED"]
