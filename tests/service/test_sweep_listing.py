"""``GET /sweeps`` at a lab's scale, on SQLite and PostgreSQL: keyset pages (``cursor`` in,
``next_cursor`` out) that never skip or repeat a sweep, even among sweeps created at the same
instant; ``name`` and ``status`` filters combined with ``project``, ``archived`` and the cursor;
``%`` and ``_`` in the ``name`` text matched literally; and a 422 naming the parameter, the value and what is
allowed for a bad cursor or status. The SDK's ``list_sweeps``/``iter_sweeps`` over the same app."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, update

from api.sweeps import SweepSpec
from api.views import SweepStatus
from service.db.models import Sweep
from tests.service.test_project_filters import _project, _sdk

API = "/api/v1"


@pytest.fixture
def make_sweep(admin, example_body):
    """``make_sweep(name, project=..., status=...)``: a stored sweep's id (through the repository:
    no dispatcher runs here); ``status`` CANCELING cancels it, RUNNING makes it an external one."""
    sweeps = admin.app.state.sweeps

    def make(name: str, *, project: str = "default", status: SweepStatus = SweepStatus.QUEUED) -> str:
        spec = SweepSpec.model_validate({"name": name, "base": example_body,
                                         "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}})
        external = status is SweepStatus.RUNNING
        sweep = sweeps.create_sweep(spec, project=project, driver="external" if external else "service",
                                    token="driver-token" if external else None)
        if status is SweepStatus.CANCELING:
            sweeps.cancel(sweep.id)
        assert sweeps.get_sweep(sweep.id).status is status
        return sweep.id

    return make


def _page(admin, **params) -> dict:
    response = admin.get(f"{API}/sweeps", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _all_pages(admin, **params) -> tuple[list[str], int]:
    """Every sweep id ``GET /sweeps`` pages through with ``params``, and how many pages it took."""
    ids, cursor, pages = [], None, 0
    while True:
        body = _page(admin, **params, **({"cursor": cursor} if cursor else {}))
        ids += [sweep["id"] for sweep in body["data"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return ids, pages


def _set_created(admin, sweep_ids: list[str], when: datetime) -> None:
    with admin.app.state.repo.engine.begin() as conn:
        conn.execute(update(Sweep).where(Sweep.id.in_(sweep_ids)).values(created_at=when))


def _newest_first(admin) -> list[str]:
    """Every sweep's id in the order the list promises: created_at, then id, both descending."""
    with admin.app.state.repo.engine.connect() as conn:
        rows = conn.execute(select(Sweep.created_at, Sweep.id)).all()
    return [sweep_id for _, sweep_id in sorted(rows, reverse=True)]


