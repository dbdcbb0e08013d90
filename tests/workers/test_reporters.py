"""ServiceReporter over a fake HTTP transport (its spool in a test folder), and the console sink.
The spool itself and outages longer than a retry budget: test_spool.py."""

import io
import json
import logging
import threading

import httpx
import pytest

from api.client import Client
from api.views import RunStatus
from workers.reporter import ConsoleReporter, ReportsUndeliverable, ServiceReporter, call_with_retries

TOKEN = "secret-token-123"
RUN_VIEW = {"id": "r1", "name": "n", "status": "RUNNING", "attempt": 1, "spec": {},
            "created_at": "2026-01-01T00:00:00Z"}


class FakeService:
    """Answers report requests; ``failures`` lists what to do before succeeding."""

    def __init__(self, failures=()):
        self.failures = list(failures)
        self.requests = []
        self.lock = threading.Lock()
        self.metrics_stored = threading.Event()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.requests.append(request)
            failure = self.failures.pop(0) if self.failures else None
        if failure == "connect":
            raise httpx.ConnectError("connection refused", request=request)
        if failure is not None:
            return httpx.Response(failure, json={"detail": f"status {failure}"})
        if request.url.path.endswith("/report/metrics"):
            self.metrics_stored.set()
            return httpx.Response(200, json={"stored": len(json.loads(request.content)["points"])})
        return httpx.Response(200, json=RUN_VIEW)



@pytest.fixture(autouse=True)
def _spool_in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_SPOOL_DIR", str(tmp_path / "spool"))


def reporter(service, **kwargs):
    client = Client("http://tessera.test", transport=httpx.MockTransport(service))
    return ServiceReporter(client, "r1", TOKEN, interval_s=kwargs.pop("interval_s", 60.0), first_delay_s=0.01,
                           max_delay_s=0.02, **kwargs)


def metric_bodies(service):
    return [json.loads(r.content)["points"] for r in service.requests if r.url.path.endswith("/report/metrics")]


def test_close_delivers_every_buffered_point_in_order_with_the_token():
    service = FakeService()
    sink = reporter(service)
    for step in range(1, 1001):
        sink.add(step, "train/loss", 1.0 / step)
    sink.close()
    points = [p for body in metric_bodies(service) for p in body]
    assert [p["step"] for p in points] == list(range(1, 1001))
    assert sink.posted == 1000 and sink.refused == 0 and len(sink.spool) == 0
    assert all(r.headers["Authorization"] == f"Bearer {TOKEN}" for r in service.requests)


def test_connection_errors_and_5xx_are_retried_until_the_service_answers():
    service = FakeService(failures=["connect", 503, 502, "connect"])
    sink = reporter(service)
    sink.add(1, "train/loss", 0.5)
    sink.close()
    bodies = metric_bodies(service)
    assert len(bodies) == 5 and bodies[-1][0]["value"] == 0.5
    assert sink.posted == 1 and sink.refused == 0


def test_a_4xx_answer_is_not_retried_and_is_logged_without_the_token(caplog):
    service = FakeService(failures=[422])
    sink = reporter(service)
    sink.add(1, "train/loss", 0.5)
    with caplog.at_level(logging.WARNING):
        sink.close()
    assert len(metric_bodies(service)) == 1
    assert sink.refused == 1 and len(sink.spool) == 0
    assert "refused metrics report" in caplog.text and TOKEN not in caplog.text


def test_past_its_patience_the_reporter_fails_the_run_and_keeps_the_points():
    service = FakeService(failures=[503] * 10**6)
    sink = reporter(service, patience_s=0.1)
    sink.add(1, "train/loss", 0.5)
    with pytest.raises(ReportsUndeliverable, match="TESSERA_REPORT_PATIENCE_S"):
        sink.close()
    assert len(sink.spool) == 1 and sink.posted == 0 and len(service.requests) > 1


def test_the_background_thread_posts_without_close():
    service = FakeService()
    sink = reporter(service, interval_s=0.01)
    sink.add(1, "eval/accuracy", 0.9)
    sink.flush()
    assert service.metrics_stored.wait(timeout=10)
    assert metric_bodies(service)[0][0]["key"] == "eval/accuracy"
    sink.close()


