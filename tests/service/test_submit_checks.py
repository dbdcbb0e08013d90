"""Mistakes caught at submit that used to fail on the worker or read badly, on SQLite and
PostgreSQL: a batch larger than the data, ``tok`` units on data without tokens (both refused by
POST /runs, a sweep's base and a fork, while a stored spec that breaks them still resumes,
continues and runs its sweep's trials), the resume of a COMPLETED run, a key in several projects
that names none, a fork to another optimizer, and unknown names in a discriminated union."""

from __future__ import annotations

import copy
import uuid
from datetime import datetime, timezone

import pytest

from api.specs import RunSpec
from api.sweeps import SweepSpec
from service.access import Role

API = "/api/v1"


@pytest.fixture(params=["sqlite", "postgresql"])
def api(request):
    return request.getfixturevalue("client" if request.param == "sqlite" else "pg_client")


def _runs(api) -> list[dict]:
    return api.get(f"{API}/runs").json()["data"]


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _started(api, fake_jobs, run: dict) -> dict[str, str]:
    """Start ``run``'s attempt and report it RUNNING; the attempt's token header."""
    api.app.state.dispatcher.tick()
    auth = _auth(fake_jobs.jobs[f"run-{run['id']}-attempt-{run['attempt']}"]["env"]["TESSERA_RUN_TOKEN"])
    assert api.post(f"{API}/runs/{run['id']}/report/status", json={"status": "RUNNING"}, headers=auth).status_code == 200
    return auth


def _ended(api, fake_jobs, run: dict, status: str) -> dict:
    """``run`` trained, committed a checkpoint at batch 10 and ended ``status``."""
    auth = _started(api, fake_jobs, run)
    report = {"step": 10, "epoch": 1, "time": datetime.now(timezone.utc).isoformat(), "bytes": 100, "committed": True,
              "url": f"s3://bucket/runs/{run['id']}/checkpoints/ep1-ba10", "world_size": 2}
    assert api.post(f"{API}/runs/{run['id']}/report/checkpoint", json=report, headers=auth).status_code == 200
    done = api.post(f"{API}/runs/{run['id']}/report/status", json={"status": status, "error": "x"}, headers=auth)
    assert done.json()["status"] == status
    return done.json()


def _stored(api, body: dict) -> dict:
    """A run stored as a run submitted before the submit checks was: through the repository."""
    return api.app.state.repo.create_run(RunSpec.model_validate(body)).to_view().model_dump(mode="json")


# --- 1. a batch larger than the data -------------------------------------------------------------

def test_a_batch_larger_than_the_training_data_is_refused_naming_the_batch_and_the_examples(api, example_body):
    example_body["data"]["batch_size"] = 4000
    response = api.post(f"{API}/runs", json=example_body)
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert (item["field"], item["loc"], item["input"]) == ("data.batch_size", ["body", "data", "batch_size"], 4000)
    assert "more than the 1437 examples of data.train ('digits', split train)" in item["msg"]
    assert "at most 1436 (a multiple of parallelism.num_workers 2)" in item["msg"] and "drop_last: false" in item["msg"]
    assert _runs(api) == []
    example_body["data"]["drop_last"] = False  # one partial batch an epoch: the loader takes it
    assert api.post(f"{API}/runs", json=example_body).status_code == 201


@pytest.mark.parametrize(("data", "field", "value", "says"), [
    ({"train": {"name": "synthetic", "num_samples": 100}, "batch_size": 128}, "data.batch_size", 128,
     "more than the 100 examples of data.train ('synthetic', split train, num_samples 100)"),
    ({"train": {"name": "fashion_mnist", "limit": 50}, "batch_size": 64},
     "data.batch_size", 64, "more than the 50 examples of data.train ('fashion_mnist', split train, limit 50)"),
    ({"train": {"name": "synthetic"}, "eval": {"name": "synthetic", "split": "test", "num_samples": 1},
      "batch_size": 64}, "data.eval.num_samples", 1, "has 1 example, fewer than the 2 workers"),
    ({"train": {"name": "fashion_mnist"}, "eval": {"name": "fashion_mnist", "split": "test", "limit": 1},
      "batch_size": 64}, "data.eval.limit", 1, "a worker would have none"),
])
def test_a_data_set_the_loaders_would_refuse_is_refused_at_submit(api, example_body, data, field, value, says):
    example_body.update(data=data, algorithms=[])
    response = api.post(f"{API}/runs", json=example_body)
    assert response.status_code == 422, response.text
    [item] = response.json()["detail"]
    assert (item["field"], item["input"]) == (field, value) and says in item["msg"], item


