"""API keys and projects: every user route is scoped to the key's projects, on SQLite and PostgreSQL."""

from __future__ import annotations

import stat
import uuid

import pytest
from fastapi.testclient import TestClient

from api.credentials import read_credentials
from api.views import RunStatus
from service.app import create_app
from service.settings import Settings

API = "/api/v1"


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _project(admin) -> str:
    name = f"p-{uuid.uuid4().hex[:8]}"
    assert admin.post(f"{API}/projects", json={"name": name}).status_code == 201
    return name


def _key(admin, project: str, role: str) -> dict[str, str]:
    response = admin.post(f"{API}/keys", json={"project": project, "role": role, "name": f"{role} of {project}"})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["key"].startswith("tsk_") and body["roles"] == {project: role}
    return _bearer(body["key"])


@pytest.fixture
def two_projects(admin, example_body, sweep_body_for):
    """Projects A and B with a member key each; a run and a sweep in A."""
    a, b = _project(admin), _project(admin)
    key_a, key_b = _key(admin, a, "member"), _key(admin, b, "member")
    run = admin.post(f"{API}/runs", json=example_body, params={"project": a}, headers=key_a).json()
    sweep = admin.post(f"{API}/sweeps", json=sweep_body_for(example_body), params={"project": a},
                       headers=key_a).json()
    return {"a": a, "b": b, "key_a": key_a, "key_b": key_b, "run": run["id"], "sweep": sweep["id"]}


