"""Limits on every input: each a clear 4xx, nothing stored.

The defects named in the issue each have a test here: an oversized body, a million-point grid,
``?sweep_id=%00`` and an overflowing cursor on PostgreSQL, a flood of metric keys or points,
a non-finite metric, and a data root outside the data directories.
"""

from __future__ import annotations

import base64
import json
import types
from datetime import datetime, timezone

import pytest
from fastapi.testclient import TestClient

from tests.conftest import ADMIN_HEADERS

from service.app import create_app
from service.settings import Settings
from tests.service.test_api_routes import API, _points, _start


def _cursor(created_at: str, run_id: str = "abcdef012345") -> str:
    return base64.urlsafe_b64encode(json.dumps([created_at, run_id]).encode()).decode().rstrip("=")


@pytest.mark.parametrize("created_at, status", [
    ("9999-12-31T23:59:59-14:00", 422),   # past year 9999 once in UTC
    ("0001-01-01T00:00:00+14:00", 422),   # before year 1 once in UTC
    ("9999-12-31T23:59:59.999999+00:00", 200),
    ("0001-01-01T00:00:00+00:00", 200),
])
def test_an_overflowing_cursor_on_postgresql_is_a_422(pg_client, created_at, status):
    response = pg_client.get(f"{API}/runs", params={"cursor": _cursor(created_at)})
    assert response.status_code == status, response.text
    if status == 422:
        assert response.json()["detail"][0]["field"] == "cursor"


def test_a_nul_in_a_query_parameter_on_postgresql_is_a_422_naming_it(pg_client):
    response = pg_client.get(f"{API}/runs?sweep_id=%00")
    assert response.status_code == 422, response.text
    item = response.json()["detail"][0]
    assert item["field"] == "sweep_id" and "NUL" in item["msg"]


@pytest.fixture
def limited(tmp_path, fake_jobs):
    """A client on an app with small limits; ``limited(**settings)`` builds it."""
    clients = []

    def build(**overrides) -> TestClient:
        settings = Settings(home=tmp_path / "home", public_url="http://tessera.test:8000", **overrides)
        client = TestClient(create_app(settings, jobs=fake_jobs, run_dispatcher=False), headers=ADMIN_HEADERS)
        clients.append(client.__enter__())
        return client

    yield build
    for client in clients:
        client.__exit__(None, None, None)


def test_a_body_over_the_limit_is_a_413_naming_it_and_nothing_is_stored(limited, example_body):
    client = limited(max_body_bytes=4096)
    example_body["tags"] = ["x" * 100] * 60  # about 6 KiB
    response = client.post(f"{API}/runs", json=example_body)
    assert response.status_code == 413
    assert "4096 bytes" in response.json()["detail"] and "TESSERA_MAX_BODY_BYTES" in response.json()["detail"]
    assert client.get(f"{API}/runs").json()["data"] == []


def test_a_chunked_body_without_a_length_is_cut_off_at_the_limit(limited):
    client = limited(max_body_bytes=4096)
    sent = []

    def chunks():
        for _ in range(1000):  # 1 MB offered; the service stops reading past 4 KiB
            sent.append(1)
            yield b"x" * 1000

    response = client.post(f"{API}/runs", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and "TESSERA_MAX_BODY_BYTES" in response.json()["detail"]


def test_code_packages_have_their_own_larger_limit(limited):
    client = limited(max_body_bytes=4096, code_max_body_bytes=64 * 1024)
    assert client.post(f"{API}/code", content=b"x" * 8192).status_code != 413  # no such route here yet
    response = client.post(f"{API}/code", content=b"x" * 70_000)
    assert response.status_code == 413 and "TESSERA_CODE_MAX_BODY_BYTES" in response.json()["detail"]


def _sweep(example_body, params):
    return {"name": "big", "base": example_body, "search": {"params": params}}


def test_a_million_point_grid_is_refused_before_it_is_expanded(client, example_body):
    grids = {"optimizer.lr": {"grid": [0.01 * i for i in range(1, 11)]},
             "optimizer.momentum": {"grid": [0.05 * i for i in range(10)]},
             "optimizer.weight_decay": {"grid": [1e-5 * i for i in range(10)]},
             "seed": {"grid": list(range(10))},
             "data.batch_size": {"grid": [16 * i for i in range(1, 11)]},
             "algorithms.label_smoothing.smoothing": {"grid": [0.01 * i for i in range(10)]}}
    response = client.post(f"{API}/sweeps", json=_sweep(example_body, grids))
    assert response.status_code == 422
    assert "search: expands to 1000000 trials; at most 10000 allowed" in response.text
    assert client.get(f"{API}/sweeps").json()["data"] == []


def test_the_service_cap_on_trials_is_a_setting(limited, example_body):
    client = limited(max_sweep_trials=4)
    response = client.post(f"{API}/sweeps", json=_sweep(example_body, {"seed": {"grid": [1, 2, 3, 4, 5]}}))
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] == "search"
    assert "expands to 5 trials; at most 4 allowed" in response.json()["detail"][0]["msg"]
    ok = client.post(f"{API}/sweeps", json=_sweep(example_body, {"seed": {"grid": [1, 2, 3, 4]}}))
    assert ok.status_code == 201, ok.text