def test_streamed_data_sets_are_counted_on_the_worker_only(api, example_body):
    example_body.update(algorithms=[], data={"train": {"name": "webdataset", "urls": "s3://bucket/train-{0..3}.tar",
                                                       "num_samples": 64}, "batch_size": 4096})
    assert api.post(f"{API}/runs", json=example_body).status_code == 201


def test_a_sweep_base_and_a_fork_are_checked_too(api, fake_jobs, example_body, sweep_body):
    sweep_body["base"] = copy.deepcopy(example_body)
    sweep_body["base"]["data"]["batch_size"] = 4000
    response = api.post(f"{API}/sweeps", json=sweep_body)
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert (item["field"], item["input"]) == ("base.data.batch_size", 4000) and "1437 examples" in item["msg"]
    parent = _ended(api, fake_jobs, api.post(f"{API}/runs", json=example_body).json(), "COMPLETED")
    forked = api.post(f"{API}/runs/{parent['id']}/fork", json={"patch": {"data": {"batch_size": 4000}}})
    assert forked.status_code == 422
    [item] = forked.json()["detail"]
    assert (item["field"], item["loc"], item["input"]) == ("data.batch_size", ["body", "patch", "data", "batch_size"],
                                                           4000)
    assert "1437 examples" in item["msg"]
    assert api.get(f"{API}/runs/{parent['id']}/children").json()["data"] == []


# --- 2. tokens on data without them --------------------------------------------------------------

@pytest.mark.parametrize(("field", "change"), [
    ("max_duration", lambda b: b.update(max_duration="1000tok")),
    ("eval_interval", lambda b: b.update(eval_interval="100tok")),
    ("checkpoint.interval", lambda b: b.update(checkpoint={"interval": "100tok"})),
    ("scheduler.warmup", lambda b: b["scheduler"].update(warmup="100tok")),
])
def test_tokens_on_images_are_refused_naming_the_field(api, example_body, field, change):
    change(example_body)
    response = api.post(f"{API}/runs", json=example_body)
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert item["field"] == field and item["input"].endswith("tok")
    assert "counts tokens, and data set 'digits' is vision data, which has none" in item["msg"]
    assert "use ep, ba" in item["msg"]
    assert _runs(api) == []


def test_tokens_on_text_data_are_accepted(api, example_body):
    example_body.update(model={"name": "gpt_small"}, algorithms=[], max_duration="100000tok", eval_interval="10000tok",
                        data={"train": {"name": "shakespeare"}, "eval": {"name": "shakespeare", "split": "test"},
                              "batch_size": 16})
    response = api.post(f"{API}/runs", json=example_body)
    assert response.status_code == 201, response.text


# --- stored specs that break 1 and 2 still resume, continue and run their sweep's trials ---------

def _unrunnable(example_body) -> dict:
    body = copy.deepcopy(example_body)
    body["data"]["batch_size"] = 4000
    body.update(max_duration="1000tok")
    return body


def test_a_stored_run_that_breaks_the_submit_checks_still_resumes_and_continues(api, fake_jobs, example_body):
    failed = _ended(api, fake_jobs, _stored(api, _unrunnable(example_body)), "FAILED")
    resumed = api.post(f"{API}/runs/{failed['id']}/resume")
    assert resumed.status_code == 200, resumed.text
    assert (resumed.json()["status"], resumed.json()["attempt"]) == ("QUEUED", 2)
    completed = _ended(api, fake_jobs, _stored(api, _unrunnable(example_body)), "COMPLETED")
    continued = api.post(f"{API}/runs/{completed['id']}/continue", json={"max_duration": "2000tok"})
    assert continued.status_code == 200, continued.text
    assert continued.json()["spec"]["max_duration"] == "2000tok" and continued.json()["spec"]["data"]["batch_size"] == 4000


def test_a_stored_sweep_that_breaks_the_submit_checks_still_runs_its_trials(api, example_body, sweep_body):
    sweep_body = {**sweep_body, "base": _unrunnable(example_body)}
    token = "driver-" + uuid.uuid4().hex
    sweep = api.app.state.sweeps.create_sweep(SweepSpec.model_validate(sweep_body), driver="external", token=token)
    trial = {**_unrunnable(example_body), "name": "t1"}
    response = api.post(f"{API}/sweeps/{sweep.id}/trials", headers=_auth(token),
                        json={"trial_id": "t1", "spec": trial, "params": {}})
    assert response.status_code == 200, response.text


# --- 4. resuming a COMPLETED run says what to do instead ---------------------------------------

