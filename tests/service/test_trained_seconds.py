"""How long a run trained (``RunView.trained_seconds`` and ``training_since``), on SQLite and
PostgreSQL, along every path that ends an attempt: a worker's end (late, after an outage), a job
the dispatcher finds lost, a resume, a worker-group restart, a cancel, an attempt that ended before
it trained, a trial its sweep's driver restarts and stops. The time queued or starting between
attempts is left out; the wall-clock span (``started_at`` to ``finished_at``) still counts it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import update

from api.views import RunStatus, RunView, SweepStatus
from service.db.models import Run
from service.ray_client import RayAmbiguous
from service.sweep_repository import SweepRepository
from tests.service.test_outage_reports import _post, _start, _status, _submitted_ago, _time, _token, api  # noqa: F401

API = "/api/v1"
MINUTE = timedelta(minutes=1)


def _set(api, run_id: str, **columns) -> None:
    """Write the run's columns as they would read had the run lived through earlier times."""
    with api.app.state.repo.engine.begin() as conn:
        conn.execute(update(Run).where(Run.id == run_id).values(**columns))


def _view(api, run_id: str) -> RunView:
    answer = api.get(f"{API}/runs/{run_id}")
    assert answer.status_code == 200, answer.text
    return RunView.model_validate(answer.json())


def _training(answer) -> tuple[float, datetime | None]:
    return answer.json()["trained_seconds"], _time(answer, "training_since")


def test_one_attempt_trains_from_its_start_to_its_end_its_span_also_after_an_outage(api, fake_jobs, example_body):
    run_id, token = _start(api, fake_jobs, example_body)
    assert _training(api.get(f"{API}/runs/{run_id}")) == (0.0, None)  # starting: not training yet
    started = _submitted_ago(api, run_id, timedelta(hours=2)) + MINUTE
    running = _status(api, run_id, token, "RUNNING", started_at=started)
    assert _training(running) == (0.0, started)
    assert RunView.model_validate(running.json()).trained_seconds_at(started + 10 * MINUTE) == 600
    # It ended 40 minutes in; the report waited out an outage of 80 minutes, which is not training.
    done = _status(api, run_id, token, "COMPLETED", ended_at=started + 40 * MINUTE)
    assert _training(done) == (2400.0, None)
    view = RunView.model_validate(done.json())
    assert view.trained_seconds_at() == view.span_seconds_at() == 2400


def test_a_lost_job_ends_its_attempt_when_the_service_last_heard_of_the_run_and_the_queue_wait_is_left_out(
        api, fake_jobs, example_body):
    run_id, token = _start(api, fake_jobs, example_body)
    first = _submitted_ago(api, run_id, timedelta(hours=3)) + MINUTE
    _status(api, run_id, token, "RUNNING", started_at=first)
    # Its last report came an hour in; then the service and the Ray head went down together, and the
    # job was found lost when the service came back, two hours later.
    _set(api, run_id, updated_at=first + 60 * MINUTE)
    fake_jobs.forget(f"run-{run_id}-attempt-1")
    api.app.state.dispatcher.tick()
    requeued = api.get(f"{API}/runs/{run_id}")
    assert (requeued.json()["status"], requeued.json()["attempt"]) == ("QUEUED", 2)
    assert _training(requeued) == (3600.0, None)

    api.app.state.dispatcher.tick()  # attempt 2 submitted: starting, not training
    assert _training(api.get(f"{API}/runs/{run_id}")) == (3600.0, None)
    second = _submitted_ago(api, run_id, 20 * MINUTE) + MINUTE
    token = _token(fake_jobs, run_id, 2)
    assert _training(_status(api, run_id, token, "RUNNING", started_at=second)) == (3600.0, second)
    done = _status(api, run_id, token, "COMPLETED", ended_at=second + 15 * MINUTE)
    assert _training(done) == (3600.0 + 900.0, None)
    view = RunView.model_validate(done.json())
    assert view.span_seconds_at() == (second + 15 * MINUTE - first).total_seconds() > view.trained_seconds