@pytest.fixture
def sweep_body_for():
    def make(base):
        return {"name": "tenancy-sweep", "base": base, "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}}
    return make


def test_a_run_and_sweep_belong_to_the_project_they_were_created_in(admin, two_projects):
    t = two_projects
    assert admin.get(f"{API}/runs/{t['run']}", headers=t["key_a"]).json()["project"] == t["a"]
    assert admin.get(f"{API}/sweeps/{t['sweep']}", headers=t["key_a"]).json()["project"] == t["a"]


def test_a_key_of_project_b_gets_404_on_every_route_of_project_a(admin, two_projects):
    t, other = two_projects, two_projects["key_b"]
    run, sweep = t["run"], t["sweep"]
    for method, path in [("GET", f"runs/{run}"), ("POST", f"runs/{run}/cancel"), ("GET", f"runs/{run}/events"),
                         ("GET", f"runs/{run}/metrics"), ("GET", f"runs/{run}/metrics?all_attempts=true"),
                         ("POST", f"runs/{run}/resume"),
                         ("GET", f"runs/{run}/checkpoints"), ("POST", f"runs/{run}/fork"),
                         ("GET", f"runs/{run}/children"), ("GET", f"runs/{run}/logs"), ("GET", f"sweeps/{sweep}"),
                         ("GET", f"sweeps/{sweep}/logs"), ("POST", f"sweeps/{sweep}/cancel")]:
        response = admin.request(method, f"{API}/{path}", headers=other)
        assert response.status_code == 404, (method, path, response.text)
        assert t["a"] not in response.text  # nothing about the other project leaks
    continued = admin.post(f"{API}/runs/{run}/continue", json={"max_duration": "9ep"}, headers=other)
    assert continued.status_code == 404 and t["a"] not in continued.text
    assert admin.get(f"{API}/runs", headers=other).json()["data"] == []
    assert admin.get(f"{API}/runs", params={"project": t["a"]}, headers=other).json()["data"] == []
    assert admin.get(f"{API}/sweeps", headers=other).json()["data"] == []
    # ...and cannot create into A, make A's keys or set A's quota: A does not exist for it.
    example = admin.get(f"{API}/runs/{run}", headers=t["key_a"]).json()["spec"]
    assert admin.post(f"{API}/runs", json=example, params={"project": t["a"]}, headers=other).status_code == 404
    assert admin.post(f"{API}/keys", json={"project": t["a"], "role": "admin"}, headers=other).status_code == 404
    assert admin.put(f"{API}/projects/{t['a']}/quota", json={"max_running_runs": 9},
                     headers=other).status_code == 404
    # The owner still sees its run, cancels it, and its project's list has it.
    assert [r["id"] for r in admin.get(f"{API}/runs", headers=t["key_a"]).json()["data"]] == [run]
    assert admin.post(f"{API}/runs/{run}/cancel", headers=t["key_a"]).json()["status"] == "CANCELING"


def test_project_level_admin_actions_are_403_for_members_and_project_admins(admin, two_projects):
    t = two_projects
    assert admin.post(f"{API}/keys", json={"project": t["a"], "role": "viewer"}, headers=t["key_a"]).status_code == 403
    assert admin.put(f"{API}/projects/{t['a']}/quota", json={"max_running_runs": 1},
                     headers=t["key_a"]).status_code == 403
    project_admin = _key(admin, t["a"], "admin")
    assert admin.post(f"{API}/projects", json={"name": f"x-{uuid.uuid4().hex[:6]}"},
                      headers=project_admin).status_code == 403
    assert admin.put(f"{API}/projects/{t['a']}/quota", json={"max_running_runs": 1},
                     headers=project_admin).json()["quota"]["max_running_runs"] == 1
    # PATCH changes only what it is sent: the cap an every-project admin raised survives a project
    # admin's change of another quota, which a PUT of that one quota would have reset.
    assert admin.patch(f"{API}/projects/{t['a']}/quota", json={"max_duration_caps": {"ep": 50000}}).status_code == 200
    patched = admin.patch(f"{API}/projects/{t['a']}/quota", json={"max_workers": 3}, headers=project_admin).json()
    assert {k: v for k, v in patched["quota"].items() if v is not None} == {
        "max_running_runs": 1, "max_workers": 3, "max_duration_caps": {"ep": 50000}}
    assert admin.patch(f"{API}/projects/{t['a']}/quota", json={"max_wall_time_cap_s": 10 ** 6},
                       headers=project_admin).status_code == 403
    # A cap may lie below the service's: removing it (null) is a change only '*' may make...
    assert admin.patch(f"{API}/projects/{t['a']}/quota", json={"max_duration_caps": None},
                       headers=project_admin).status_code == 403
    # ...while a unit's cap merges with the others, and re-sending one unchanged is no change.
    assert admin.patch(f"{API}/projects/{t['a']}/quota", json={"max_duration_caps": {"ba": 10 ** 6}}).json()[
        "quota"]["max_duration_caps"] == {"ep": 50000, "ba": 10 ** 6}
    assert admin.patch(f"{API}/projects/{t['a']}/quota", json={"max_duration_caps": {"ep": 50000}},
                       headers=project_admin).status_code == 200
    assert admin.patch(f"{API}/projects/{t['a']}/quota", json={"max_workers": None},
                       headers=project_admin).json()["quota"]["max_workers"] is None
    made = admin.post(f"{API}/keys", json={"project": t["a"], "role": "viewer"}, headers=project_admin)
    assert made.status_code == 201
    listed = {k["id"] for k in admin.get(f"{API}/keys", headers=project_admin).json()["data"]}
    assert made.json()["id"] in listed
    assert all("key" not in k and "key_hash" not in k for k in admin.get(f"{API}/keys").json()["data"])


def test_a_viewer_reads_but_cannot_submit_cancel_or_resume(admin, two_projects, example_body):
    t = two_projects
    viewer = _key(admin, t["a"], "viewer")
    assert admin.get(f"{API}/runs/{t['run']}", headers=viewer).status_code == 200
    refused = admin.post(f"{API}/runs", json=example_body, params={"project": t["a"]}, headers=viewer)
    assert refused.status_code == 403 and "viewer" in refused.json()["detail"]
    assert admin.post(f"{API}/runs/{t['run']}/cancel", headers=viewer).status_code == 403
    assert admin.post(f"{API}/runs/{t['run']}/resume", headers=viewer).status_code == 403
    assert admin.post(f"{API}/sweeps/{t['sweep']}/cancel", headers=viewer).status_code == 403
    external = admin.post(f"{API}/sweeps", params={"driver": "external", "project": t["a"]}, headers=viewer,
                          json={"name": "x", "base": example_body,
                                "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}})
    assert external.status_code == 403 and "driver_token" not in external.text  # no driver token for a viewer
    me = admin.get(f"{API}/me", headers=viewer).json()
    assert me["roles"] == {t["a"]: "viewer"} and [p["name"] for p in me["projects"]] == [t["a"]]


def test_a_runs_events_name_the_key_that_created_canceled_and_resumed_it(admin, two_projects):
    """Members of a project may cancel each other's runs: the events say who did what."""
    t = two_projects
    colleague = admin.post(f"{API}/keys", json={"project": t["a"], "role": "member", "name": "bob"}).json()
    assert admin.post(f"{API}/runs/{t['run']}/cancel", headers=_bearer(colleague["key"])).status_code == 200
    admin.app.state.repo.transition(t["run"], RunStatus.CANCELED)
    assert admin.post(f"{API}/runs/{t['run']}/resume", headers=t["key_a"]).status_code == 200
    assert admin.post(f"{API}/sweeps/{t['sweep']}/cancel", headers=_bearer(colleague["key"])).status_code == 200
    messages = [e["message"] for e in admin.get(f"{API}/runs/{t['run']}/events").json()["data"]]
    alice = f"key 'member of {t['a']}' ({admin.get(f'{API}/me', headers=t['key_a']).json()['key_id']})"
    assert messages[0] == f"created by {alice}"
    assert f"canceled by key 'bob' ({colleague['id']})" in messages
    assert any((m or "").startswith(f"resumed by {alice}") for m in messages), messages
    sweep_events = admin.get(f"{API}/sweeps/{t['sweep']}").json()
    assert f"canceled by key 'bob' ({colleague['id']})" in str(sweep_events), sweep_events


def test_no_key_a_wrong_key_and_a_revoked_key_get_401(admin, two_projects):
    t = two_projects
    assert admin.get(f"{API}/runs", headers={"Authorization": ""}).status_code == 401
    assert admin.get(f"{API}/runs", headers=_bearer("tsk_not-a-key")).status_code == 401
    key_id = admin.get(f"{API}/me", headers=t["key_b"]).json()["key_id"]
    assert admin.delete(f"{API}/keys/{key_id}").status_code == 200
    response = admin.get(f"{API}/runs", headers=t["key_b"])
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"


def test_the_401_says_whether_no_key_was_sent_or_the_key_sent_is_not_valid_alike_for_unknown_and_revoked(admin):
    from service.deps import KEY_INVALID, KEY_UNAUTHORIZED

    revoked = _key(admin, _project(admin), "member")
    assert admin.get(f"{API}/runs", headers=revoked).status_code == 200  # valid (and remembered) until revoked
    key_id = admin.get(f"{API}/me", headers=revoked).json()["key_id"]
    assert admin.delete(f"{API}/keys/{key_id}").status_code == 200
    made_up = _bearer(f"tsk_{uuid.uuid4().hex}")
    answers = {}
    for name, headers in [("revoked", revoked), ("made-up", made_up), ("not a tsk_ key", _bearer("hunter2"))]:
        for method, path in [("GET", "runs"), ("GET", "me"), ("POST", "projects")]:
            response = admin.request(method, f"{API}/{path}", headers=headers, json={"name": "x"})
            assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer", response.text
            assert response.json() == {"detail": KEY_INVALID}, (name, path)
            assert headers["Authorization"].removeprefix("Bearer ") not in response.text  # the key is not echoed
            answers.setdefault(path, set()).add(response.text)
    assert all(len(texts) == 1 for texts in answers.values())  # unknown and revoked read the same
    assert "not valid (unknown or revoked)" in KEY_INVALID
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer "}, {"Authorization": "Basic dXNlcg=="}):
        response = admin.get(f"{API}/runs", headers=headers)
        assert response.status_code == 401 and response.json() == {"detail": KEY_UNAUTHORIZED}, headers
    assert KEY_UNAUTHORIZED.startswith("a valid API key is required: send Authorization: Bearer tsk_...")


def test_the_first_admin_key_is_rotated_through_a_new_every_project_key_never_revoked_last(client):
    """On SQLite only: it revokes the admin key that PostgreSQL's tests share across the session."""
    admin = client
    first = admin.get(f"{API}/me").json()["key_id"]
    refused = admin.delete(f"{API}/keys/{first}")
    assert refused.status_code == 409 and "last active admin key of every project" in refused.json()["detail"]
    project_admin = _key(admin, _project(admin), "admin")
    assert admin.post(f"{API}/keys", json={"project": "*"}, headers=project_admin).status_code == 403
    viewer = _key(admin, "*", "viewer")  # reads every project, administers no key
    assert [k["id"] for k in admin.get(f"{API}/keys", headers=viewer).json()["data"]] == [
        admin.get(f"{API}/me", headers=viewer).json()["key_id"]]
    assert admin.delete(f"{API}/keys/{first}", headers=viewer).status_code == 404
    assert admin.post(f"{API}/keys", json={"project": "*", "role": "admin"}, headers=viewer).status_code == 403
    second = _key(admin, "*", "admin")
    assert admin.delete(f"{API}/keys/{first}", headers=second).status_code == 200
    assert admin.get(f"{API}/runs").status_code == 401  # the first key
    assert admin.post(f"{API}/projects", json={"name": f"p-{uuid.uuid4().hex[:8]}"}, headers=second).status_code == 201
    second_id = admin.get(f"{API}/me", headers=second).json()["key_id"]
    assert admin.delete(f"{API}/keys/{second_id}", headers=second).status_code == 409


def test_a_key_with_one_project_creates_there_by_default(admin, two_projects, example_body):
    t = two_projects
    run = admin.post(f"{API}/runs", json=example_body, headers=t["key_b"]).json()
    assert run["project"] == t["b"]
    assert admin.post(f"{API}/runs", json=example_body).json()["project"] == "default"


def test_the_first_start_writes_an_admin_key_0600_and_later_starts_reuse_it(tmp_path, fake_jobs):
    settings = Settings(home=tmp_path / "home", bootstrap_api_key=None, public_url="http://tessera.test:8000")
    path = tmp_path / "home" / "credentials"
    with TestClient(create_app(settings, jobs=fake_jobs, run_dispatcher=False)) as first:
        key = read_credentials(path)
        assert key is not None and key.startswith("tsk_") and len(key) > 40
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert first.get(f"{API}/runs", headers=_bearer(key)).status_code == 200
        assert first.get(f"{API}/runs", headers={"Authorization": ""}).status_code == 401
        # Where a client on this machine reaches it (not the workers' public URL, which may not resolve here).
        assert read_credentials(path, "TESSERA_URL") == "http://127.0.0.1:8000"
    moved = settings.model_copy(update={"host": "0.0.0.0", "port": 8123})
    with TestClient(create_app(moved, jobs=fake_jobs, run_dispatcher=False)) as second:
        assert read_credentials(path) == key  # not replaced: the database already has keys
        assert read_credentials(path, "TESSERA_URL") == "http://127.0.0.1:8123"  # where clients find it now
        assert second.get(f"{API}/me", headers=_bearer(key)).json()["roles"] == {"*": "admin"}


def test_a_key_is_read_once_per_cache_s_and_a_revoke_here_forgets_it_at_once(sqlite_repo, monkeypatch):
    from service.access import AccessStore, Caller, Role

    access = AccessStore(sqlite_repo.db)
    admin = Caller(key_id="admin", roles={"*": Role.ADMIN})
    first, first_secret = access.create_key(name="one", roles={"*": Role.MEMBER})
    second, second_secret = access.create_key(name="two", roles={"*": Role.MEMBER})
    reads = []
    real_read = access.db.read
    monkeypatch.setattr(access.db, "read", lambda: reads.append(1) or real_read())
    caller = access.authenticate(first_secret)
    assert caller is not None and access.authenticate(first_secret) == caller
    assert len(reads) == 1
    assert access.authenticate("tsk_unknown") is None and access.authenticate("tsk_unknown") is None
    assert len(reads) == 3  # unknown keys are never remembered

    other_process = AccessStore(sqlite_repo.db)  # another service on the same database
    other_process.revoke_key(admin, first.id)
    assert access.authenticate(first_secret) is not None  # remembered here for cache_s
    access.cache_s = 0.0
    assert access.authenticate(first_secret) is None

    access.cache_s = 3600.0
    assert access.authenticate(second_secret) is not None
    access.revoke_key(admin, second.id)
    assert access.authenticate(second_secret) is None  # a revoke through this store: at once


def test_a_project_is_read_once_per_cache_s_and_a_quota_change_here_is_seen_at_once(sqlite_repo, monkeypatch):
    from service.access import AccessStore, ProjectNotFound

    access, other_process = AccessStore(sqlite_repo.db), AccessStore(sqlite_repo.db)
    access.create_project("cached")
    reads = []
    real_read = access.db.read
    monkeypatch.setattr(access.db, "read", lambda: reads.append(1) or real_read())
    assert access.get_project("cached") == access.get_project("cached") and len(reads) == 1
    with pytest.raises(ProjectNotFound):
        access.get_project("nowhere")
    with pytest.raises(ProjectNotFound):  # a missing project is never remembered
        access.get_project("nowhere")
    assert len(reads) == 3

    other_process.set_quota("cached", {"max_running_runs": 3})
    assert access.get_project("cached").max_running_runs is None  # remembered here for cache_s
    access.cache_s = 0.0
    assert access.get_project("cached").max_running_runs == 3
    access.cache_s = 3600.0
    access.set_quota("cached", {"max_running_runs": 1})
    assert access.get_project("cached").max_running_runs == 1  # a change through this store: at once


def test_a_key_read_just_before_its_revoke_is_not_remembered_after_it(sqlite_repo, monkeypatch):
    from contextlib import contextmanager

    from service.access import AccessStore, Caller, Role

    access = AccessStore(sqlite_repo.db, cache_s=3600.0)
    key, secret = access.create_key(name="racing", roles={"*": Role.MEMBER})
    real_read = access.db.read

    @contextmanager
    def read_then_revoked_elsewhere():  # another request's revoke commits between the read and remembering it
        with real_read() as session:
            yield session
        access.revoke_key(Caller(key_id="admin", roles={"*": Role.ADMIN}), key.id)

    monkeypatch.setattr(access.db, "read", read_then_revoked_elsewhere)
    assert access.authenticate(secret) is not None  # valid when it was read
    monkeypatch.setattr(access.db, "read", real_read)
    assert access.authenticate(secret) is None


def test_two_revokes_at_once_never_leave_postgresql_without_an_every_project_admin():
    """Each round, two revokes race for the last two admin keys of every project: one wins, the
    other gets LastAdminKey (the rows are locked; unlocked, both won in 20 of 30 rounds)."""
    import threading

    from service.access import AccessStore, Caller, LastAdminKey, Role
    from service.db.engine import make_engine, migrate
    from service.db.session import Database
    from tests.conftest import fresh_postgres_database

    admin = Caller(key_id="outside", roles={"*": Role.ADMIN})
    with fresh_postgres_database("tessera_keys") as url:
        engine = make_engine(url)
        try:
            migrate(engine)
            access = AccessStore(Database(engine))
            survivor, _ = access.create_key(name="first", roles={"*": Role.ADMIN})
            for round_ in range(8):
                newer, _ = access.create_key(name=f"admin {round_}", roles={"*": Role.ADMIN})
                start, outcomes = threading.Barrier(2), {}

                def revoke(key_id: str) -> None:
                    start.wait()
                    try:
                        access.revoke_key(admin, key_id)
                        outcomes[key_id] = "revoked"
                    except LastAdminKey:
                        outcomes[key_id] = "refused"

                threads = [threading.Thread(target=revoke, args=(k.id,)) for k in (survivor, newer)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                assert sorted(outcomes.values()) == ["refused", "revoked"], outcomes
                survivor = survivor if outcomes[survivor.id] == "refused" else newer
            active = [k for k in access.list_keys(admin) if k.as_dict()["revoked_at"] is None]
            assert [k.id for k in active] == [survivor.id]
        finally:
            engine.dispose()
