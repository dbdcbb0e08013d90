"""Sweep driver jobs against the fake Ray Jobs API: submit per attempt, restart a lost driver a
bounded number of times, cancel by stopping the job; the run dispatcher leaves trials alone."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, update

from api.sweeps import SweepSpec
from api.views import RunStatus, SweepStatus
from tests.conftest import ADMIN_HEADERS
from service.db.models import Run, Sweep, aware
from service.dispatcher import Dispatcher
from service.job_follower import JobFollower
from service.job_kinds import DRIVER_ENDED_WITHOUT_RESULT, sweep_driver_jobs

S, SS = RunStatus, SweepStatus


def reconcile_sweeps(sweeps, jobs, settings):
    """The sweeps' half of ``Dispatcher.reconcile``, the app's startup reconcile."""
    return JobFollower(sweep_driver_jobs(settings), sweeps, jobs, settings).reconcile()


@pytest.fixture
def dispatcher(sqlite_repo, fake_jobs, settings) -> Dispatcher:
    return Dispatcher(sqlite_repo, fake_jobs, settings)


@pytest.fixture
def sweep_spec(example_body) -> SweepSpec:
    return SweepSpec.model_validate({"name": "digits-sweep", "base": example_body,
                                     "search": {"algorithms": {"sets": [[], ["channels_last"]]}}})


def _submitted(dispatcher, sweep_spec):
    sweep = dispatcher.sweeps.create_sweep(sweep_spec)
    dispatcher.tick()
    job_id = f"sweep-{sweep.id}-attempt-1"
    dispatcher.jobs.set_status(job_id, "RUNNING")
    return dispatcher.sweeps.get_sweep(sweep.id), job_id


def _trial(dispatcher, sweep, trial_id, example_spec, token="driver"):
    run = dispatcher.sweeps.register_trial(sweep.id, trial_id=trial_id, spec=example_spec, params={}, token=trial_id)
    return dispatcher.repo.transition(run.id, S.RUNNING)


def test_a_queued_sweep_is_submitted_once_as_its_driver_job_with_entrypoint_and_env(dispatcher, sweep_spec,
                                                                                   monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.delenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", raising=False)
    monkeypatch.setenv("TESSERA_DATABASE_URL", "postgresql://user:secret@db/tessera")
    sweep = dispatcher.sweeps.create_sweep(sweep_spec)
    dispatcher.tick()
    dispatcher.tick()
    job_id = f"sweep-{sweep.id}-attempt-1"
    assert dispatcher.jobs.submit_calls == [job_id]
    job = dispatcher.jobs.jobs[job_id]
    assert job["entrypoint"] == f"/opt/venv/bin/python -m workers.fork_exec workers.tune --sweep-id {sweep.id}"
    env = job["env"]
    assert {k: env[k] for k in ("TESSERA_SERVICE_URL", "TESSERA_SWEEP_ID", "TESSERA_ATTEMPT", "TESSERA_STORAGE_URL",
                                "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "AWS_ENDPOINT_URL")} == {
        "TESSERA_SERVICE_URL": "http://tessera.test:8000", "TESSERA_SWEEP_ID": sweep.id, "TESSERA_ATTEMPT": "1",
        "TESSERA_STORAGE_URL": "file:///tmp/tessera-test-storage", "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "30",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}
    assert "TESSERA_DATABASE_URL" not in env and "TESSERA_RUN_TOKEN" not in env
    assert dispatcher.sweeps.check_token(sweep.id, env["TESSERA_SWEEP_TOKEN"])
    started = dispatcher.sweeps.get_sweep(sweep.id)
    assert (started.status, started.ray_job_id) == (SS.STARTING, job_id)


def test_a_worker_group_timeout_set_for_the_service_is_forwarded_as_is(dispatcher, sweep_spec, monkeypatch):
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "5")
    sweep = dispatcher.sweeps.create_sweep(sweep_spec)
    dispatcher.tick()
    assert dispatcher.jobs.jobs[f"sweep-{sweep.id}-attempt-1"]["env"]["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] == "5"


def test_external_sweeps_are_never_submitted(dispatcher, sweep_spec):
    dispatcher.sweeps.create_sweep(sweep_spec, driver="external", token="t")
    dispatcher.tick()
    dispatcher.tick()
    assert dispatcher.jobs.submit_calls == []


def test_a_refused_submission_fails_the_sweep_with_ray_s_reason(dispatcher, sweep_spec):
    sweep = dispatcher.sweeps.create_sweep(sweep_spec)
    dispatcher.jobs.fail_submit = RuntimeError("Request failed with status code 400: bad runtime_env")
    dispatcher.tick()
    failed = dispatcher.sweeps.get_sweep(sweep.id)
    assert failed.status is SS.FAILED and "bad runtime_env" in failed.error


@pytest.mark.parametrize("lost", ["forget", "FAILED", "STOPPED"])
def test_a_lost_driver_is_requeued_up_to_the_limit_and_then_the_sweep_fails(dispatcher, sweep_spec, lost):
    assert dispatcher.settings.sweep_driver_restarts == 2
    sweep, job_id = _submitted(dispatcher, sweep_spec)
    for attempt in (1, 2, 3):
        job_id = f"sweep-{sweep.id}-attempt-{attempt}"
        assert dispatcher.jobs.submit_calls[-1] == job_id
        dispatcher.jobs.logs[job_id] = f"attempt {attempt} log\nKilledError: node died"
        if lost == "forget":
            dispatcher.jobs.forget(job_id)
        else:
            dispatcher.jobs.set_status(job_id, lost)
        dispatcher.tick()  # sync: re-queue (or give up on the last attempt)
        dispatcher.tick()  # submit the next attempt
    failed = dispatcher.sweeps.get_sweep(sweep.id)
    assert (failed.status, failed.attempt) == (SS.FAILED, 3)
    assert "sweep_driver_restarts=2" in failed.error
    if lost != "forget":
        assert failed.error.endswith("attempt 3 log\nKilledError: node died")
    assert len(dispatcher.jobs.submit_calls) == 3


def test_a_restarted_driver_gets_a_new_token_and_its_trials_go_on_as_new_attempts(dispatcher, sweep_spec,
                                                                                  example_spec):
    sweep, job_id = _submitted(dispatcher, sweep_spec)
    old_token = dispatcher.jobs.jobs[job_id]["env"]["TESSERA_SWEEP_TOKEN"]
    trial = _trial(dispatcher, sweep, "t1", example_spec)
    dispatcher.jobs.forget(job_id)
    dispatcher.tick()
    dispatcher.tick()
    new_env = dispatcher.jobs.jobs[f"sweep-{sweep.id}-attempt-2"]["env"]
    assert new_env["TESSERA_ATTEMPT"] == "2" and not dispatcher.sweeps.check_token(sweep.id, old_token)
    assert dispatcher.repo.get_run(trial.id).status is S.RUNNING  # untouched until the new driver re-registers it
    again = dispatcher.sweeps.register_trial(sweep.id, trial_id="t1", spec=example_spec, params={}, token="t1b")
    assert (again.id, again.attempt, again.ray_job_id) == (trial.id, 2, f"sweep-{sweep.id}-attempt-2")


def test_a_driver_job_that_succeeds_without_reporting_fails_the_sweep(dispatcher, sweep_spec):
    sweep, job_id = _submitted(dispatcher, sweep_spec)
    dispatcher.jobs.set_status(job_id, "SUCCEEDED")
    dispatcher.tick()
    failed = dispatcher.sweeps.get_sweep(sweep.id)
    assert (failed.status, failed.error) == (SS.FAILED, DRIVER_ENDED_WITHOUT_RESULT)


def test_a_driver_job_that_ended_unreported_ends_the_sweep_and_its_trials_when_ray_saw_it_end(
        dispatcher, sweep_spec, example_spec):
    """The driver's job ended ten minutes into a trial, and the service learned of it an hour
    later (it was down): the sweep, and the trial it was running, ended when Ray saw the job end."""
    sweep, job_id = _submitted(dispatcher, sweep_spec)
    dispatcher.sweeps.apply_driver_report(sweep.id, SS.RUNNING)
    trial = _trial(dispatcher, sweep, "t1", example_spec)
    began = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    with dispatcher.repo.engine.begin() as conn:
        conn.execute(update(Sweep).where(Sweep.id == sweep.id).values(started_at=began - timedelta(minutes=1)))
        conn.execute(update(Run).where(Run.id == trial.id).values(attempt_started_at=began, training_since=began))
    ended = began + timedelta(minutes=10)
    dispatcher.jobs.set_status(job_id, "SUCCEEDED", ended_at=ended)
    dispatcher.tick()
    failed = dispatcher.sweeps.get_sweep(sweep.id)
    assert (failed.status, failed.error) == (SS.FAILED, DRIVER_ENDED_WITHOUT_RESULT)
    with dispatcher.repo.engine.begin() as conn:
        assert aware(conn.execute(select(Sweep.finished_at).where(Sweep.id == sweep.id)).scalar_one()) == ended
    trial = dispatcher.repo.get_run(trial.id)
    assert (trial.status, trial.finished_at, trial.trained_seconds) == (S.FAILED, ended, 600.0)


def test_a_sweep_the_driver_completed_is_left_alone_when_its_job_ends(dispatcher, sweep_spec):
    sweep, job_id = _submitted(dispatcher, sweep_spec)
    dispatcher.sweeps.apply_driver_report(sweep.id, SS.RUNNING)
    dispatcher.sweeps.apply_driver_report(sweep.id, SS.COMPLETED)
    dispatcher.jobs.set_status(job_id, "SUCCEEDED")
    dispatcher.tick()
    done = dispatcher.sweeps.get_sweep(sweep.id)
    assert (done.status, done.error, done.attempt) == (SS.COMPLETED, None, 1)


def test_cancel_stops_the_driver_job_then_cancels_the_sweep_and_its_active_trials(dispatcher, sweep_spec,
                                                                                 example_spec):
    sweep, job_id = _submitted(dispatcher, sweep_spec)
    dispatcher.sweeps.apply_driver_report(sweep.id, SS.RUNNING)
    active = _trial(dispatcher, sweep, "active", example_spec)
    done = _trial(dispatcher, sweep, "done", example_spec)
    dispatcher.repo.transition(done.id, S.COMPLETED)
    dispatcher.jobs.stop = lambda job: dispatcher.jobs.stop_calls.append(job)  # Ray stops asynchronously
    dispatcher.sweeps.cancel(sweep.id)
    dispatcher.tick()
    assert dispatcher.sweeps.get_sweep(sweep.id).status is SS.CANCELING
    assert dispatcher.repo.get_run(active.id).status is S.CANCELING
    dispatcher.jobs.set_status(job_id, "STOPPED")
    dispatcher.tick()
    assert dispatcher.jobs.stop_calls == [job_id, job_id]
    assert dispatcher.sweeps.get_sweep(sweep.id).status is SS.CANCELED
    assert dispatcher.repo.get_run(active.id).status is S.CANCELED
    assert dispatcher.repo.get_run(done.id).status is S.COMPLETED


def test_a_queued_sweep_canceled_before_submission_is_never_submitted(dispatcher, sweep_spec):
    sweep = dispatcher.sweeps.create_sweep(sweep_spec)
    dispatcher.sweeps.cancel(sweep.id)
    dispatcher.tick()
    assert dispatcher.sweeps.get_sweep(sweep.id).status is SS.CANCELED and dispatcher.jobs.submit_calls == []


def test_the_run_dispatcher_never_submits_or_syncs_trial_runs(dispatcher, sweep_spec, example_spec):
    sweep, job_id = _submitted(dispatcher, sweep_spec)
    trial = _trial(dispatcher, sweep, "t1", example_spec)
    starting = dispatcher.sweeps.register_trial(sweep.id, trial_id="t2", spec=example_spec, params={}, token="x")
    external = dispatcher.sweeps.create_sweep(sweep_spec, driver="external", token="e")
    ext_trial = _trial(dispatcher, external, "e1", example_spec)
    for _ in range(3):
        dispatcher.tick()
    # None of the trials' own ids is a Ray job; judged as runs they would read "job gone".
    assert dispatcher.jobs.submit_calls == [job_id]
    assert {dispatcher.repo.get_run(r.id).status for r in (trial, ext_trial)} == {S.RUNNING}
    assert dispatcher.repo.get_run(starting.id).status is S.STARTING
    assert dispatcher.repo.get_run(trial.id).attempt == 1


def test_startup_reconcile_requeues_a_sweep_whose_driver_job_is_gone(dispatcher, sweep_spec, example_spec):
    sweep, job_id = _submitted(dispatcher, sweep_spec)
    trial = _trial(dispatcher, sweep, "t1", example_spec)
    dispatcher.jobs.forget(job_id)
    fixes = reconcile_sweeps(dispatcher.sweeps, dispatcher.jobs, dispatcher.settings)
    assert fixes == [f"sweep {sweep.id}: reconciler: driver job {job_id} not found; re-queued as attempt 2"]
    assert dispatcher.sweeps.get_sweep(sweep.id).status is SS.QUEUED
    assert dispatcher.repo.get_run(trial.id).status is S.RUNNING


def test_app_startup_reconciles_sweeps_too(settings, fake_jobs, sweep_spec):
    from fastapi.testclient import TestClient

    from service.app import create_app

    with TestClient(create_app(settings, jobs=fake_jobs, run_dispatcher=False), headers=ADMIN_HEADERS) as client:
        sweeps = client.app.state.sweeps
        sweep = sweeps.create_sweep(sweep_spec)
        client.app.state.dispatcher.tick()
    fake_jobs.forget(f"sweep-{sweep.id}-attempt-1")
    with TestClient(create_app(settings, jobs=fake_jobs, run_dispatcher=False), headers=ADMIN_HEADERS) as client:
        restarted = client.get(f"/api/v1/sweeps/{sweep.id}").json()
    assert (restarted["status"], restarted["attempt"]) == ("QUEUED", 2)
