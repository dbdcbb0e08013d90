"""``GET /metrics``: parsed with prometheus_client's own parser; values move with requests and runs."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

API = "/api/v1"


def _scrape(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text) for sample in family.samples}


def _value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_request_counts_and_latency_are_by_route_template(client, example_body):
    before = _scrape(client)
    run_id = client.post(f"{API}/runs", json=example_body).json()["id"]
    client.get(f"{API}/runs/{run_id}")
    client.get(f"{API}/runs/{run_id}")
    client.get(f"{API}/runs/unknown-run")
    after = _scrape(client)
    route = "/api/v1/runs/{run_id}"
    assert _value(after, "tessera_http_requests_total", method="GET", route=route, status="200") - \
        _value(before, "tessera_http_requests_total", method="GET", route=route, status="200") == 2
    assert _value(after, "tessera_http_requests_total", method="GET", route=route, status="404") == 1
    assert _value(after, "tessera_http_requests_total", method="POST", route="/api/v1/runs", status="201") == 1
    assert _value(after, "tessera_http_request_duration_seconds_count", method="GET", route=route) == 3
    assert not any(run_id in str(labels) for _, labels in after)  # ids never become labels


def test_requests_no_route_answered_count_as_unmatched_with_their_status(client, settings):
    client.get(f"{API}/no-such-route/123")
    too_large = b"{" + b" " * settings.max_body_bytes + b"}"
    assert client.post(f"{API}/runs", content=too_large, headers={"content-type": "application/json"}).status_code == 413
    samples = _scrape(client)
    assert _value(samples, "tessera_http_requests_total", method="GET", route="unmatched", status="404") == 1
    assert _value(samples, "tessera_http_requests_total", method="POST", route="unmatched", status="413") == 1
    assert not any("123" in str(labels) for _, labels in samples)


def test_an_error_that_escapes_a_route_counts_as_a_500(client, monkeypatch):
    from service.routes import runs

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(runs.Repository, "list_runs", broken)
    with pytest.raises(RuntimeError):
        client.get(f"{API}/runs")
    samples = _scrape(client)
    assert _value(samples, "tessera_http_requests_total", method="GET", route="/api/v1/runs", status="500") == 1


def test_runs_by_status_queue_depth_ticks_ingest_and_ray(client, fake_jobs, example_body):
    assert _value(_scrape(client), "tessera_queue_depth") == 0
    run_ids = [client.post(f"{API}/runs", json=example_body).json()["id"] for _ in range(2)]
    samples = _scrape(client)
    assert _value(samples, "tessera_queue_depth") == 2 and _value(samples, "tessera_runs", status="QUEUED") == 2
    assert _value(samples, "tessera_ray_up") == 1
    client.app.state.dispatcher.tick()
    samples = _scrape(client)
    assert _value(samples, "tessera_queue_depth") == 0 and _value(samples, "tessera_runs", status="STARTING") == 2
    assert _value(samples, "tessera_dispatcher_tick_seconds_count") >= 1
    token = fake_jobs.jobs[f"run-{run_ids[0]}-attempt-1"]["env"]["TESSERA_RUN_TOKEN"]
    points = {"points": [{"key": "loss", "step": step, "value": 1.0, "time": 0.0} for step in range(3)]}
    stored = client.post(f"{API}/runs/{run_ids[0]}/report/metrics", json=points,
                         headers={"Authorization": f"Bearer {token}"})
    assert stored.status_code == 200, stored.text
    assert _value(_scrape(client), "tessera_metric_points_total") == 3


def test_ray_down_reads_as_zero(client, fake_jobs):
    def unreachable(job_id):
        raise ConnectionError("Ray is down")

    fake_jobs.status = unreachable
    assert _value(_scrape(client), "tessera_ray_up") == 0
