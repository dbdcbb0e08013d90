"""``GET /runs?project=`` and ``GET /sweeps?project=``, and the SDK's ``list_runs(project=)`` and
``list_sweeps(project=)``, on SQLite and PostgreSQL: one project's runs and sweeps only, and a
project the key has no role in lists nothing (it does not exist for that key)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from api.client import Client

API = "/api/v1"


def _project(admin) -> str:
    name = f"p-{uuid.uuid4().hex[:8]}"
    assert admin.post(f"{API}/projects", json={"name": name}).status_code == 201
    return name


def _member_key(admin, project: str) -> str:
    response = admin.post(f"{API}/keys", json={"project": project, "role": "member", "name": "member"})
    assert response.status_code == 201, response.text
    return response.json()["key"]


def _sdk(admin, api_key: str | None = None) -> Client:
    """The SDK over ``admin``'s app (its own Authorization header: ``api_key``, else the admin's)."""

    class ThroughTestClient(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            answer = admin.request(request.method, str(request.url), headers=dict(request.headers),
                                   content=request.read())
            return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    return Client("http://testserver", transport=ThroughTestClient(), api_key=api_key)


@pytest.fixture
def two_projects(admin, example_body):
    """Projects A and B, each with a run and a sweep; a member key of B."""
    made = {}
    for label in ("a", "b"):
        project = _project(admin)
        run = admin.post(f"{API}/runs", json={**example_body, "name": f"run-{label}"}, params={"project": project})
        sweep = admin.post(f"{API}/sweeps", params={"project": project}, json={
            "name": f"sweep-{label}", "base": example_body,
            "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}})
        assert run.status_code == 201 and sweep.status_code == 201, (run.text, sweep.text)
        made[label] = {"project": project, "run": run.json()["id"], "sweep": sweep.json()["id"]}
    made["key_b"] = _member_key(admin, made["b"]["project"])
    return made


def _ids(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [item["id"] for item in answer.json()["data"]]


def test_runs_and_sweeps_are_listed_by_project(admin, two_projects):
    a, b = two_projects["a"], two_projects["b"]
    for project in (a, b):
        assert _ids(admin.get(f"{API}/runs", params={"project": project["project"]})) == [project["run"]]
        assert _ids(admin.get(f"{API}/sweeps", params={"project": project["project"]})) == [project["sweep"]]
    assert set(_ids(admin.get(f"{API}/sweeps"))) >= {a["sweep"], b["sweep"]}  # no project: every one the key sees
    for path in ("runs", "sweeps"):  # a project no one has is empty, not an error, for runs and sweeps alike
        assert _ids(admin.get(f"{API}/{path}", params={"project": "no-such-project"})) == []


def test_a_project_the_key_has_no_role_in_lists_nothing_as_get_runs_does(admin, two_projects):
    a, b = two_projects["a"], two_projects["b"]
    key_b = {"Authorization": f"Bearer {two_projects['key_b']}"}
    for path in ("runs", "sweeps"):
        assert _ids(admin.get(f"{API}/{path}", params={"project": a["project"]}, headers=key_b)) == []
    assert _ids(admin.get(f"{API}/sweeps", params={"project": b["project"]}, headers=key_b)) == [b["sweep"]]
    assert _ids(admin.get(f"{API}/sweeps", headers=key_b)) == [b["sweep"]]


def test_a_too_long_project_is_refused_naming_the_parameter(admin):
    answer = admin.get(f"{API}/sweeps", params={"project": "p" * 65})
    assert answer.status_code == 422, answer.text
    assert "project" in answer.text and "64" in answer.text


def test_the_sdk_lists_runs_and_sweeps_by_project(admin, two_projects):
    a, b = two_projects["a"], two_projects["b"]
    with _sdk(admin) as sdk:
        assert [r.id for r in sdk.list_runs(project=a["project"]).data] == [a["run"]]
        assert [r.id for r in sdk.iter_runs(project=b["project"])] == [b["run"]]
        assert [s.id for s in sdk.list_sweeps(project=a["project"]).data] == [a["sweep"]]
        assert [s.project for s in sdk.list_sweeps(project=b["project"], archived="all").data] == [b["project"]]
    with _sdk(admin, two_projects["key_b"]) as sdk:
        assert sdk.list_runs(project=a["project"]).data == [] and sdk.list_sweeps(project=a["project"]).data == []
        assert [s.id for s in sdk.list_sweeps().data] == [b["sweep"]]