def test_metric_reports_past_a_limit_are_refused_whole_with_the_limit_named(limited, fake_jobs, example_body):
    client = limited(max_metric_keys_per_run=2, max_points_per_report=4, max_points_per_run=6)
    run, token = _start(client, fake_jobs, example_body)
    url, auth = f"{API}/runs/{run['id']}/report/metrics", {"Authorization": f"Bearer {token}"}
    too_many = client.post(url, json=_points(1, 2, 3, 4, 5), headers=auth)
    assert too_many.status_code == 413 and "TESSERA_MAX_POINTS_PER_REPORT" in too_many.json()["detail"]
    assert client.post(url, json=_points(1, 2, 3, key="loss"), headers=auth).json() == {"stored": 3}
    assert client.post(url, json=_points(1, key="acc"), headers=auth).json() == {"stored": 1}
    third_key = client.post(url, json=_points(1, key="lr"), headers=auth)
    assert third_key.status_code == 422 and "at most 2 distinct metric keys" in third_key.json()["detail"]
    over_budget = client.post(url, json=_points(1, 2, 3, key="loss", first_step=3), headers=auth)
    assert over_budget.status_code == 422 and "budget of 6 metric points" in over_budget.json()["detail"]
    assert len(client.get(f"{API}/runs/{run['id']}/metrics").json()["data"]) == 4  # nothing from the refusals


def test_a_non_finite_metric_is_kept_as_a_run_event(client, fake_jobs, example_body):
    run, token = _start(client, fake_jobs, example_body)
    now = datetime.now(timezone.utc).isoformat()
    raw = ('{"points": [{"step": 11, "key": "train/loss", "value": 2.5, "time": "%s"},'
           ' {"step": 12, "key": "train/loss", "value": NaN, "time": "%s"},'
           ' {"step": 13, "key": "train/loss", "value": Infinity, "time": "%s"}]}' % (now, now, now))
    response = client.post(f"{API}/runs/{run['id']}/report/metrics", content=raw,
                           headers={"Authorization": f"Bearer {token}", "content-type": "application/json"})
    assert response.json() == {"stored": 1}
    messages = [e["message"] for e in client.get(f"{API}/runs/{run['id']}/events").json()["data"]]
    assert "non-finite train/loss at step 12 (nan, 2 points)" in messages


def test_integers_a_column_cannot_hold_are_a_422_on_postgresql(pg_client, fake_jobs, example_body):
    run, token = _start(pg_client, fake_jobs, example_body)
    auth = {"Authorization": f"Bearer {token}"}
    report = {"step": 1, "epoch": 2**31, "time": datetime.now(timezone.utc).isoformat(), "committed": True,
              "url": "file:///x", "world_size": 1}
    response = pg_client.post(f"{API}/runs/{run['id']}/report/checkpoint", json=report, headers=auth)
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "epoch"
    huge = _points(1.0)
    huge["points"][0]["step"] = 2**70
    response = pg_client.post(f"{API}/runs/{run['id']}/report/metrics", json=huge, headers=auth)
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "points[0].step"


