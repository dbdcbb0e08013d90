"""Finding and cleaning up runs through the API, on SQLite and PostgreSQL: filters, order by a
metric's best value with cursor pages, tag/notes edits, archive, delete with storage, tenancy."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from api.views import ReportedMetric, RunStatus
from service.cleanup import delete_run
from service.storage_paths import project_storage_url, ray_attempt_url, run_url

API = "/api/v1"


def _run(admin, example_spec, *, name="run", tags=(), metrics=None, status=RunStatus.COMPLETED, project="default"):
    """A run made through the repository, taken to ``status`` with ``metrics`` ({key: [values]}) reported."""
    repo = admin.app.state.repo
    run = repo.create_run(example_spec.model_copy(update={"name": name, "tags": list(tags)}), project=project)
    if status is RunStatus.QUEUED:
        return run.id
    repo.begin_attempt(run.id, token="t")
    repo.transition(run.id, RunStatus.RUNNING)
    now = datetime.now(timezone.utc)
    points = [ReportedMetric(step=i, key=key, value=v, time=now)
              for key, values in (metrics or {}).items() for i, v in enumerate(values)]
    if points:
        repo.add_metrics(run.id, points)
    if status is not RunStatus.RUNNING:
        repo.transition(run.id, status)
    return run.id


def _ids(admin, **params):
    response = admin.get(f"{API}/runs", params=params)
    assert response.status_code == 200, response.text
    return [run["id"] for run in response.json()["data"]]


def _all_pages(admin, **params):
    ids, cursor = [], None
    while True:
        body = admin.get(f"{API}/runs", params={**params, **({"cursor": cursor} if cursor else {})}).json()
        ids += [run["id"] for run in body["data"]]
        cursor = body["next_cursor"]
        if cursor is None:
            return ids


def test_list_filters_by_tag_name_status_and_creation_time(admin, example_spec):
    a = _run(admin, example_spec, name="resnet-lr-0.1", tags=["baseline", "resnet"])
    b = _run(admin, example_spec, name="ResNet-lr-0.5", tags=["resnet"], status=RunStatus.FAILED)
    c = _run(admin, example_spec, name="vit-small", tags=["baselines"], status=RunStatus.QUEUED)
    assert _ids(admin, tag="baseline") == [a]  # an element, not a substring of "baselines"
    assert set(_ids(admin, tag="resnet")) == {a, b}
    assert set(_ids(admin, name="resnet")) == {a, b}  # case-insensitive substring
    assert _ids(admin, name="%") == []  # LIKE wildcards are literal
    assert _ids(admin, status="FAILED") == [b]
    assert _ids(admin, tag="resnet", status="COMPLETED") == [a]
    created = {r["id"]: r["created_at"] for r in admin.get(f"{API}/runs").json()["data"]}
    assert _ids(admin, created_after=created[b]) == [c]
    assert _ids(admin, created_before=created[b]) == [a]
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    assert _ids(admin, created_after=later) == []


def test_order_by_best_pages_through_ties_without_duplicates_or_gaps(admin, example_spec):
    accuracies = [0.5, 0.9, 0.7, 0.9, 0.9, 0.1, 0.7]
    runs = {_run(admin, example_spec, name=f"r{i}", metrics={"eval/accuracy": [0.0, acc], "train/loss": [2.0, 1 - acc]}):
            acc for i, acc in enumerate(accuracies)}
    _run(admin, example_spec, name="no-metric")  # never reported the key: not in the ordered list
    best_first = _all_pages(admin, order_by="best:eval/accuracy", limit=2)
    assert sorted(best_first) == sorted(runs)  # each once, none missing
    assert [runs[r] for r in best_first] == sorted(accuracies, reverse=True)
    tied = [r for r in best_first if runs[r] == 0.9]
    assert tied == sorted(tied, reverse=True)  # ties broken by id, stably across pages
    # a loss is better low: ascending
    lowest_loss_first = _all_pages(admin, order_by="best:train/loss", limit=3)
    assert [runs[r] for r in lowest_loss_first] == sorted(accuracies, reverse=True)
    assert len(set(lowest_loss_first)) == len(runs)


def test_best_is_the_max_or_min_over_every_reported_point(admin, example_spec):
    first = _run(admin, example_spec, metrics={"eval/accuracy": [0.2, 0.8, 0.3]}, status=RunStatus.RUNNING)
    second = _run(admin, example_spec, metrics={"eval/accuracy": [0.6]})
    assert _ids(admin, order_by="best:eval/accuracy") == [first, second]  # 0.8 earlier beats 0.6
    admin.app.state.repo.add_metrics(first, [ReportedMetric(step=9, key="eval/accuracy", value=0.95,
                                                            time=datetime.now(timezone.utc))])
    assert admin.get(f"{API}/runs/{first}").json()["best"]["eval/accuracy"] == 0.95


def test_a_cursor_of_one_order_is_refused_by_another(admin, example_spec):
    for i in range(3):
        _run(admin, example_spec, name=f"r{i}", metrics={"eval/accuracy": [i / 10]})
    cursor = admin.get(f"{API}/runs", params={"limit": 1}).json()["next_cursor"]
    refused = admin.get(f"{API}/runs", params={"limit": 1, "cursor": cursor, "order_by": "best:eval/accuracy"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "cursor"
    bad = admin.get(f"{API}/runs", params={"order_by": "eval/accuracy"})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["field"] == "order_by" and "best:<metric key>" in bad.json()["detail"][0]["msg"]


def test_patch_replaces_tags_and_notes_and_refuses_bad_ones_with_422(admin, example_spec):
    run = _run(admin, example_spec, tags=["old"])
    body = admin.patch(f"{API}/runs/{run}", json={"tags": ["a", "b:1", "a"], "notes": "lr too high"}).json()
    assert body["tags"] == ["a", "b:1"] and body["notes"] == "lr too high"
    assert admin.patch(f"{API}/runs/{run}", json={"notes": ""}).json() == {**body, "notes": None}
    for bad, field in [({"tags": ["has space"]}, "tags[0]"), ({"tags": ["x" * 65]}, "tags[0]"),
                       ({"tags": [f"t{i}" for i in range(33)]}, "tags"), ({"notes": "n" * 10_001}, "notes"),
                       ({"owner": "me"}, "owner")]:
        response = admin.patch(f"{API}/runs/{run}", json=bad)
        assert response.status_code == 422, (bad, response.text)
        detail = response.json()["detail"][0]
        assert detail["field"] == field, detail
    charset = admin.patch(f"{API}/runs/{run}", json={"tags": ["ok", "no spaces"]}).json()["detail"][0]
    assert charset["input"] == "no spaces" and "letters, digits" in charset["msg"]
    # A long bad value is echoed cut short, saying how long it was: not sent back whole.
    huge = admin.patch(f"{API}/runs/{run}", json={"notes": "n" * 900_000})
    assert huge.status_code == 422 and len(huge.content) < 1000, len(huge.content)
    assert huge.json()["detail"][0]["input"] == "n" * 200 + "… (900000 characters in all)"
    listed = admin.patch(f"{API}/runs/{run}", json={"tags": [f"t{i}" for i in range(1000)]}).json()["detail"][0]
    assert listed["field"] == "tags" and listed["input"].endswith("characters in all)") and len(listed["input"]) < 300
    assert admin.get(f"{API}/runs/{run}").json()["tags"] == ["a", "b:1"]  # nothing half-written


def test_archived_runs_are_hidden_from_default_lists(admin, example_spec):
    kept, archived = _run(admin, example_spec), _run(admin, example_spec)
    assert admin.post(f"{API}/runs/{archived}/archive").json()["archived_at"] is not None
    assert _ids(admin) == [kept]
    assert _ids(admin, archived="true") == [archived]
    assert set(_ids(admin, archived="all")) == {kept, archived}
    assert admin.post(f"{API}/runs/{archived}/unarchive").json()["archived_at"] is None
    assert set(_ids(admin)) == {kept, archived}


def test_delete_refuses_a_live_run_and_removes_an_ended_runs_rows_and_storage(admin, example_spec):
    live = _run(admin, example_spec, status=RunStatus.RUNNING)
    refused = admin.delete(f"{API}/runs/{live}")
    assert refused.status_code == 409 and "RUNNING" in refused.json()["detail"]
    ended = _run(admin, example_spec, metrics={"eval/accuracy": [0.5]})
    storage = project_storage_url(admin.app.state.settings.storage_url, "default")
    folder = Path(run_url(storage, ended).removeprefix("file://"))
    ray_folder = Path(ray_attempt_url(storage, ended, 1).removeprefix("file://"))
    for name in ("checkpoints/step-1/.metadata", "logs/attempt-1.log", "exports/step-1.safetensors"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("x")
    ray_folder.mkdir(parents=True)
    (ray_folder / "result.json").write_text("{}")
    body = admin.delete(f"{API}/runs/{ended}").json()
    assert body["run_ids"] == [ended] and body["storage_urls"][0].endswith(f"/runs/{ended}")
    assert not folder.exists() and not ray_folder.exists() and ray_folder.parent.exists()
    assert admin.get(f"{API}/runs/{ended}").status_code == 404
    assert _ids(admin, archived="all", order_by="best:eval/accuracy") == []  # its bests went with it
    assert admin.delete(f"{API}/runs/{ended}").status_code == 404


def test_a_sweep_is_archived_and_deleted_with_its_trials(admin, example_body):
    sweep = admin.post(f"{API}/sweeps", json={"name": "s", "base": example_body,
                                              "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}}).json()
    assert admin.post(f"{API}/sweeps/{sweep['id']}/archive").json()["archived_at"] is not None
    assert admin.get(f"{API}/sweeps").json()["data"] == []
    assert [s["id"] for s in admin.get(f"{API}/sweeps", params={"archived": "true"}).json()["data"]] == [sweep["id"]]
    assert admin.delete(f"{API}/sweeps/{sweep['id']}").status_code == 409  # still QUEUED
    admin.post(f"{API}/sweeps/{sweep['id']}/cancel")
    admin.app.state.sweeps.transition(sweep["id"], type(admin.app.state.sweeps.get_sweep(sweep["id"]).status).CANCELED)
    body = admin.delete(f"{API}/sweeps/{sweep['id']}").json()
    assert body["kind"] == "sweep" and body["storage_urls"][-1].endswith(f"/sweeps/{sweep['id']}")
    assert admin.get(f"{API}/sweeps/{sweep['id']}").status_code == 404


def test_new_routes_are_404_for_another_project_and_403_for_a_viewer(admin, example_spec, example_body):
    project = f"p-{uuid.uuid4().hex[:8]}"
    assert admin.post(f"{API}/projects", json={"name": project}).status_code == 201
    other = f"p-{uuid.uuid4().hex[:8]}"
    assert admin.post(f"{API}/projects", json={"name": other}).status_code == 201

    def key(p, role):
        made = admin.post(f"{API}/keys", json={"project": p, "role": role, "name": role}).json()
        return {"Authorization": f"Bearer {made['key']}"}

    run = _run(admin, example_spec, project=project, tags=["mine"])
    sweep = admin.post(f"{API}/sweeps", params={"project": project}, json={
        "name": "s", "base": example_body, "search": {"params": {"optimizer.lr": {"grid": [0.1]}}}}).json()["id"]
    routes = [("PATCH", f"runs/{run}", {"tags": ["x"]}), ("POST", f"runs/{run}/archive", None),
              ("POST", f"runs/{run}/unarchive", None), ("DELETE", f"runs/{run}", None),
              ("POST", f"sweeps/{sweep}/archive", None), ("POST", f"sweeps/{sweep}/unarchive", None),
              ("DELETE", f"sweeps/{sweep}", None)]
    for who, expected in ((key(other, "member"), 404), (key(project, "viewer"), 403)):
        for method, path, body in routes:
            response = admin.request(method, f"{API}/{path}", json=body, headers=who)
            assert response.status_code == expected, (method, path, expected, response.text)
    outsider = key(other, "member")
    assert admin.get(f"{API}/runs", params={"tag": "mine"}, headers=outsider).json()["data"] == []
    assert admin.get(f"{API}/runs/{run}").json()["tags"] == ["mine"]  # nothing changed


def test_delete_removes_the_runs_folder_on_s3(sqlite_repo, example_spec, s3_server):
    import fsspec

    root = s3_server.url(f"cleanup-{uuid.uuid4().hex[:8]}")
    run = sqlite_repo.create_run(example_spec)
    sqlite_repo.begin_attempt(run.id, token="t")
    sqlite_repo.transition(run.id, RunStatus.FAILED)
    kept = f"{root}/runs/{run.id}-other/logs/attempt-1.log"  # a neighbour whose id starts the same
    for url in (f"{run_url(root, run.id)}/checkpoints/ep1-ba10/COMMITTED", f"{run_url(root, run.id)}/logs/attempt-1.log",
                kept):
        with fsspec.open(url, "wb") as file:
            file.write(b"x")
    done = delete_run(sqlite_repo, root, run.id, by="test")
    fs, path = fsspec.core.url_to_fs(run_url(root, run.id))
    fs.invalidate_cache()
    assert done.run_ids == [run.id] and not fs.exists(path) and fs.exists(kept.removeprefix("s3://"))


@pytest.mark.parametrize("position", [10**400, "NaN", True, "0.5", None])
def test_a_forged_best_cursor_is_a_422_not_a_database_error(admin, example_spec, position):
    import base64
    import json

    _run(admin, example_spec, metrics={"eval/accuracy": [0.5]})
    raw = json.dumps(["best:eval/accuracy", position, "0123456789ab"]).encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    response = admin.get(f"{API}/runs", params={"order_by": "best:eval/accuracy", "cursor": cursor})
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "cursor"