def test_deliver_returns_once_the_service_stored_what_was_added_and_false_while_it_holds_it():
    """A sweep trial's evaluation is stored before Tune sees it (workers.trainer.evaluate)."""
    gate, entered = threading.Event(), threading.Event()
    inner = FakeService()

    def held(request):
        if request.url.path.endswith("/report/metrics"):
            entered.set()
            assert gate.wait(timeout=30)
        return inner(request)

    sink = reporter(held)
    sink.add(7, "eval/accuracy", 0.5)
    assert sink.deliver(0.05) is False  # the service has not answered: not delivered
    assert entered.wait(timeout=10) and inner.requests == []
    gate.set()
    assert sink.deliver(10.0) is True
    [[point]] = metric_bodies(inner)
    assert (point["step"], point["key"], point["value"]) == (7, "eval/accuracy", 0.5)
    assert len(sink.spool) == 0 and sink.deliver(0.0) is True  # nothing left to wait for
    sink.close()


def test_deliver_counts_a_refused_report_as_answered_and_gives_up_with_the_sender():
    refused = reporter(FakeService(failures=[409]))
    refused.add(1, "eval/accuracy", 0.5)
    assert refused.deliver(10.0) is True and refused.refused == 1
    refused.close()
    # A service that is down: deliver returns at the first failed try, not after its timeout
    # (an outage would stall training at every evaluation), and the reports stay spooled.
    down = reporter(FakeService(failures=[503] * 10**6), patience_s=60.0)
    down.add(1, "eval/accuracy", 0.5)
    assert down.deliver(3600.0) is False and down.retrying and len(down.spool) == 1
    down.patience_s = 0.0  # give up now: close raises, keeping the points
    with pytest.raises(ReportsUndeliverable):
        down.close()


def test_status_reports_are_posted_after_pending_metrics():
    service = FakeService()
    sink = reporter(service)
    sink.add(3, "train/loss", 0.1)
    sink.status(RunStatus.RUNNING, message="training on 2 worker(s)")
    sink.close()
    paths = [r.url.path for r in service.requests]
    assert paths == ["/api/v1/runs/r1/report/metrics", "/api/v1/runs/r1/report/status"]
    assert json.loads(service.requests[1].content)["status"] == "RUNNING"


def test_a_refused_status_report_is_logged_and_training_goes_on(caplog):
    service = FakeService(failures=[409])
    sink = reporter(service)
    with caplog.at_level(logging.ERROR):
        sink.status(RunStatus.RUNNING)
    sink.close()
    assert len(service.requests) == 1 and "refused status report" in caplog.text


