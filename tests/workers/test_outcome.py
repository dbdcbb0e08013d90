"""The end of an attempt, told to the service: when it ended travels with the report, so a report
retried through an outage does not make the run finish when the service came back; a failure
says whether Ray lost a process or node (``machine``) or the training raised (``code``), by the
types of Ray's real exceptions, never their text."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import httpx
import pytest

from api.client import Client
from workers import retry
from workers.errors import TrainingError, failure_of
from workers.outcome import RunOutcome

RUN = {"id": "r1", "name": "n", "status": "COMPLETED", "attempt": 1, "spec": {}, "created_at": "2026-01-01T00:00:00Z"}


@pytest.mark.parametrize("end", ["completed", "failed"])
def test_a_report_retried_through_an_outage_says_when_the_attempt_ended(monkeypatch, end):
    bodies = []

    def service(request):  # down for the first two tries, as through a service restart
        bodies.append(json.loads(request.content))
        return httpx.Response(503 if len(bodies) < 3 else 200, json=RUN)

    monkeypatch.setattr(retry.time, "sleep", lambda seconds: None)  # the backoff's waits, not the test's
    outcome = RunOutcome(Client("http://tessera.test", transport=httpx.MockTransport(service)), "r1", "tok")
    before = datetime.now(timezone.utc)
    if end == "completed":
        assert outcome.completed({"eval/accuracy": 0.9}) is True
    else:
        outcome.failed(ValueError("boom"))
    after = datetime.now(timezone.utc)
    assert len(bodies) == 3
    assert {body["status"] for body in bodies} == {end.upper()}
    ended = {body["ended_at"] for body in bodies}
    assert len(ended) == 1  # taken once, at the end, not again at each try
    assert before <= datetime.fromisoformat(ended.pop()) <= after


def test_the_end_of_an_attempt_lands_on_a_service_older_than_ended_at(monkeypatch):
    """A service that predates ``ended_at`` refuses it as unknown (its 422 names the field by its
    location, as ``service.errors`` writes it); the end goes again without it, as RUNNING does
    without ``started_at`` (``workers.service_reporter.send_status``)."""
    bodies = []

    def service(request):
        body = json.loads(request.content)
        bodies.append(body)
        if "ended_at" in body:
            return httpx.Response(422, json={"detail": [{"field": "ended_at", "loc": ["body", "ended_at"],
                                                         "msg": "Extra inputs are not permitted"}]})
        return httpx.Response(200, json=RUN)

    monkeypatch.setattr("workers.service_reporter._unknown_to_service", set())
    outcome = RunOutcome(Client("http://tessera.test", transport=httpx.MockTransport(service)), "r1", "tok")
    assert outcome.completed({"eval/accuracy": 0.9}) is True
    assert [sorted(body) for body in bodies] == [["ended_at", "message", "status"], ["message", "status"]]
    assert bodies[1] == {key: value for key, value in bodies[0].items() if key != "ended_at"}


def _worker_group_error(failures):
    from ray.train.v2.api.exceptions import WorkerGroupError

    return WorkerGroupError("see the ranks", failures)


def _in_training_error(exc):
    try:
        raise TrainingError("RuntimeError: wrapped") from exc  # as fit_with_ray raises it
    except TrainingError as wrapped:
        return wrapped


def test_a_lost_worker_on_any_rank_is_the_machine_s_failure_and_an_exception_in_training_the_code_s():
    from ray.exceptions import ActorDiedError, NodeDiedError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback, WorkerHealthCheckFailedError

    def raised(exc):
        return UserExceptionWithTraceback(exc, "Traceback (most recent call last): ...")

    # Rank 1's node died; rank 0, lower, failed in its collective waiting for it.
    peer_lost = _worker_group_error({0: raised(RuntimeError("Connection closed by peer")),
                                     1: WorkerHealthCheckFailedError("worker 1 is not answering", ActorDiedError())})
    assert failure_of(_in_training_error(peer_lost)) == "machine"
    assert failure_of(_in_training_error(NodeDiedError("node 10.0.0.7 died"))) == "machine"
    code = _worker_group_error({0: raised(ValueError("lr must be positive")), 1: raised(ValueError("lr"))})
    assert failure_of(_in_training_error(code)) == "code"
    # The text says "node died", the type does not: the code raised it.
    assert failure_of(RuntimeError("NodeDiedError: node died (preempted)")) == "code"


def test_ray_s_errors_that_every_attempt_would_meet_are_not_the_machine_s_and_a_busy_cluster_is_not_known():
    from ray.exceptions import ActorDiedError, RaySystemError
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError

    assert failure_of(_in_training_error(RaySystemError("Failed to unpickle serialized exception"))) == "code"
    init_raised = ActorDiedError()
    init_raised._actor_init_failed = True  # its __init__ raised (ray.exceptions.RayActorError.actor_init_failed)
    assert init_raised.actor_init_failed and failure_of(_in_training_error(init_raised)) == "code"
    assert failure_of(_in_training_error(WorkerGroupStartupTimeoutError(num_workers=2))) is None


def test_a_failed_report_carries_the_failure():
    bodies = []

    def service(request):
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={**RUN, "status": "FAILED"})

    from ray.exceptions import ActorDiedError

    outcome = RunOutcome(Client("http://tessera.test", transport=httpx.MockTransport(service)), "r1", "tok")
    outcome.failed(_in_training_error(_worker_group_error({0: ActorDiedError()})))
    outcome.failed(ValueError("boom"))
    assert [body["failure"] for body in bodies] == ["machine", "code"]