def test_a_too_large_integer_under_a_dotted_key_is_named_with_the_key_whole(client, sweep_body):
    sweep_body["search"]["params"]["optimizer.lr"] = {"grid": [2**70]}
    response = client.post(f"{API}/sweeps", json=sweep_body)
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert item["field"] == "search.params['optimizer.lr'].grid[0]", item
    assert item["loc"] == ["body", "search", "params", "optimizer.lr", "grid", 0]


def test_a_data_root_outside_the_data_dirs_is_a_422(limited, example_body, tmp_path):
    client = limited(data_dirs=[tmp_path / "sets"])
    example_body["data"] = {"train": {"name": "fashion_mnist", "root": "/etc"},
                            "eval": {"name": "fashion_mnist", "split": "test"}, "batch_size": 8}
    example_body["algorithms"] = []
    response = client.post(f"{API}/runs", json=example_body)
    assert response.status_code == 422, response.text
    item = response.json()["detail"][0]
    assert item["field"] == "data.train.root" and item["input"] == "/etc" and "TESSERA_DATA_DIRS" in item["msg"]
    sweep = client.post(f"{API}/sweeps", json=_sweep(example_body, {"seed": {"grid": [1, 2]}}))
    assert sweep.status_code == 422 and sweep.json()["detail"][0]["field"] == "base.data.train.root"
    external = client.post(f"{API}/sweeps", params={"driver": "external"},
                           json=_sweep(dict(example_body, data={"train": {"name": "digits"}, "batch_size": 8,
                                                                "eval": {"name": "digits", "split": "test"}}),
                                       {"seed": {"grid": [1, 2]}})).json()
    trial = client.post(f"{API}/sweeps/{external['id']}/trials", json={"trial_id": "t1", "spec": example_body},
                        headers={"Authorization": f"Bearer {external['driver_token']}"})
    assert trial.status_code == 422 and trial.json()["detail"][0]["field"] == "spec.data.train.root"
    example_body["data"]["train"]["root"] = str(tmp_path / "sets" / "fmnist")
    assert client.post(f"{API}/runs", json=example_body).status_code == 201


def _nested(depth: int, inner: object = 1) -> object:
    for _ in range(depth):
        inner = [inner]
    return inner


REPORT = {"points": [{"step": i, "key": "train/loss", "value": 1 / (i + 1)} for i in range(1000)]}


@pytest.mark.parametrize("data", [
    _nested(63), _nested(64), _nested(65), _nested(66, inner=[]), _nested(64, inner={}), _nested(200),
    {"a": _nested(63)}, {"a": _nested(64)}, [_nested(10)] * 50,
    2**63 - 1, 2**63, -(2**63), -(2**63) - 1, [1.5, 10**18, 12345678901234567890],
    [0.00012345678901234567, 1e-300, 123456789012345678901.5, -1.2345678901234567e+300],
    {"key": "[[[[" * 40, "value": 1}, {"key": '"]]]] \\" {{{{' * 30, "n": _nested(30)}, REPORT,
])
def test_the_fast_path_of_the_json_check_agrees_with_the_full_walk(data):
    """The middleware's quick look at a parsed body finds a problem exactly when the full walk
    (which names each problem) does."""
    from api.limits import db_value_problems
    from service.limits import _json_problems, _may_have_problems

    body = json.dumps(data).encode()
    walked = list(db_value_problems(json.loads(body), text=False))
    assert bool(_json_problems({}, body)) == bool(walked)
    assert _may_have_problems(json.loads(body)) == bool(walked)


def test_a_metric_report_takes_the_fast_path():
    from service.limits import _may_have_problems

    assert not _may_have_problems(REPORT)


def test_a_body_nested_past_the_limit_is_a_422_and_one_at_it_is_not(client, example_body):
    from api.limits import MAX_DEPTH

    deep = client.post(f"{API}/runs", json={**example_body, "tags": _nested(MAX_DEPTH)})  # a leaf at depth 65
    assert deep.status_code == 422 and "nested deeper" in deep.text, deep.text
    at_limit = client.post(f"{API}/runs", json={**example_body, "tags": _nested(MAX_DEPTH - 1)})  # at 64
    assert at_limit.status_code == 422 and "nested deeper" not in at_limit.text  # the route's own validation