class OlderService(FakeService):
    """A service whose status report model predates ``started_at``: it refuses a body carrying it
    with the 422 its validation handler writes (``service.errors``; a real app's: test_older_service_reports.py)."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path.endswith("/report/status") and "started_at" in body:
            with self.lock:
                self.requests.append(request)
            return httpx.Response(422, json={"detail": [{
                "field": "started_at", "loc": ["body", "started_at"], "input": body["started_at"],
                "msg": "Extra inputs are not permitted; allowed fields here: status, error, message, step"}]})
        return super().__call__(request)


def status_bodies(service):
    return [json.loads(r.content) for r in service.requests if r.url.path.endswith("/report/status")]


def test_a_running_report_an_older_service_refuses_for_started_at_goes_again_without_it(caplog, monkeypatch):
    monkeypatch.setattr("workers.service_reporter._unknown_to_service", set())  # this test's process, as it were
    service = OlderService()
    with caplog.at_level(logging.WARNING, logger="workers.service_reporter"):
        for _ in range(2):  # two reporters of one process (a restarted worker group): one warning, one refusal
            sink = reporter(service)
            sink.status(RunStatus.RUNNING, message="training on 1 worker(s)", step=4)
            sink.close()
            assert sink.refused == 0 and len(sink.spool) == 0
    sent = status_bodies(service)
    assert [sorted(body) for body in sent] == [["message", "started_at", "status", "step"],
                                               ["message", "status", "step"], ["message", "status", "step"]]
    assert all((body["status"], body["step"]) == ("RUNNING", 4) for body in sent)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "older than this worker" in warning and "'started_at'" in warning


def _refusal(*items):
    from api.errors import ApiError

    return ApiError(422, list(items))


def _item(loc, **more):
    return {"field": ".".join(str(part) for part in loc[1:]), "loc": loc, "msg": "refused", "input": "x", **more}


def test_only_a_refusal_of_omittable_top_level_fields_that_were_sent_leaves_them_out():
    """``fields_unknown_to_service`` reads the 422's locations (and FastAPI's error types where an
    item has one), never its messages; anything else it refused keeps the refusal."""
    from datetime import datetime, timezone

    from api.errors import ApiError
    from api.views import StatusReport
    from workers.service_reporter import fields_unknown_to_service

    now = datetime.now(timezone.utc)
    running = StatusReport(status=RunStatus.RUNNING, step=0, started_at=now)
    ended = StatusReport(status=RunStatus.COMPLETED, ended_at=now, final_checkpoint="saved")
    started_at = _item(["body", "started_at"])
    assert fields_unknown_to_service(_refusal(started_at), running) == {"started_at"}
    assert fields_unknown_to_service(_refusal(_item(["body", "ended_at"])), ended) == {"ended_at"}
    assert fields_unknown_to_service(_refusal(_item(["body", "started_at"], type="extra_forbidden")),
                                     running) == {"started_at"}  # FastAPI's own 422 body
    refusals_that_stand = [
        _refusal(_item(["body", "step"])),  # a field that changes what the report says
        _refusal(_item(["body", "final_checkpoint"])),
        _refusal(started_at, _item(["body", "status"])),  # and something else
        _refusal(_item(["body", "started_at"], type="datetime_parsing")),  # known to it, its value refused
        _refusal(_item(["body", "started_at", "tz"])),  # not a top-level field
        _refusal(_item(["query", "started_at"])),
        _refusal(),
        ApiError(422, "refused"),
        ApiError(409, [started_at]),
        ValueError("not the service's"),
    ]
    for refusal in refusals_that_stand:
        assert fields_unknown_to_service(refusal, running) == frozenset(), refusal
    # One it was not sent: no older service refused it for that.
    assert fields_unknown_to_service(_refusal(started_at), StatusReport(status=RunStatus.RESTARTING)) == frozenset()


def test_a_status_report_refused_for_anything_else_is_refused_as_before(caplog):
    service = FakeService(failures=[422])  # FakeService's 422: a detail string, no fields named
    sink = reporter(service)
    with caplog.at_level(logging.ERROR):
        sink.status(RunStatus.RUNNING, step=0)
        sink.close()
    assert len(status_bodies(service)) == 1 and sink.refused == 1 and "refused status report" in caplog.text


def test_non_finite_values_are_skipped_not_posted():
    service = FakeService()
    sink = reporter(service)
    sink.add(1, "train/loss", float("nan"))
    sink.add(1, "lr", 0.1)
    sink.close()
    assert [p["key"] for body in metric_bodies(service) for p in body] == ["lr"]


def test_call_with_retries_raises_non_retryable_errors_at_once():
    calls = []

    def fail():
        calls.append(1)
        raise ValueError("bad spec")

    with pytest.raises(ValueError):
        call_with_retries(fail, what="test", first_delay_s=0.01)
    assert len(calls) == 1


def test_console_reporter_prints_one_line_per_flush_with_new_values():
    out = io.StringIO()
    sink = ConsoleReporter(stream=out)
    sink.add(22, "train/loss", 0.5)
    sink.add(22, "eval/accuracy", 0.875)
    sink.add(22, "time/epoch", 1)
    sink.add(22, "time/progress", 0.5)
    sink.flush()
    sink.flush()  # nothing new: no second line
    sink.add(22, "checkpoint/final_saved", 1.0)  # recorded after the last flush, and not on the line
    sink.close()  # no repeat of the same line
    lines = out.getvalue().splitlines()
    assert lines == ["step 22 | epoch 1 | 50% | train/loss 0.5 | eval/accuracy 0.875"]


def test_console_lines_show_once_in_a_ray_train_worker_whose_print_ray_patched(monkeypatch):
    """Ray Train sends print() on a wrapped stdout to the stream and to the root logger; a
    worker's own log handler writes to that same stream: a printed line would show twice."""
    import builtins
    import logging
    import sys

    from ray.train.v2._internal.logging.patch_print import redirected_print

    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)  # not sys.__stdout__, as in a Ray worker
    monkeypatch.setattr(builtins, "print", redirected_print)
    handler, root = logging.StreamHandler(out), logging.getLogger()
    monkeypatch.setattr(root, "level", logging.INFO)
    root.addHandler(handler)
    try:
        sink = ConsoleReporter(prefix="[r] ")
        sink.status(RunStatus.RUNNING, message="training on 2 worker(s)")
        sink.add(1, "train/loss", 0.5)
        sink.flush()
    finally:
        root.removeHandler(handler)
    assert out.getvalue().splitlines() == ["[r] status RUNNING: training on 2 worker(s)", "[r] step 1 | train/loss 0.5"]