def test_a_users_edit_is_not_news_of_a_lost_job_but_its_workers_checkpoint_is(api, fake_jobs, example_body):
    """When the service last heard of a run is when its job last reported: a tag or notes edit
    while its job is lost says nothing of the job, so it does not lengthen the attempt."""
    run_id, token = _start(api, fake_jobs, example_body)
    first = _submitted_ago(api, run_id, timedelta(hours=3)) + MINUTE
    _status(api, run_id, token, "RUNNING", started_at=first)
    _set(api, run_id, updated_at=first + 60 * MINUTE)
    edited = api.patch(f"{API}/runs/{run_id}", json={"tags": ["lost"], "notes": "where did it go?"})
    assert edited.status_code == 200, edited.text
    fake_jobs.forget(f"run-{run_id}-attempt-1")
    api.app.state.dispatcher.tick()
    assert _training(api.get(f"{API}/runs/{run_id}")) == (3600.0, None)

    second_id, second_token = _start(api, fake_jobs, example_body)
    started = _submitted_ago(api, second_id, timedelta(hours=3)) + MINUTE
    _status(api, second_id, second_token, "RUNNING", started_at=started)
    _set(api, second_id, updated_at=started + 60 * MINUTE)
    checkpoint = {"url": "file:///tmp/ckpt/step-4", "step": 4, "epoch": 0, "committed": True, "world_size": 1,
                  "time": datetime.now(timezone.utc).isoformat()}
    assert _post(api, second_id, second_token, "checkpoint", checkpoint).status_code < 300
    fake_jobs.forget(f"run-{second_id}-attempt-1")
    api.app.state.dispatcher.tick()
    assert _training(api.get(f"{API}/runs/{second_id}"))[0] > 2 * 3600  # heard of just now


def test_a_failed_attempt_counts_to_its_reported_end_and_a_resume_adds_nothing_until_the_next_one_trains(
        api, fake_jobs, example_body):
    run_id, token = _start(api, fake_jobs, example_body)
    first = _submitted_ago(api, run_id, timedelta(hours=5)) + MINUTE
    _status(api, run_id, token, "RUNNING", started_at=first)
    failed = _status(api, run_id, token, "FAILED", ended_at=first + 20 * MINUTE)
    assert _training(failed) == (1200.0, None)
    resumed = api.post(f"{API}/runs/{run_id}/resume")
    assert resumed.status_code == 200 and _training(resumed) == (1200.0, None)
    api.app.state.dispatcher.tick()
    assert _view(api, run_id).trained_seconds_at() == 1200  # starting: the clock does not run
    second = _submitted_ago(api, run_id, 30 * MINUTE) + MINUTE
    token = _token(fake_jobs, run_id, 2)
    _status(api, run_id, token, "RUNNING", started_at=second)
    assert _training(_status(api, run_id, token, "COMPLETED", ended_at=second + 10 * MINUTE)) == (1800.0, None)


def test_a_worker_group_restart_inside_the_job_counts_as_training(api, fake_jobs, example_body):
    run_id, token = _start(api, fake_jobs, example_body)
    first = _submitted_ago(api, run_id, timedelta(hours=1)) + MINUTE
    _status(api, run_id, token, "RUNNING", started_at=first)
    restarting = _status(api, run_id, token, "RESTARTING")
    assert restarting.json()["attempt"] == 2 and _training(restarting) == (0.0, first)  # the job still trains
    second = first + 30 * MINUTE
    # The old group's attempt ends where the new group's begins: its training and the restart's delay.
    assert _training(_status(api, run_id, token, "RUNNING", started_at=second)) == (1800.0, second)
    assert _training(_status(api, run_id, token, "COMPLETED", ended_at=second + 10 * MINUTE)) == (2400.0, None)


def test_a_restart_whose_running_was_lost_trains_on_from_the_previous_groups_start(api, fake_jobs, example_body):
    run_id, token = _start(api, fake_jobs, example_body)
    first = _submitted_ago(api, run_id, timedelta(hours=1)) + MINUTE
    _status(api, run_id, token, "RUNNING", started_at=first)
    _status(api, run_id, token, "RESTARTING")
    # The restarted group's RUNNING never came: the service fills it in at the previous group's start.
    done = _status(api, run_id, token, "COMPLETED", ended_at=first + 45 * MINUTE)
    assert _training(done) == (2700.0, None)


