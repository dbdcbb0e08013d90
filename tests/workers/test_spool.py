"""The report spool (workers.spool) and ServiceReporter through outages: bounded, ordered,
replayed in order once the service answers, and by the next reporter of the run after a kill."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone

import httpx
import pytest

from api.client import Client
from api.views import RunStatus
from workers.service_reporter import ServiceReporter
from workers.spool import Spool, SpoolFull

TOKEN = "secret-token-123"
RUN_VIEW = {"id": "r1", "name": "n", "status": "RUNNING", "attempt": 1, "spec": {},
            "created_at": "2026-01-01T00:00:00Z"}


class FlakyService:
    """Refuses connections while ``down`` is set; otherwise stores metric batches once per
    (session, batch), as the real service does. ``lose_answers`` batches are stored but their
    answer is lost (a 503 after storing), so the reporter sends them again."""

    def __init__(self, *, lose_answers: int = 0):
        self.down = threading.Event()
        self.lose_answers = lose_answers
        self.stored: list[tuple[int, str, float]] = []
        self.seen: set[tuple[str, int]] = set()
        self.kinds: list[str] = []
        self.statuses: list[dict] = []  # the status reports' bodies, as delivered
        self.attempts = 0
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.attempts += 1
            if self.down.is_set():
                raise httpx.ConnectError("connection refused", request=request)
            body = json.loads(request.content)
            kind = request.url.path.rsplit("/", 1)[-1]
            if kind != "metrics":
                self.kinds.append(body.get("status", kind))
                if kind == "status":
                    self.statuses.append(body)
                return httpx.Response(200, json=RUN_VIEW)
            batch = (body["session"], body["batch"])
            if batch in self.seen:
                return httpx.Response(200, json={"stored": 0, "replayed": True})
            self.seen.add(batch)
            self.stored += [(p["step"], p["key"], p["value"]) for p in body["points"]]
            self.kinds.append("metrics")
            if self.lose_answers:
                self.lose_answers -= 1
                return httpx.Response(503, json={"detail": "database connection lost"})
            return httpx.Response(200, json={"stored": len(body["points"])})


def make_reporter(service, spool_dir, **kwargs) -> ServiceReporter:
    client = Client("http://tessera.test", transport=httpx.MockTransport(service))
    return ServiceReporter(client, "r1", TOKEN, interval_s=0.01, first_delay_s=0.01, max_delay_s=0.05,
                           spool=Spool(spool_dir), **kwargs)


def wait_for(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_the_spool_is_ordered_bounded_and_survives_a_reopen(tmp_path):
    spool = Spool(tmp_path, max_bytes=200)
    first = spool.put("metrics", {"n": 1})
    spool.put("status", {"n": 2})
    with pytest.raises(SpoolFull, match="TESSERA_SPOOL_MAX_BYTES=200"):
        spool.put("metrics", {"n": "x" * 300})
    (tmp_path / "000000000099.tmp").write_bytes(b"{torn")  # a write cut short by a kill
    reopened = Spool(tmp_path, max_bytes=200)
    assert len(reopened) == 2 and not (tmp_path / "000000000099.tmp").exists()
    head = reopened.head()
    assert (head.seq, head.kind, head.body) == (first, "metrics", {"n": 1})
    reopened.pop(head.seq)
    assert reopened.head().body == {"n": 2}
    assert reopened.put("metrics", {"n": 3}) > head.seq + 1  # numbering goes on after what was left


def test_an_outage_longer_than_the_old_retry_budget_loses_nothing_and_keeps_the_order(tmp_path):
    # The reporter used to drop what it held after a fixed retry budget; now it waits out an
    # outage of any length shorter than its patience, spooling, and delivers in order after.
    service = FlakyService()
    sink = make_reporter(service, tmp_path, patience_s=60.0)
    service.down.set()
    before = datetime.now(timezone.utc)
    sink.status(RunStatus.RUNNING, step=0)
    made = datetime.now(timezone.utc)
    for step in range(1, 301):
        sink.add(step, "train/loss", 1.0 / step)
        if step % 50 == 0:
            sink.flush()
    wait_for(lambda: service.attempts >= 10 and len(sink.spool) >= 6)  # retried for a while, spooled
    service.down.clear()
    sink.close()
    assert service.kinds[0] == "RUNNING" and set(service.kinds[1:]) == {"metrics"}
    assert [step for step, _, _ in service.stored] == list(range(1, 301))
    assert len(sink.spool) == 0
    # RUNNING says when training began, not when the service came back to take it.
    assert before <= datetime.fromisoformat(service.statuses[0]["started_at"]) <= made


def test_a_batch_whose_answer_was_lost_is_replayed_and_stored_once(tmp_path):
    service = FlakyService(lose_answers=2)
    sink = make_reporter(service, tmp_path)
    for step in range(1, 4):
        sink.add(step, "train/loss", float(step))
        sink.flush()
    sink.close()
    assert [step for step, _, _ in service.stored] == [1, 2, 3]
    assert len(service.seen) == 3 and service.attempts > 3


def test_a_new_reporter_replays_what_a_killed_one_left_before_its_own_reports(tmp_path):
    service = FlakyService()
    service.down.set()
    dead = make_reporter(service, tmp_path, patience_s=0.05)
    for step in (1, 2):
        dead.add(step, "train/loss", float(step))
    dead.flush()
    with pytest.raises(Exception, match="did not take reports"):
        dead.close()  # as if killed: its reports stay in the spool
    assert len(dead.spool) == 1
    service.down.clear()
    fresh = make_reporter(service, tmp_path)
    fresh.status(RunStatus.RUNNING, step=0)
    fresh.add(1, "train/loss", 10.0)
    fresh.close()
    assert service.kinds == ["metrics", "RUNNING", "metrics"]
    assert service.stored == [(1, "train/loss", 1.0), (2, "train/loss", 2.0), (1, "train/loss", 10.0)]


def test_a_full_spool_holds_training_until_the_service_takes_reports(tmp_path):
    service = FlakyService()
    service.down.set()
    sink = make_reporter(service, tmp_path / "s", patience_s=60.0)
    sink.spool.max_bytes = 1  # one entry fills it
    sink.add(1, "train/loss", 1.0)
    sink.flush()
    sink.add(2, "train/loss", 2.0)
    released = threading.Event()
    threading.Thread(target=lambda: (sink.flush(), released.set()), daemon=True).start()
    assert not released.wait(0.3)  # held: nothing is dropped to make room
    service.down.clear()
    assert released.wait(20)
    sink.close()
    assert [step for step, _, _ in service.stored] == [1, 2]