def test_resuming_a_completed_run_says_to_continue_or_fork_it(api, fake_jobs, example_body):
    run = _ended(api, fake_jobs, api.post(f"{API}/runs", json=example_body).json(), "COMPLETED")
    response = api.post(f"{API}/runs/{run['id']}/resume")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"run {run['id']} is COMPLETED; only FAILED, CANCELED or STOPPED runs can be resumed; to train it longer, "
        f"continue it: tessera continue {run['id']} --max-duration N (POST /api/v1/runs/{run['id']}/continue); to "
        f"change it, fork it: tessera fork {run['id']} --set FIELD=VALUE (POST /api/v1/runs/{run['id']}/fork)")


# --- 5. a key in several projects that names none ----------------------------------------------

def _project(api) -> str:
    name = f"p-{uuid.uuid4().hex[:8]}"
    assert api.post(f"{API}/projects", json={"name": name}).status_code == 201
    return name


def _key_in(api, roles: dict[str, Role]) -> dict[str, str]:
    _, secret = api.app.state.access.create_key(name=f"key-{uuid.uuid4().hex[:6]}", roles=roles)
    return _auth(secret)


def test_a_key_in_several_projects_must_name_the_project_of_a_new_run_sweep_or_package(api, example_body,
                                                                                       sweep_body):
    a, b = sorted([_project(api), _project(api)])
    key = _key_in(api, {a: Role.MEMBER, b: Role.MEMBER})
    for path, body in [("runs", example_body), ("sweeps", sweep_body)]:
        response = api.post(f"{API}/{path}", json=body, headers=key)
        assert response.status_code == 422, (path, response.text)
        [item] = response.json()["detail"]
        assert (item["field"], item["loc"], item["input"]) == ("project", ["query", "project"], None)
        assert f"this API key has roles in several projects ({a}, {b})" in item["msg"]
        assert "pass project=P (tessera submit --project P" in item["msg"]
    upload = api.post(f"{API}/code", params={"digest": "0" * 64}, content=b"zip", headers={**key,
                                                                                         "Content-Type": "application/zip"})
    assert upload.status_code == 422 and upload.json()["detail"][0]["field"] == "project"
    assert api.head(f"{API}/code/{'0' * 64}", headers=key).status_code == 404  # a read still answers as before
    assert _runs(api) == []
    run = api.post(f"{API}/runs", json=example_body, params={"project": b}, headers=key)
    assert run.status_code == 201 and run.json()["project"] == b


def test_a_key_with_a_role_in_default_or_in_one_project_still_needs_no_project(api, example_body):
    a = _project(api)
    with_default = _key_in(api, {a: Role.MEMBER, "default": Role.MEMBER})
    assert api.post(f"{API}/runs", json=example_body, headers=with_default).json()["project"] == "default"
    only_a = _key_in(api, {a: Role.MEMBER})
    assert api.post(f"{API}/runs", json=example_body, headers=only_a).json()["project"] == a


# --- 6. a fork to another optimizer ---------------------------------------------------------------

def test_a_fork_to_another_optimizer_says_the_optimizer_was_replaced(api, fake_jobs, example_body):
    parent = _ended(api, fake_jobs, api.post(f"{API}/runs", json=example_body).json(), "COMPLETED")
    response = api.post(f"{API}/runs/{parent['id']}/fork", json={"patch": {"optimizer": {"name": "adamw"}}})
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert (item["field"], item["loc"]) == ("optimizer.lr", ["body", "patch", "optimizer", "lr"])
    assert item["msg"] == ("Field required; optimizer was replaced because its name changed (sgd to adamw): give its "
                           "other fields too, e.g. optimizer.lr")
    child = api.post(f"{API}/runs/{parent['id']}/fork", json={"patch": {"optimizer": {"name": "adamw", "lr": 1e-3}}})
    assert child.status_code == 201, child.text


def test_a_fork_may_rename_the_run_and_keep_the_rest_of_its_spec(api, fake_jobs, example_body):
    parent = _ended(api, fake_jobs, api.post(f"{API}/runs", json=example_body).json(), "COMPLETED")
    child = api.post(f"{API}/runs/{parent['id']}/fork", json={"patch": {"name": "longer-warmup"}})
    assert child.status_code == 201, child.text
    assert child.json()["spec"] == {**parent["spec"], "name": "longer-warmup"}


# --- 7. unknown names in a discriminated union, and objects by their forms -----------------------