def test_pages_cover_every_sweep_once_newest_first_even_with_equal_creation_times(admin, make_sweep):
    ids = [make_sweep(f"sweep-{i}") for i in range(7)]
    start = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    _set_created(admin, ids[:3], start)  # three sweeps created at the same instant...
    _set_created(admin, ids[3:6], start + timedelta(seconds=1))  # ...and three more at the next
    _set_created(admin, ids[6:], start - timedelta(seconds=1))
    expected = _newest_first(admin)
    assert sorted(expected) == sorted(ids)
    for limit in (1, 2, 3, 7):
        listed, pages = _all_pages(admin, limit=limit)
        assert listed == expected and len(set(listed)) == 7, limit  # no repeat, no gap, in order
        assert pages == -(-7 // limit)  # the last page is never an empty one
    first = _page(admin, limit=7)
    assert [s["id"] for s in first["data"]] == expected and first["next_cursor"] is None


def test_name_status_project_and_archived_combine_with_the_cursor(admin, make_sweep):
    project = _project(admin)
    wanted = [make_sweep(f"ResNet-lr-{i}", project=project, status=SweepStatus.CANCELING) for i in range(5)]
    queued = make_sweep("resnet-queued", project=project)  # another status
    make_sweep("vit-lr", project=project, status=SweepStatus.CANCELING)  # another name
    make_sweep("resnet-lr-elsewhere", status=SweepStatus.CANCELING)  # another project
    hidden = make_sweep("resnet-lr-archived", project=project, status=SweepStatus.CANCELING)
    admin.app.state.sweeps.set_archived(hidden, True)

    wanted = [sweep_id for sweep_id in _newest_first(admin) if sweep_id in wanted]

    query = {"name": "RESNET-LR", "status": "CANCELING", "project": project}
    listed, pages = _all_pages(admin, limit=2, **query)
    assert listed == wanted and pages == 3
    every, _ = _all_pages(admin, limit=2, **query, archived="all")
    assert every == [hidden, *wanted]
    assert _all_pages(admin, limit=2, **query, archived="true")[0] == [hidden]
    assert _all_pages(admin, limit=1, name="resnet", status="QUEUED", project=project)[0] == [queued]
    # The cursor of one query, passed with other filters, resumes after the same sweep: it holds
    # a position, not the filters.
    cursor = _page(admin, limit=2, **query)["next_cursor"]
    assert [s["id"] for s in _page(admin, limit=2, cursor=cursor, **query)["data"]] == wanted[2:4]
    after = [s for s in _newest_first(admin) if s in wanted or s == hidden]
    assert [s["id"] for s in _page(admin, limit=2, cursor=cursor, **query, archived="all")["data"]] == \
        after[after.index(wanted[1]) + 1:][:2]


def test_percent_and_underscore_in_a_name_match_only_themselves(admin, make_sweep):
    literal = make_sweep("lr_0.1-warmup")
    make_sweep("lrX0.1-warmup")  # what _ would match as a LIKE wildcard
    make_sweep("lr-0.1-warmup")
    for text in ("lr_0", "_0.1", "LR_0.1-WARM"):
        assert [s["id"] for s in _page(admin, name=text)["data"]] == [literal], text
    assert len(_page(admin, name="warmup")["data"]) == 3
    for text in ("%", "lr%warmup", "lr__0"):  # no name holds a % (names may not), nor two _ in a row
        assert _page(admin, name=text)["data"] == [], text


def _encoded(fields) -> str:
    return base64.urlsafe_b64encode(json.dumps(fields).encode()).decode().rstrip("=")


@pytest.mark.parametrize("cursor", [
    "garbage",
    "!!!not base64!!!",
    _encoded(["sweeps:created", "not a time", "abcdef012345"]),
    _encoded(["sweeps:created", "2026-01-01T00:00:00+00:00", "a\x00b"]),  # a NUL: PostgreSQL would refuse it
    _encoded(["sweeps:created", "2026-01-01T00:00:00+00:00", "\ud800"]),  # a lone surrogate: no driver sends it
    _encoded(["sweeps:created", "9999-12-31T23:59:59-14:00", "abcdef012345"]),  # past year 9999 in UTC
    _encoded(["sweeps:created", "2026-01-01T00:00:00+00:00", 7]),
    _encoded(["created", "2026-01-01T00:00:00+00:00", "abcdef012345"]),  # GET /runs' order
    _encoded(["2026-01-01T00:00:00+00:00", "abcdef012345"]),  # a GET /runs cursor from before orders
    _encoded({"order": "sweeps:created"}),
])
def test_a_malformed_or_tampered_cursor_is_a_422_naming_cursor(admin, make_sweep, cursor):
    make_sweep("one")
    response = admin.get(f"{API}/sweeps", params={"cursor": cursor})
    assert response.status_code == 422, response.text
    [item] = response.json()["detail"]
    assert (item["field"], item["loc"], item["input"]) == ("cursor", ["query", "cursor"], cursor)
    assert "next_cursor" in item["msg"]


def test_a_runs_cursor_is_refused_by_the_sweeps_list(admin, make_sweep, example_body):
    for _ in range(2):
        assert admin.post(f"{API}/runs", json=example_body).status_code == 201
    runs_cursor = admin.get(f"{API}/runs", params={"limit": 1}).json()["next_cursor"]
    response = admin.get(f"{API}/sweeps", params={"cursor": runs_cursor})
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "cursor"


@pytest.mark.parametrize("status", ["DONE", "STOPPED", "queued"])  # STOPPED: a run status, not a sweep's
def test_an_unknown_status_is_a_422_naming_the_field_the_value_and_the_statuses(admin, status):
    response = admin.get(f"{API}/sweeps", params={"status": status})
    assert response.status_code == 422, response.text
    [item] = response.json()["detail"]
    assert (item["field"], item["input"]) == ("status", status)
    assert all(s.value in item["msg"] for s in SweepStatus)


def test_the_sdk_pages_and_filters_sweeps(admin, make_sweep):
    queued = [make_sweep(f"sdk-{i}") for i in range(5)]
    canceled = make_sweep("sdk-canceled", status=SweepStatus.CANCELING)
    every = _newest_first(admin)
    with _sdk(admin) as sdk:
        page = sdk.list_sweeps(limit=2)
        assert [s.id for s in page.data] == every[:2] and page.next_cursor is not None
        following = sdk.list_sweeps(limit=2, cursor=page.next_cursor)
        assert [s.id for s in following.data] == every[2:4]
        assert [s.id for s in sdk.iter_sweeps(limit=2)] == every
        assert [s.id for s in sdk.iter_sweeps(limit=1, status="queued", name="SDK-")] == [
            sweep_id for sweep_id in every if sweep_id in queued]
        assert [s.id for s in sdk.list_sweeps(status=SweepStatus.CANCELING).data] == [canceled]
        with pytest.raises(ValueError, match="'done' is not a sweep status; one of QUEUED"):
            sdk.list_sweeps(status="done")