def test_a_canceled_run_trains_until_its_job_stops_and_one_canceled_while_starting_trained_no_time(
        api, fake_jobs, example_body):
    run_id, token = _start(api, fake_jobs, example_body)
    started = _submitted_ago(api, run_id, timedelta(hours=1)) + MINUTE
    _status(api, run_id, token, "RUNNING", started_at=started)
    canceling = api.post(f"{API}/runs/{run_id}/cancel")
    assert canceling.json()["status"] == "CANCELING" and _training(canceling) == (0.0, started)  # still training
    early_id, _ = _start(api, fake_jobs, example_body)
    assert _training(api.post(f"{API}/runs/{early_id}/cancel")) == (0.0, None)

    api.app.state.dispatcher.tick()  # both jobs are stopped: CANCELED
    canceled = api.get(f"{API}/runs/{run_id}")
    assert canceled.json()["status"] == "CANCELED"
    assert _training(canceled) == ((_time(canceled, "finished_at") - started).total_seconds(), None)
    early = api.get(f"{API}/runs/{early_id}")
    assert early.json()["status"] == "CANCELED" and _training(early) == (0.0, None)


def test_a_canceled_run_whose_job_was_lost_ends_when_the_service_last_heard_of_it(api, fake_jobs, example_body):
    """Its job went with the service's Ray head; the service came back hours later and found the cancel
    done. Nobody saw the attempt end: it trained, and ended, until the service last heard of it."""
    run_id, token = _start(api, fake_jobs, example_body)
    started = _submitted_ago(api, run_id, timedelta(hours=3)) + MINUTE
    _status(api, run_id, token, "RUNNING", started_at=started)
    assert api.post(f"{API}/runs/{run_id}/cancel").json()["status"] == "CANCELING"
    _set(api, run_id, updated_at=started + 30 * MINUTE)
    fake_jobs.forget(f"run-{run_id}-attempt-1")
    api.app.state.dispatcher.tick()
    canceled = api.get(f"{API}/runs/{run_id}")
    assert canceled.json()["status"] == "CANCELED"
    assert _time(canceled, "finished_at") == started + 30 * MINUTE
    assert _training(canceled) == (1800.0, None)


@pytest.mark.parametrize("state", ["FAILED", "STOPPED", "SUCCEEDED"])
def test_a_job_that_ended_unreported_ends_its_run_when_ray_saw_it_end(api, fake_jobs, example_body, state):
    """Its driver died (or was stopped outside Tessera) 25 minutes in, with no report, while the
    service was down; the service learned of it an hour later. It trained, and ended, until Ray
    saw its job end."""
    run_id, token = _start(api, fake_jobs, example_body)
    started = _submitted_ago(api, run_id, timedelta(hours=2)) + MINUTE
    _status(api, run_id, token, "RUNNING", started_at=started)
    fake_jobs.set_status(f"run-{run_id}-attempt-1", state, ended_at=started + 25 * MINUTE)
    api.app.state.dispatcher.tick()
    failed = api.get(f"{API}/runs/{run_id}")
    assert failed.json()["status"] == "FAILED"
    assert _time(failed, "finished_at") == started + 25 * MINUTE
    assert _training(failed) == (1500.0, None)


def test_a_job_whose_end_ray_cannot_say_ends_its_run_when_the_service_learned_of_it(api, fake_jobs, example_body):
    def unanswered(submission_id):
        raise RayAmbiguous(f"Ray answered GET /api/jobs/{submission_id} with 503")

    run_id, token = _start(api, fake_jobs, example_body)
    started = _submitted_ago(api, run_id, timedelta(hours=1)) + MINUTE
    _status(api, run_id, token, "RUNNING", started_at=started)
    fake_jobs.set_status(f"run-{run_id}-attempt-1", "FAILED", ended_at=started + MINUTE)
    fake_jobs.ended_at = unanswered
    before = datetime.now(timezone.utc)
    api.app.state.dispatcher.tick()
    failed = api.get(f"{API}/runs/{run_id}")
    assert failed.json()["status"] == "FAILED"  # the end is not held back for want of its time
    assert before - timedelta(seconds=1) <= _time(failed, "finished_at") <= datetime.now(timezone.utc)


def test_an_ended_run_that_an_older_service_left_training_does_not_count_on(api, fake_jobs, example_body):
    """A replica older than the fields (serving through the upgrade, or a rollback) ends runs without
    clearing ``training_since``: an ended run's view leaves it out, so no client adds now to it."""
    run_id, token = _start(api, fake_jobs, example_body)
    started = _submitted_ago(api, run_id, timedelta(hours=1)) + MINUTE
    _status(api, run_id, token, "RUNNING", started_at=started)
    _status(api, run_id, token, "COMPLETED", ended_at=started + 10 * MINUTE)
    _set(api, run_id, training_since=started)
    assert _training(api.get(f"{API}/runs/{run_id}")) == (600.0, None)


