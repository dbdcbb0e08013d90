"""Fork and continue through the API, on SQLite and PostgreSQL: patches merge into the parent's
spec, changes that a checkpoint cannot survive are 422s naming the field, a COMPLETED run
continues as its next attempt, and every route is scoped to the run's project."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

API = "/api/v1"


@pytest.fixture(params=["sqlite", "postgresql"])
def api(request):
    return request.getfixturevalue("client" if request.param == "sqlite" else "pg_client")


def _finished_parent(api, fake_jobs, body, *, steps=(10, 20), status="COMPLETED") -> dict:
    """A run that trained, committed a checkpoint at each of ``steps`` and ended ``status``."""
    run = api.post(f"{API}/runs", json=body).json()
    api.app.state.dispatcher.tick()
    token = fake_jobs.jobs[f"run-{run['id']}-attempt-1"]["env"]["TESSERA_RUN_TOKEN"]
    auth = {"Authorization": f"Bearer {token}"}
    assert api.post(f"{API}/runs/{run['id']}/report/status", json={"status": "RUNNING"}, headers=auth).status_code == 200
    for step in steps:
        report = {"step": step, "epoch": step // 10, "time": datetime.now(timezone.utc).isoformat(), "bytes": 100,
                  "committed": True, "url": f"s3://bucket/runs/{run['id']}/checkpoints/ep{step // 10}-ba{step}",
                  "world_size": 2}
        assert api.post(f"{API}/runs/{run['id']}/report/checkpoint", json=report, headers=auth).status_code == 200
    if status != "RUNNING":
        done = api.post(f"{API}/runs/{run['id']}/report/status", json={"status": status, "error": "x"}, headers=auth)
        assert done.json()["status"] == status
    return run


def test_a_fork_merges_its_patch_and_records_the_parent_s_latest_checkpoint(api, fake_jobs, example_body):
    parent = _finished_parent(api, fake_jobs, example_body)
    response = api.post(f"{API}/runs/{parent['id']}/fork",
                        json={"patch": {"optimizer": {"lr": 0.05}, "max_duration": "4ep"}, "from": "latest"})
    assert response.status_code == 201, response.text
    child = response.json()
    assert child["status"] == "QUEUED" and child["parent_id"] == parent["id"] and child["id"] != parent["id"]
    assert child["spec"]["optimizer"] == {**example_body["optimizer"], "lr": 0.05, "nesterov": False}
    assert child["spec"]["max_duration"] == "4ep" and child["spec"]["algorithms"] == parent["spec"]["algorithms"]
    assert child["fork"] == {"from": "latest", "patch": {"optimizer": {"lr": 0.05}, "max_duration": "4ep"},
                             "checkpoint_url": f"s3://bucket/runs/{parent['id']}/checkpoints/ep2-ba20", "step": 20,
                             "load_optimizer": True}
    events = api.get(f"{API}/runs/{child['id']}/events").json()["data"]
    assert re.fullmatch(rf"forked from run {parent['id']} \(its checkpoint at batch 20\) by key 'first admin' \(\w+\)",
                        events[0]["message"]), events[0]["message"]  # who forked it: the key's name and id
    listed = api.get(f"{API}/runs/{parent['id']}/children").json()["data"]
    assert [run["id"] for run in listed] == [child["id"]]
    assert api.get(f"{API}/runs/{child['id']}/children").json()["data"] == []


def test_a_new_optimizer_replaces_the_old_one_and_loads_only_the_weights(api, fake_jobs, example_body):
    parent = _finished_parent(api, fake_jobs, example_body)
    child = api.post(f"{API}/runs/{parent['id']}/fork",
                     json={"patch": {"optimizer": {"name": "adamw", "lr": 0.001}}, "from": {"step": 10}}).json()
    assert child["spec"]["optimizer"]["name"] == "adamw" and "momentum" not in child["spec"]["optimizer"]
    assert child["fork"]["step"] == 10 and child["fork"]["load_optimizer"] is False


def test_a_fork_from_scratch_may_change_the_model_and_loads_nothing(api, fake_jobs, example_body):
    parent = _finished_parent(api, fake_jobs, example_body, steps=())
    response = api.post(f"{API}/runs/{parent['id']}/fork",
                        json={"patch": {"model": {"name": "resnet18"}, "algorithms": None}, "from": "scratch"})
    assert response.status_code == 201, response.text
    child = response.json()
    assert child["spec"]["model"]["name"] == "resnet18" and child["spec"]["algorithms"] == []
    assert child["fork"]["checkpoint_url"] is None and child["fork"]["from"] == "scratch"


@pytest.mark.parametrize(("patch", "field", "says"), [
    ({"model": {"params": {"width": 32}}}, "model", "the model changed"),
    ({"algorithms": [{"name": "label_smoothing", "smoothing": 0.1}, {"name": "cutmix", "alpha": 1.0}]},
     "algorithms", "surgery algorithms changed from ['channels_last'] to []"),
    ({"algorithms": [{"name": "channels_last"}, {"name": "blurpool"}]}, "algorithms", "surgery"),
    ({"data": {"train": {"image_size": 16}}}, "data.train", "data.train image_size changed"),
])
def test_changes_that_break_the_checkpoint_are_422s_naming_the_field(api, fake_jobs, example_body, patch, field,
                                                                      says):
    parent = _finished_parent(api, fake_jobs, example_body)
    response = api.post(f"{API}/runs/{parent['id']}/fork", json={"patch": patch})
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["field"] == field and error["loc"][:2] == ["body", "patch"] and says in error["msg"]
    assert api.get(f"{API}/runs/{parent['id']}/children").json()["data"] == []  # nothing half-written


def test_a_patch_that_does_not_validate_and_a_missing_checkpoint_are_422s(api, fake_jobs, example_body):
    parent = _finished_parent(api, fake_jobs, example_body)
    bad_lr = api.post(f"{API}/runs/{parent['id']}/fork", json={"patch": {"optimizer": {"lr": -1}}}).json()["detail"]
    assert bad_lr[0]["field"] == "optimizer.lr" and bad_lr[0]["loc"] == ["body", "patch", "optimizer", "lr"]
    assert bad_lr[0]["input"] == -1
    no_step = api.post(f"{API}/runs/{parent['id']}/fork", json={"from": {"step": 15}})
    assert no_step.status_code == 422 and no_step.json()["detail"][0]["field"] == "from.step"
    assert "it has: 10, 20" in no_step.json()["detail"][0]["msg"]
    bad_from = api.post(f"{API}/runs/{parent['id']}/fork", json={"from": "earliest"})
    assert bad_from.status_code == 422 and bad_from.json()["detail"][0]["field"].startswith("from")
    past_end = api.post(f"{API}/runs/{parent['id']}/fork", json={"patch": {"algorithms": {"9": {"alpha": 1}}}})
    assert past_end.status_code == 422
    assert past_end.json()["detail"][0]["field"] == "algorithms.9" and "positions 0 to" in past_end.json()["detail"][0]["msg"]
    fresh = _finished_parent(api, fake_jobs, example_body, steps=())
    none_yet = api.post(f"{API}/runs/{fresh['id']}/fork", json={"from": "latest"})
    assert none_yet.status_code == 422 and "no committed checkpoint" in none_yet.json()["detail"][0]["msg"]


def test_a_completed_run_continues_as_its_next_attempt_with_the_longer_duration(api, fake_jobs, example_body):
    run = _finished_parent(api, fake_jobs, example_body)
    response = api.post(f"{API}/runs/{run['id']}/continue", json={"max_duration": "5ep"})
    assert response.status_code == 200, response.text
    continued = response.json()
    assert continued["status"] == "QUEUED" and continued["attempt"] == 2 and continued["spec"]["max_duration"] == "5ep"
    assert continued["error"] is None and continued["finished_at"] is None
    last = api.get(f"{API}/runs/{run['id']}/events").json()["data"][-1]
    assert last["from_status"] == "COMPLETED" and last["attempt"] == 2 and "max_duration 3ep → 5ep" in last["message"]
    api.app.state.dispatcher.tick()
    assert f"run-{run['id']}-attempt-2" in fake_jobs.jobs  # a new job resumes from the run's checkpoints
    again = api.post(f"{API}/runs/{run['id']}/continue", json={"max_duration": "9ep"})
    assert again.status_code == 409 and "only COMPLETED runs can be continued" in again.json()["detail"]


@pytest.mark.parametrize(("duration", "says"), [("3ep", "not longer"), ("2ep", "not longer"),
                                                ("900ba", "units cannot be mixed")])
def test_continue_refuses_a_duration_that_is_not_longer_in_the_same_unit(api, fake_jobs, example_body, duration,
                                                                         says):
    run = _finished_parent(api, fake_jobs, example_body)
    response = api.post(f"{API}/runs/{run['id']}/continue", json={"max_duration": duration})
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "max_duration"
    assert says in response.json()["detail"][0]["msg"]
    assert api.get(f"{API}/runs/{run['id']}").json()["status"] == "COMPLETED"


def test_only_completed_runs_continue(api, fake_jobs, example_body):
    failed = _finished_parent(api, fake_jobs, example_body, status="FAILED")
    response = api.post(f"{API}/runs/{failed['id']}/continue", json={"max_duration": "5ep"})
    assert response.status_code == 409 and "resume FAILED, CANCELED or STOPPED" in response.json()["detail"]
    unsaved = _finished_parent(api, fake_jobs, example_body, steps=())
    response = api.post(f"{API}/runs/{unsaved['id']}/continue", json={"max_duration": "5ep"})
    assert response.status_code == 409 and "no committed checkpoint to continue from" in response.json()["detail"]


def _key(api, project: str, role: str) -> dict[str, str]:
    made = api.post(f"{API}/keys", json={"project": project, "role": role, "name": f"{role} of {project}"})
    return {"Authorization": f"Bearer {made.json()['key']}"}


def test_tenancy_another_project_s_run_is_404_and_a_viewer_may_only_read(api, fake_jobs, example_body):
    a, b = f"p-{uuid.uuid4().hex[:8]}", f"p-{uuid.uuid4().hex[:8]}"
    for name in (a, b):
        assert api.post(f"{API}/projects", json={"name": name}).status_code == 201
    run = api.post(f"{API}/runs", json=example_body, params={"project": a}).json()
    other, viewer = _key(api, b, "member"), _key(api, a, "viewer")
    for method, path, body in (("post", "fork", {"from": "scratch"}), ("post", "continue", {"max_duration": "9ep"}),
                               ("get", "children", None)):
        kwargs = {"json": body} if body is not None else {}
        assert getattr(api, method)(f"{API}/runs/{run['id']}/{path}", headers=other, **kwargs).status_code == 404
        expected = 200 if method == "get" else 403
        assert getattr(api, method)(f"{API}/runs/{run['id']}/{path}", headers=viewer, **kwargs).status_code == expected
    child = api.post(f"{API}/runs/{run['id']}/fork", json={"from": "scratch"}).json()
    assert child["project"] == a


KEYS = ["optimizer", "lr", "name", "sgd", "adamw", "model", "params", "width", "algorithms", "data", "train",
        "num_classes", "max_duration", "checkpoint", "keep_last", "tags", "parallelism", "num_workers", "step"]
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=8) | st.sampled_from(["3ep", "9ba", "adamw", "blurpool", "latest"]),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner, max_size=3),
                    max_leaves=12)


def test_generated_patches_and_sources_get_a_fork_or_a_422_never_a_5xx(api, fake_jobs, example_body):
    parent = _finished_parent(api, fake_jobs, example_body)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(patch=st.dictionaries(st.sampled_from(KEYS), JSON, max_size=3),
           source=st.sampled_from(["latest", "scratch", {"step": 10}, {"step": 11}, 3, None]))
    def check(patch, source):
        response = api.post(f"{API}/runs/{parent['id']}/fork", json={"patch": patch, "from": source})
        assert response.status_code in (201, 422), response.text
        if response.status_code == 422:
            assert all(item["msg"] and "loc" in item for item in response.json()["detail"])

    check()
