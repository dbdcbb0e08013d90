"""Worker reports replayed after an outage, on SQLite and PostgreSQL: idempotent statuses (a
COMPLETED after a lost RUNNING, repeated terminal reports), metric batches stored once, points
superseded by a resumed attempt on every resume path, a missing final checkpoint, and late
reports' times (the worker's, not their arrival's): when an attempt began training and when it
ended, each kept within the current attempt's start and now."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, update

from api.views import RunStatus
from service.db.models import Run, RunBest

API = "/api/v1"


@pytest.fixture(params=["sqlite", "postgresql"])
def api(request):
    return request.getfixturevalue("client" if request.param == "sqlite" else "pg_client")


def _start(api, fake_jobs, body) -> tuple[str, str]:
    run = api.post(f"{API}/runs", json=body).json()
    api.app.state.dispatcher.tick()
    return run["id"], _token(fake_jobs, run["id"], 1)


def _token(fake_jobs, run_id: str, attempt: int) -> str:
    return fake_jobs.jobs[f"run-{run_id}-attempt-{attempt}"]["env"]["TESSERA_RUN_TOKEN"]


def _post(api, run_id, token, what, body):
    return api.post(f"{API}/runs/{run_id}/report/{what}", json=body, headers={"Authorization": f"Bearer {token}"})


def _batch(steps, value, *, session="a1", batch=1, key="train/loss") -> dict:
    now = datetime.now(timezone.utc).isoformat()
    return {"points": [{"step": s, "key": key, "value": value(s), "time": now} for s in steps],
            "session": session, "batch": batch}


def _events(api, run_id):
    events = api.get(f"{API}/runs/{run_id}/events").json()["data"]
    return [(e["from_status"], e["to_status"], e["message"]) for e in events]


def test_completed_after_a_lost_running_is_the_legal_sequence_and_repeats_are_no_ops(api, fake_jobs, example_body):
    run_id, token = _start(api, fake_jobs, example_body)
    done = _post(api, run_id, token, "status", {"status": "COMPLETED", "message": "eval/accuracy=0.9"})
    assert done.status_code == 200 and done.json()["status"] == "COMPLETED"
    events = _events(api, run_id)
    assert [(f, t) for f, t, _ in events[-2:]] == [("STARTING", "RUNNING"), ("RUNNING", "COMPLETED")]
    assert "RUNNING report lost" in events[-2][2]
    again = _post(api, run_id, token, "status", {"status": "COMPLETED", "message": "eval/accuracy=0.9"})
    assert again.status_code == 200 and again.json()["status"] == "COMPLETED"
    assert _events(api, run_id) == events  # nothing recorded twice
    assert _post(api, run_id, token, "status", {"status": "FAILED", "error": "x"}).status_code == 409


def test_a_restart_after_a_lost_running_fills_it_in(api, fake_jobs, example_body):
    run_id, token = _start(api, fake_jobs, example_body)
    restarting = _post(api, run_id, token, "status", {"status": "RESTARTING"})
    assert restarting.status_code == 200 and restarting.json()["attempt"] == 2
    assert [(f, t) for f, t, _ in _events(api, run_id)[-2:]] == [("STARTING", "RUNNING"), ("RUNNING", "RESTARTING")]


def test_a_replayed_metric_batch_is_acknowledged_and_stored_once(api, fake_jobs, example_body):
    run_id, token = _start(api, fake_jobs, example_body)
    _post(api, run_id, token, "status", {"status": "RUNNING", "step": 0})
    first = _post(api, run_id, token, "metrics", _batch([1, 2], lambda s: 1.0 / s))
    assert first.json() == {"stored": 2}
    replay = _post(api, run_id, token, "metrics", _batch([1, 2], lambda s: 1.0 / s))
    assert replay.status_code == 200 and replay.json() == {"stored": 0, "replayed": True}
    assert _post(api, run_id, token, "metrics", _batch([3], lambda s: 0.2, batch=2)).json() == {"stored": 1}
    _post(api, run_id, token, "status", {"status": "COMPLETED"})
    late_replay = _post(api, run_id, token, "metrics", _batch([3], lambda s: 0.2, batch=2))
    assert late_replay.status_code == 200 and late_replay.json()["replayed"] is True  # its answer was lost
    steps = [p["step"] for p in api.get(f"{API}/runs/{run_id}/metrics").json()["data"]]
    assert steps == [1, 2, 3]


def _restart_in_job(api, fake_jobs, run_id, token):
    """Ray Train restarts the worker group: same job and token, RESTARTING then RUNNING."""
    _post(api, run_id, token, "status", {"status": "RESTARTING"})
    return token


def _manual_resume(api, fake_jobs, run_id, token):
    _post(api, run_id, token, "status", {"status": "FAILED", "error": "RuntimeError: killed"})
    assert api.post(f"{API}/runs/{run_id}/resume").status_code == 200
    api.app.state.dispatcher.tick()
    return _token(fake_jobs, run_id, 2)


def _requeue_by_service(api, fake_jobs, run_id, token):
    api.app.state.repo.transition(run_id, RunStatus.QUEUED, message="job lost; re-queued")
    api.app.state.dispatcher.tick()
    return _token(fake_jobs, run_id, 2)


@pytest.mark.parametrize("resume", [_restart_in_job, _manual_resume, _requeue_by_service],
                         ids=["worker_restart", "manual_resume", "requeue_by_service"])
def test_a_resumed_attempt_supersedes_the_points_after_its_checkpoint(api, fake_jobs, example_body, resume):
    run_id, token = _start(api, fake_jobs, example_body)
    _post(api, run_id, token, "status", {"status": "RUNNING", "step": 0})
    # Attempt 1 reports steps 1..10 (its best loss, 0.05, at step 9), checkpointed at step 6, then dies.
    _post(api, run_id, token, "metrics", _batch(range(1, 11), lambda s: 0.05 if s == 9 else 1.0 / s))
    token = resume(api, fake_jobs, run_id, token)
    running = _post(api, run_id, token, "status", {"status": "RUNNING", "step": 6})
    assert running.status_code == 200 and running.json()["attempt"] == 2
    _post(api, run_id, token, "metrics", _batch(range(7, 13), lambda s: 2.0 / s, session="a2"))

    points = api.get(f"{API}/runs/{run_id}/metrics").json()["data"]
    assert [p["step"] for p in points] == list(range(1, 13))  # one value per step, in order
    assert [p["attempt"] for p in points] == [1] * 6 + [2] * 6
    assert points[-1]["value"] == pytest.approx(2.0 / 12)
    every = api.get(f"{API}/runs/{run_id}/metrics", params={"all_attempts": "true"}).json()["data"]
    superseded = [(p["step"], p["attempt"]) for p in every if p["superseded"]]
    assert superseded == [(s, 1) for s in range(7, 11)]  # kept for audit
    view = api.get(f"{API}/runs/{run_id}").json()
    assert view["summary"]["train/loss"] == pytest.approx(2.0 / 12)
    assert view["best"]["train/loss"] == pytest.approx(2.0 / 12)  # the superseded 0.05 no longer counts
    with api.app.state.repo.db.read() as session:
        best = session.execute(select(RunBest.min_value).where(RunBest.run_id == run_id,
                                                               RunBest.key == "train/loss")).scalar_one()
    assert best == pytest.approx(2.0 / 12)
    assert any("4 point(s)" in (message or "") for _, _, message in _events(api, run_id))


@pytest.mark.parametrize("resume", [_restart_in_job, _manual_resume, _requeue_by_service],
                         ids=["worker_restart", "manual_resume", "requeue_by_service"])
def test_an_evaluation_a_resumed_attempt_repeats_at_its_checkpoint_step_is_read_once(api, fake_jobs, example_body,
                                                                                      resume):
    """An epoch's checkpoint is committed before its evaluation: the attempt resumed from it
    evaluates that step again, and its value is the one read."""
    run_id, token = _start(api, fake_jobs, example_body)
    _post(api, run_id, token, "status", {"status": "RUNNING", "step": 0})
    _post(api, run_id, token, "metrics", _batch(range(1, 7), lambda s: 1.0 / s))
    _post(api, run_id, token, "metrics", _batch([3, 6], lambda s: 0.3 * s, batch=2, key="eval/accuracy"))
    _post(api, run_id, token, "metrics", _batch([7, 8], lambda s: 1.0 / s, batch=3))  # checkpointed at 6, then dies
    token = resume(api, fake_jobs, run_id, token)
    _post(api, run_id, token, "status", {"status": "RUNNING", "step": 6})
    _post(api, run_id, token, "metrics", _batch([6], lambda s: 0.95, session="a2", key="eval/accuracy"))

    points = api.get(f"{API}/runs/{run_id}/metrics").json()["data"]
    accuracy = [(p["step"], p["value"], p["attempt"]) for p in points if p["key"] == "eval/accuracy"]
    assert accuracy == [(3, pytest.approx(0.9), 1), (6, 0.95, 2)]
    assert [p["step"] for p in points if p["key"] == "train/loss"] == list(range(1, 7))  # 6: attempt 1's
    view = api.get(f"{API}/runs/{run_id}").json()
    assert view["summary"]["eval/accuracy"] == 0.95
    assert view["best"]["eval/accuracy"] == 0.95  # attempt 1's 1.8 at step 6 no longer counts
    every = api.get(f"{API}/runs/{run_id}/metrics", params={"all_attempts": "true"}).json()["data"]
    assert [(p["key"], p["step"], p["attempt"]) for p in every if p["superseded"]] == [
        ("eval/accuracy", 6, 1), ("train/loss", 7, 1), ("train/loss", 8, 1)]  # in report order


def test_a_missing_final_checkpoint_is_an_event_and_a_field_of_the_run(api, fake_jobs, example_body):
    run_id, token = _start(api, fake_jobs, example_body)
    _post(api, run_id, token, "status", {"status": "RUNNING", "step": 0})
    note = _post(api, run_id, token, "note", {"message": "old checkpoints could not be deleted: PermissionError"})
    assert note.status_code == 200
    done = _post(api, run_id, token, "status", {"status": "COMPLETED", "final_checkpoint": "missing"})
    assert done.status_code == 200 and done.json()["final_checkpoint"] == "missing"
    messages = [m for _, _, m in _events(api, run_id)]
    assert "old checkpoints could not be deleted: PermissionError" in messages
    assert any(m and m.startswith("final checkpoint missing") for m in messages)
    assert api.get(f"{API}/runs/{run_id}").json()["final_checkpoint"] == "missing"
    bad = _post(api, run_id, token, "status", {"status": "COMPLETED", "final_checkpoint": "lost"})
    assert bad.status_code == 422 and "final_checkpoint" in bad.text


def test_a_note_needs_the_runs_own_token(api, fake_jobs, example_body):
    run_id, _ = _start(api, fake_jobs, example_body)
    _, other_token = _start(api, fake_jobs, example_body)
    assert _post(api, run_id, other_token, "note", {"message": "x"}).status_code == 401


def _submitted_ago(api, run_id, ago: timedelta) -> datetime:
    """Backdate the current attempt's submission, its start until its RUNNING says when training
    began, to ``ago`` before now."""
    submitted = datetime.now(timezone.utc).replace(microsecond=0) - ago
    with api.app.state.repo.engine.begin() as conn:
        conn.execute(update(Run).where(Run.id == run_id).values(attempt_started_at=submitted))
    return submitted


def _time(answer, field: str) -> datetime | None:
    value = answer.json()[field]
    return None if value is None else datetime.fromisoformat(value)


def _status(api, run_id, token, status: str, **times: datetime):
    answer = _post(api, run_id, token, "status", {"status": status, **({"error": "x"} if status == "FAILED" else {}),
                                                  **{name: when.isoformat() for name, when in times.items()}})
    assert answer.status_code == 200, answer.text
    return answer


@pytest.mark.parametrize("end", [{"status": "COMPLETED", "message": "eval/accuracy=0.9"},
                                 {"status": "FAILED", "error": "ValueError: boom"}])
def test_an_end_reported_after_an_outage_finishes_the_run_when_the_worker_ended(api, fake_jobs, example_body, end):
    run_id, token = _start(api, fake_jobs, example_body)
    started = _submitted_ago(api, run_id, timedelta(hours=1)) + timedelta(minutes=1)
    _status(api, run_id, token, "RUNNING", started_at=started)
    ended = started + timedelta(minutes=40)  # then 20 minutes of outage before the report got through
    in_paris = ended.astimezone(timezone(timedelta(hours=1)))  # a worker whose clock reads another zone
    done = _post(api, run_id, token, "status", {**end, "ended_at": in_paris.isoformat()})
    assert done.status_code == 200, done.text
    finished = datetime.fromisoformat(done.json()["finished_at"])
    assert finished == ended and finished.utcoffset() == timedelta(0)  # in UTC, as a later GET reads it
    assert api.get(f"{API}/runs/{run_id}").json()["finished_at"] == done.json()["finished_at"]
    event = api.get(f"{API}/runs/{run_id}/events").json()["data"][-1]
    assert datetime.fromisoformat(event["time"]) > ended + timedelta(minutes=19)  # the event: when it was learned


def test_a_running_spooled_through_an_outage_with_the_end_keeps_when_training_began(api, fake_jobs, example_body):
    # The service was down from before training began until after it ended: rank 0's RUNNING and
    # the launcher's COMPLETED both arrive now. The run trained for 40 minutes, not for no time.
    run_id, token = _start(api, fake_jobs, example_body)
    submitted = _submitted_ago(api, run_id, timedelta(hours=1))
    started, ended = submitted + timedelta(minutes=2), submitted + timedelta(minutes=42)
    running = _status(api, run_id, token, "RUNNING", started_at=started.astimezone(timezone(timedelta(hours=-5))))
    assert _time(running, "started_at") == _time(running, "attempt_started_at") == started
    assert _time(running, "started_at").utcoffset() == timedelta(0)
    done = _status(api, run_id, token, "COMPLETED", ended_at=ended)
    assert (_time(done, "started_at"), _time(done, "finished_at")) == (started, ended)
    running_event = api.get(f"{API}/runs/{run_id}/events").json()["data"][-2]
    assert running_event["to_status"] == "RUNNING"
    assert datetime.fromisoformat(running_event["time"]) > ended  # the event: when it was learned


def test_a_reported_start_outside_the_attempt_is_kept_within_its_submission_and_now(api, fake_jobs, example_body):
    behind_id, behind_token = _start(api, fake_jobs, example_body)
    submitted = _submitted_ago(api, behind_id, timedelta(hours=1))
    behind = _status(api, behind_id, behind_token, "RUNNING", started_at=datetime(2000, 1, 1, tzinfo=timezone.utc))
    assert _time(behind, "started_at") == _time(behind, "attempt_started_at") == submitted  # not before it

    # A clock ahead, and a worker that does not say (older than the field): when the report came.
    for reported in ({"started_at": datetime(2999, 1, 1, tzinfo=timezone.utc)}, {}):
        run_id, token = _start(api, fake_jobs, example_body)
        _submitted_ago(api, run_id, timedelta(hours=1))
        before = datetime.now(timezone.utc)
        running = _status(api, run_id, token, "RUNNING", **reported)
        started = _time(running, "started_at")
        assert before <= started <= datetime.now(timezone.utc) and _time(running, "attempt_started_at") == started


def test_a_lost_running_leaves_the_attempt_started_when_it_was_submitted(api, fake_jobs, example_body):
    # Its RUNNING never arrived: training began at some time after the submission, the latest
    # time the service knows before it; the end's arrival would make a 30-minute run last 0 s.
    run_id, token = _start(api, fake_jobs, example_body)
    submitted = _submitted_ago(api, run_id, timedelta(hours=1))
    ended = submitted + timedelta(minutes=30)
    done = _status(api, run_id, token, "COMPLETED", ended_at=ended)
    assert (_time(done, "started_at"), _time(done, "attempt_started_at"), _time(done, "finished_at")) == (
        submitted, submitted, ended)


def test_a_resumed_runs_end_is_kept_after_its_current_attempt_began(api, fake_jobs, example_body):
    # A worker whose clock is behind reports an end before the attempt it ended even began: it is
    # kept at that attempt's start, not at the run's first start hours before.
    run_id, token = _start(api, fake_jobs, example_body)
    first = _submitted_ago(api, run_id, timedelta(hours=5)) + timedelta(minutes=1)
    _status(api, run_id, token, "RUNNING", started_at=first)
    _status(api, run_id, token, "FAILED", ended_at=first + timedelta(minutes=10))
    resumed = api.post(f"{API}/runs/{run_id}/resume")
    assert (resumed.json()["attempt"], _time(resumed, "attempt_started_at")) == (2, None)  # QUEUED: not begun

    api.app.state.dispatcher.tick()
    submitted = _submitted_ago(api, run_id, timedelta(hours=3))
    # It fails before training (no RUNNING), by a clock that puts the end before its submission.
    failed = _status(api, run_id, _token(fake_jobs, run_id, 2), "FAILED", ended_at=submitted - timedelta(hours=1))
    assert (_time(failed, "started_at"), _time(failed, "finished_at")) == (first, submitted)

    api.post(f"{API}/runs/{run_id}/resume")
    api.app.state.dispatcher.tick()
    third = _submitted_ago(api, run_id, timedelta(hours=1)) + timedelta(minutes=1)
    token = _token(fake_jobs, run_id, 3)
    running = _status(api, run_id, token, "RUNNING", started_at=third)
    assert (_time(running, "started_at"), _time(running, "attempt_started_at")) == (first, third)
    done = _status(api, run_id, token, "COMPLETED", ended_at=third - timedelta(minutes=30))
    assert _time(done, "finished_at") == third


def test_a_restarted_worker_group_begins_its_attempt_when_its_running_says(api, fake_jobs, example_body):
    run_id, token = _start(api, fake_jobs, example_body)
    first = _submitted_ago(api, run_id, timedelta(hours=1)) + timedelta(minutes=1)
    _status(api, run_id, token, "RUNNING", started_at=first)
    restarting = _status(api, run_id, token, "RESTARTING")
    # Attempt 2 has not said when it began: no earlier than attempt 1, whenever the report arrived.
    assert (restarting.json()["attempt"], _time(restarting, "attempt_started_at")) == (2, first)
    second = first + timedelta(minutes=30)
    running = _status(api, run_id, token, "RUNNING", started_at=second)
    assert (_time(running, "started_at"), _time(running, "attempt_started_at")) == (first, second)
    done = _status(api, run_id, token, "COMPLETED", ended_at=second - timedelta(minutes=10))
    assert _time(done, "finished_at") == second


def test_a_reported_end_outside_the_run_is_kept_within_its_start_and_now(api, fake_jobs, example_body):
    run_id, token = _start(api, fake_jobs, example_body)
    started = _submitted_ago(api, run_id, timedelta(hours=1))
    _status(api, run_id, token, "RUNNING", started_at=started)
    early = _post(api, run_id, token, "status", {"status": "COMPLETED", "ended_at": "2000-01-01T00:00:00Z"})
    assert datetime.fromisoformat(early.json()["finished_at"]) == started  # a clock behind: not before the start

    ahead_id, ahead_token = _start(api, fake_jobs, example_body)
    _post(api, ahead_id, ahead_token, "status", {"status": "RUNNING", "step": 0})
    before = datetime.now(timezone.utc)
    ahead = _post(api, ahead_id, ahead_token, "status", {"status": "FAILED", "error": "x",
                                                         "ended_at": "2999-01-01T00:00:00+02:00"})
    finished = datetime.fromisoformat(ahead.json()["finished_at"])
    assert before <= finished <= datetime.now(timezone.utc)  # a clock ahead: not after the report came

    old_id, old_token = _start(api, fake_jobs, example_body)  # a worker that does not say: when it came
    _status(api, old_id, old_token, "RUNNING", started_at=_submitted_ago(api, old_id, timedelta(hours=1)))
    before = datetime.now(timezone.utc)
    old = _post(api, old_id, old_token, "status", {"status": "COMPLETED"})
    assert before <= datetime.fromisoformat(old.json()["finished_at"]) <= datetime.now(timezone.utc)