@pytest.mark.parametrize("body", [
    b'{"a": 123456789012345678901234567890, "b": -9223372036854775809}', b'[NaN, Infinity, -Infinity, 1e400, -0.0]',
    b'{"a": 1, "a": 2}', b'[0.1, 0.30000000000000004, 5e-324, 2.2250738585072011e-308, 1.7976931348623157e308]',
    b'["\\u00e9\\ud83d\\ude00", "\\u0000", "\\/\\b\\f"]', b'"\\ud800"', _nested(300).__repr__().encode(),
    '{"é": "ü"}'.encode("utf-16"), b'\xef\xbb\xbf{"bom": 1}', b"1E5", b" {} ",
])
def test_the_fast_json_parse_gives_what_json_loads_gives(body):
    """``parse_json`` answers every body as ``json.loads`` does (types and floats bit for bit),
    including the ones its fast parser refuses and hands to ``json.loads``."""
    import math
    import struct

    from service.json_body import parse_json

    def same(a, b) -> bool:
        if type(a) is not type(b):
            return False
        if isinstance(a, float):
            return (math.isnan(a) and math.isnan(b)) or struct.pack("d", a) == struct.pack("d", b)
        if isinstance(a, dict):
            return list(a) == list(b) and all(same(a[key], b[key]) for key in a)
        if isinstance(a, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b

    try:
        expected = json.loads(body)
    except ValueError as error:
        with pytest.raises(type(error)):
            parse_json(body)
        return
    assert same(parse_json(body), expected)


def test_every_route_takes_the_body_the_limits_check_parsed(client, fake_jobs, example_body, monkeypatch):
    """A JSON body is parsed once, by ``RequestLimits``: no route parses it again."""
    from fastapi.routing import APIRoute

    import starlette.requests
    from service.json_body import ParsedBodyRoute

    def routes(router):  # FastAPI keeps an included router whole, as its original_router
        for route in router.routes:
            included = getattr(route, "original_router", None)
            yield from routes(included) if included is not None else [route]

    api_routes = [route for route in routes(client.app) if isinstance(route, APIRoute)]
    assert len([route for route in api_routes if route.body_field]) > 10
    # The dashboard and the API docs page: pages, no body to parse.
    assert [route.path for route in api_routes if not isinstance(route, ParsedBodyRoute)] == ["/", f"{API}/docs"]
    run, token = _start(client, fake_jobs, example_body)
    parses = []

    def counted(body):  # Request.json's own parse, which runs only if the request has none yet
        parses.append(body)
        return json.loads(body)

    monkeypatch.setattr(starlette.requests, "json", types.SimpleNamespace(loads=counted))
    response = client.post(f"{API}/runs/{run['id']}/report/metrics", json=_points(1.0, 2.0),
                           headers={"Authorization": f"Bearer {token}"})
    assert response.json() == {"stored": 2} and parses == []
    assert client.post(f"{API}/runs", json=example_body).status_code == 201 and parses == []


@pytest.mark.parametrize("time", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:00-05:00"])
def test_a_reported_time_outside_the_years_1_to_9999_in_utc_is_a_422(pg_client, fake_jobs, example_body, time):
    """PostgreSQL would store such an instant, and no read could return it."""
    run, token = _start(pg_client, fake_jobs, example_body)
    auth = {"Authorization": f"Bearer {token}"}
    points = _points(1.0)
    points["points"][0]["time"] = time
    response = pg_client.post(f"{API}/runs/{run['id']}/report/metrics", json=points, headers=auth)
    assert response.status_code == 422, response.text
    item = response.json()["detail"][0]
    assert item["field"] == "points[0].time" and item["input"] == time and "years 1 to 9999" in item["msg"]
    checkpoint = {"step": 1, "epoch": 1, "time": time, "committed": True, "url": "file:///x", "world_size": 1}
    response = pg_client.post(f"{API}/runs/{run['id']}/report/checkpoint", json=checkpoint, headers=auth)
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "time"
    assert pg_client.get(f"{API}/runs/{run['id']}/metrics").json()["data"] == []
    assert pg_client.get(f"{API}/runs/{run['id']}/checkpoints").status_code == 200
