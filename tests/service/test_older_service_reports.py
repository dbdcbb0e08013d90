"""A worker newer than its service: the service's status reports predate ``started_at`` (a real
app whose status route takes the report model without it, refusing through the service's own
validation handler), and the worker's RUNNING still lands: ``ServiceReporter`` sends it again
without the field it does not know, and says once that the service is older."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

import httpx
from pydantic import ConfigDict, create_model

from api.client import Client
from api.views import RunStatus, RunView, StatusReport
from service.deps import RepoDep, RunTokenDep
from service.json_body import ParsedBodyRoute
from service.routes import reports
from workers.service_reporter import ServiceReporter

API = "/api/v1"
STATUS_ROUTE = f"{API}/runs/{{run_id}}/report/status"

# StatusReport as a service before started_at: every other field as it is, unknown ones forbidden.
StatusReportBeforeStartedAt = create_model(
    "StatusReport", __config__=ConfigDict(extra="forbid"),
    **{name: (field.annotation, field) for name, field in StatusReport.model_fields.items() if name != "started_at"})


def report_status_before_started_at(run_id: RunTokenDep, report: StatusReportBeforeStartedAt, repo: RepoDep):
    """The service's status route over the older model: what it takes, it applies as the service does."""
    return reports.report_status(run_id, StatusReport.model_validate(report.model_dump()), repo)


def as_older_service(app) -> None:
    """``app``, its status route taking ``StatusReportBeforeStartedAt``; every other route, the
    error handlers and the middleware as they are. The older route goes first: FastAPI's router
    answers with the first route that matches, in ``routes`` order (``APIRouter.app``, 0.165), and
    the service's own one sits inside the reports router's ``_IncludedRouter`` entry."""
    app.router.add_api_route(STATUS_ROUTE, report_status_before_started_at, methods=["POST"],
                             response_model=RunView, route_class_override=ParsedBodyRoute)
    app.router.routes.insert(0, app.router.routes.pop())


def test_a_running_report_with_started_at_lands_on_a_service_older_than_the_field(client, fake_jobs, example_body,
                                                                                 tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TESSERA_SPOOL_DIR", str(tmp_path / "spool"))
    monkeypatch.setattr("workers.service_reporter._unknown_to_service", set())  # a fresh worker process
    as_older_service(client.app)
    run_id = client.post(f"{API}/runs", json=example_body).json()["id"]
    client.app.state.dispatcher.tick()
    token = fake_jobs.jobs[f"run-{run_id}-attempt-1"]["env"]["TESSERA_RUN_TOKEN"]
    bearer = {"Authorization": f"Bearer {token}"}
    refused = client.post(f"{API}/runs/{run_id}/report/status", headers=bearer,
                          json={"status": "RUNNING", "started_at": datetime.now(timezone.utc).isoformat()})
    assert refused.status_code == 422 and [item["loc"] for item in refused.json()["detail"]] == [["body", "started_at"]]

    answers: list[tuple[dict, int]] = []

    class ThroughTestClient(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            body = request.read()
            answer = client.request(request.method, str(request.url), headers=dict(request.headers), content=body)
            answers.append((json.loads(body), answer.status_code))
            return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    sink = ServiceReporter(Client("http://testserver", transport=ThroughTestClient()), run_id, token,
                           interval_s=60.0, first_delay_s=0.01, max_delay_s=0.02)
    with caplog.at_level(logging.WARNING, logger="workers.service_reporter"):
        sink.status(RunStatus.RUNNING, message="training on 1 worker(s)", step=0)
        sink.close()

    assert [(sorted(body), status) for body, status in answers] == [
        (["message", "started_at", "status", "step"], 422), (["message", "status", "step"], 200)]
    assert sink.refused == 0
    run = client.get(f"{API}/runs/{run_id}").json()
    assert run["status"] == "RUNNING"
    events = client.get(f"{API}/runs/{run_id}/events").json()["data"]
    assert (events[-1]["from_status"], events[-1]["to_status"], events[-1]["message"]) == (
        "STARTING", "RUNNING", "training on 1 worker(s)")
    [warning] = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert "older than this worker" in warning and "'started_at'" in warning