def test_an_attempt_that_ends_before_it_trains_counts_no_time(api, fake_jobs, example_body):
    failed_id, failed_token = _start(api, fake_jobs, example_body)
    _submitted_ago(api, failed_id, timedelta(hours=1))
    assert _training(_status(api, failed_id, failed_token, "FAILED")) == (0.0, None)

    lost_id, _ = _start(api, fake_jobs, example_body)
    _submitted_ago(api, lost_id, timedelta(hours=1))
    fake_jobs.forget(f"run-{lost_id}-attempt-1")
    api.app.state.dispatcher.tick()
    lost = api.get(f"{API}/runs/{lost_id}")
    assert lost.json()["status"] == "QUEUED" and _training(lost) == (0.0, None)


def test_an_end_after_a_lost_running_trains_from_the_submission_as_the_span_does(api, fake_jobs, example_body):
    run_id, token = _start(api, fake_jobs, example_body)
    submitted = _submitted_ago(api, run_id, timedelta(hours=1))
    done = _status(api, run_id, token, "COMPLETED", ended_at=submitted + 30 * MINUTE)
    assert _training(done) == (1800.0, None)
    assert RunView.model_validate(done.json()).span_seconds_at() == 1800


def test_a_trial_its_driver_restarts_ends_its_attempt_when_last_heard_of(repo, example_body, example_spec):
    from api.sweeps import SweepSpec

    sweeps = SweepRepository(repo)
    sweep = sweeps.create_sweep(SweepSpec.model_validate({
        "name": "s", "base": example_body, "search": {"algorithms": {"sets": [[]]}}}))
    sweeps.begin_attempt(sweep.id, token="driver")
    sweeps.transition(sweep.id, SweepStatus.RUNNING)
    trial = sweeps.register_trial(sweep.id, trial_id="t", spec=example_spec, params={}, token="r1")
    assert (trial.trained_seconds, trial.training_since) == (0.0, None)
    started = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=2)
    with repo.engine.begin() as conn:  # submitted two hours ago
        conn.execute(update(Run).where(Run.id == trial.id).values(attempt_started_at=started))
    repo.apply_worker_report(trial.id, RunStatus.RUNNING, started_at=started)
    with repo.engine.begin() as conn:  # last heard of 20 minutes in
        conn.execute(update(Run).where(Run.id == trial.id).values(updated_at=started + 20 * MINUTE))
    again = sweeps.register_trial(sweep.id, trial_id="t", spec=example_spec, params={}, token="r2")
    assert (again.status, again.attempt, again.trained_seconds, again.training_since) == (
        RunStatus.STARTING, 2, 1200.0, None)
    began = repo.apply_worker_report(trial.id, RunStatus.RUNNING).attempt_started_at
    stopped = sweeps.end_trial(sweep.id, "t", outcome="stopped")
    assert stopped.status is RunStatus.STOPPED and stopped.training_since is None
    assert stopped.trained_seconds == 1200 + (stopped.finished_at - began).total_seconds()


def test_a_new_run_has_trained_for_no_time_and_the_schema_says_what_the_fields_mean(api, example_body):
    created = api.post(f"{API}/runs", json=example_body)
    assert _training(created) == (0.0, None)
    assert RunView.model_validate(created.json()).trained_seconds_at() == 0.0
    schema = api.get(f"{API}/openapi.json").json()["components"]["schemas"]["RunView"]["properties"]
    assert "queued or starting between attempts is left out" in schema["trained_seconds"]["description"]
    assert "trained_seconds + (now - training_since)" in schema["training_since"]["description"]


def test_the_views_clocks_add_the_attempt_training_now_and_say_none_when_not_known():
    now = datetime(2026, 12, 8, 12, tzinfo=timezone.utc)
    base = {"id": "r", "name": "n", "status": "RUNNING", "attempt": 2, "spec": {},
            "created_at": now - timedelta(hours=3)}
    running = RunView.model_validate({**base, "started_at": now - timedelta(hours=2), "trained_seconds": 600.0,
                                      "training_since": now - 5 * MINUTE})
    assert (running.trained_seconds_at(now), running.span_seconds_at(now)) == (900.0, 7200.0)
    older_service = RunView.model_validate(base)  # neither field, nor a start
    assert (older_service.trained_seconds_at(now), older_service.span_seconds_at(now)) == (None, None)
    ahead = running.model_copy(update={"training_since": now + MINUTE})  # a clock ahead of this one: no time yet
    assert ahead.trained_seconds_at(now) == 600.0