@pytest.mark.parametrize(("change", "field", "value", "msg"), [
    (lambda b: b["algorithms"].__setitem__(0, {"name": "label_smothing"}), "algorithms[0].name", "label_smothing",
     "unknown algorithm 'label_smothing'; did you mean 'label_smoothing'? known: alibi, augmix, "),
    (lambda b: b.update(model={"name": "cifar_resnet2O"}), "model.name", "cifar_resnet2O",
     "unknown model 'cifar_resnet2O'; did you mean 'cifar_resnet20'? known: cifar_resnet20, gpt_small, resnet18, "
     "simple_cnn, torchvision (or your own code: {import: 'package.module:callable'})"),
    (lambda b: b.update(optimizer={"name": "adamW", "lr": 0.1}), "optimizer.name", "adamW",
     "unknown optimizer 'adamW'; did you mean 'adamw' or 'adam'? known: adam, adamw, sgd"),
    (lambda b: b["data"]["train"].update(name="digit"), "data.train.name", "digit",
     "unknown data set 'digit'; did you mean 'digits'? known: digits, fashion_mnist, image_folder, shakespeare, "
     "synthetic, webdataset"),
    (lambda b: b.update(loggers=[{"name": "wandb"}]), "loggers[0].name", "wandb",
     "unknown logger 'wandb'; known: mlflow, tensorboard"),
])
def test_an_unknown_name_says_which_names_are_known_and_the_closest(client, example_body, change, field, value, msg):
    change(example_body)
    response = client.post(f"{API}/runs", json=example_body)
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert (item["field"], item["input"]) == (field, value) and item["msg"].startswith(msg), item
    assert "Input tag" not in item["msg"]


def test_a_sweep_s_base_and_params_read_the_same_way(client, sweep_body):
    sweep_body["base"] = copy.deepcopy(sweep_body["base"])
    sweep_body["base"]["optimizer"]["name"] = "sgdd"
    [item] = client.post(f"{API}/sweeps", json=sweep_body).json()["detail"]
    assert (item["field"], item["msg"]) == ("base.optimizer.name",
                                            "unknown optimizer 'sgdd'; did you mean 'sgd'? known: adam, adamw, sgd")
    sweep_body["base"]["optimizer"]["name"] = "sgd"
    sweep_body["search"]["params"]["optimizer.lr"] = [0.1, 0.2]  # a list where a domain goes
    response = client.post(f"{API}/sweeps", json=sweep_body)
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert (item["field"], item["input"]) == ("search.params['optimizer.lr']", [0.1, 0.2])
    assert item["msg"].startswith("Input should be an object with exactly one of grid, choice, uniform, loguniform: "
                                  "{grid: [v1, v2, ...]}"), item
    assert "instance of" not in item["msg"] and "extract fields" not in item["msg"]


def test_a_fork_source_that_is_no_form_names_the_forms(client, fake_jobs, example_body):
    parent = _ended(client, fake_jobs, client.post(f"{API}/runs", json=example_body).json(), "COMPLETED")
    [item] = client.post(f"{API}/runs/{parent['id']}/fork", json={"from": 10}).json()["detail"]
    assert (item["field"], item["input"]) == ("from", 10)
    assert item["msg"] == ("Input should be 'latest' or 'scratch'; or Input should be an object {step: N}, N the "
                           "batch of one of the parent's committed checkpoints")
    items = client.post(f"{API}/runs/{parent['id']}/fork", json={"from": {"stp": 10}}).json()["detail"]
    assert [i["field"] for i in items] == ["from", "from.step", "from.stp"]  # not from.ForkStep.step


def test_a_sweep_whose_search_replaces_the_base_s_batch_is_not_refused_for_it(client, sweep_body):
    """Every trial takes a searched value in the base's place: the base's own too-large batch is
    refused only while nothing searched can change it."""
    sweep_body["base"]["data"]["batch_size"] = 4000
    refused = client.post("/api/v1/sweeps", json=sweep_body)
    assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "base.data.batch_size"
    sweep_body["search"]["params"]["data.batch_size"] = {"grid": [32, 64]}
    assert client.post("/api/v1/sweeps", json=sweep_body).status_code == 201
    sweep_body["search"]["params"]["data.batch_size"] = {"grid": [4000, 8000]}  # no trial could run
    still = client.post("/api/v1/sweeps", json=sweep_body)
    assert still.status_code == 422 and still.json()["detail"][0]["field"] == "base.data.batch_size"
    sweep_body["search"]["params"] = {"data.batch_size": {"grid": [32, 64]}}
    sweep_body["base"]["data"]["batch_size"], sweep_body["base"]["data"]["num_loader_workers"] = 64, 2
    ignored = client.post("/api/v1/sweeps", json=sweep_body)  # a search of the batch cannot change this field
    assert ignored.status_code == 422 and ignored.json()["detail"][0]["field"] == "base.data.num_loader_workers"
