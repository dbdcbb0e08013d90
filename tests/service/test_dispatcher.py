"""The dispatcher against a fake Ray Jobs API: submit once per attempt, follow jobs to the end."""

from __future__ import annotations

import time

import pytest

from api.views import RunStatus
from service.dispatcher import Dispatcher
from service.job_kinds import ENDED_WITHOUT_RESULT, STOPPED_OUTSIDE

S = RunStatus


@pytest.fixture
def dispatcher(sqlite_repo, fake_jobs, settings) -> Dispatcher:
    return Dispatcher(sqlite_repo, fake_jobs, settings)


def _running(dispatcher, spec):
    run = dispatcher.repo.create_run(spec)
    dispatcher.tick()
    dispatcher.repo.transition(run.id, S.RUNNING)  # what the worker's first report does
    job_id = f"run-{run.id}-attempt-1"
    dispatcher.jobs.set_status(job_id, "RUNNING")
    return dispatcher.repo.get_run(run.id), job_id


def test_queued_run_is_submitted_once_with_its_attempt_id_entrypoint_and_env(dispatcher, example_spec, monkeypatch):
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("TESSERA_TEST_FAIL_AT_STEP", "3")
    monkeypatch.setenv("TESSERA_DATABASE_URL", "postgresql://user:secret@db/tessera")
    run = dispatcher.repo.create_run(example_spec)
    dispatcher.tick()
    dispatcher.tick()

    job_id = f"run-{run.id}-attempt-1"
    assert dispatcher.jobs.submit_calls == [job_id]
    job = dispatcher.jobs.jobs[job_id]
    assert job["entrypoint"] == f"/opt/venv/bin/python -m workers.fork_exec workers.launch --run-id {run.id}"
    env = job["env"]
    assert {k: env[k] for k in ("TESSERA_SERVICE_URL", "TESSERA_RUN_ID", "TESSERA_ATTEMPT", "TESSERA_STORAGE_URL")} == {
        "TESSERA_SERVICE_URL": "http://tessera.test:8000", "TESSERA_RUN_ID": run.id, "TESSERA_ATTEMPT": "1",
        "TESSERA_STORAGE_URL": "file:///tmp/tessera-test-storage"}
    assert env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.2" and env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert env["TESSERA_TEST_FAIL_AT_STEP"] == "3" and "TESSERA_DATABASE_URL" not in env
    assert env["RAY_COLOR_PREFIX"] == "0"  # the log is read as text: no colour codes in Ray's prefixes
    assert env["RAY_DEDUP_LOGS"] == "0"  # every worker's lines as printed, not folded into "[repeated 2x ...]"
    assert dispatcher.repo.check_token(run.id, env["TESSERA_RUN_TOKEN"])
    started = dispatcher.repo.get_run(run.id)
    assert started.status is S.STARTING and started.ray_job_id == job_id


def test_each_attempt_gets_a_fresh_token(dispatcher, example_spec):
    first = dispatcher.repo.create_run(example_spec)
    second = dispatcher.repo.create_run(example_spec)
    dispatcher.tick()
    tokens = {job["env"]["TESSERA_RUN_TOKEN"] for job in dispatcher.jobs.jobs.values()}
    assert len(tokens) == 2
    assert not any(dispatcher.repo.check_token(first.id, t) and dispatcher.repo.check_token(second.id, t) for t in tokens)


def test_a_refused_submission_fails_the_run_with_ray_s_reason(dispatcher, example_spec):
    run = dispatcher.repo.create_run(example_spec)
    dispatcher.jobs.fail_submit = RuntimeError("Request failed with status code 400: bad runtime_env")
    dispatcher.tick()
    failed = dispatcher.repo.get_run(run.id)
    assert failed.status is S.FAILED and "bad runtime_env" in failed.error and failed.failure is None


def test_unreachable_ray_at_submit_submits_the_same_attempt_again_once_ray_answers(dispatcher, example_spec):
    run = dispatcher.repo.create_run(example_spec)
    real_status = dispatcher.jobs.status

    def unreachable(_job_id):
        raise ConnectionError("Failed to connect to Ray")

    dispatcher.jobs.fail_submit = ConnectionError("Failed to connect to Ray")
    dispatcher.jobs.status = unreachable
    dispatcher.tick()
    dispatcher.tick()
    assert dispatcher.repo.get_run(run.id).status is S.STARTING  # unknown is not "gone"
    dispatcher.jobs.fail_submit, dispatcher.jobs.status = None, real_status
    dispatcher.tick()  # Ray answers: no such job, so attempt 1 never started; send it again
    dispatcher.tick()
    assert dispatcher.repo.get_run(run.id).attempt == 1
    assert list(dispatcher.jobs.jobs) == [f"run-{run.id}-attempt-1"]


def test_cancel_of_a_running_run_stops_its_job_then_marks_it_canceled(dispatcher, example_spec):
    run, job_id = _running(dispatcher, example_spec)
    dispatcher.repo.transition(run.id, S.CANCELING, message="canceled by user")
    dispatcher.tick()
    assert dispatcher.jobs.stop_calls == [job_id]
    canceled = dispatcher.repo.get_run(run.id)
    assert canceled.status is S.CANCELED and canceled.finished_at is not None
    assert "STOPPED" in dispatcher.repo.events(run.id)[-1].message


def test_cancel_waits_while_ray_still_reports_the_job_running(dispatcher, example_spec):
    run, job_id = _running(dispatcher, example_spec)
    dispatcher.jobs.stop = lambda job: dispatcher.jobs.stop_calls.append(job)  # Ray stops asynchronously
    dispatcher.repo.transition(run.id, S.CANCELING)
    dispatcher.tick()
    assert dispatcher.repo.get_run(run.id).status is S.CANCELING
    dispatcher.jobs.set_status(job_id, "STOPPED")
    dispatcher.tick()
    assert dispatcher.repo.get_run(run.id).status is S.CANCELED and dispatcher.jobs.stop_calls == [job_id, job_id]


def test_cancel_before_submission_never_submits(dispatcher, example_spec):
    run = dispatcher.repo.create_run(example_spec)
    dispatcher.repo.transition(run.id, S.CANCELING)
    dispatcher.tick()
    assert dispatcher.repo.get_run(run.id).status is S.CANCELED and dispatcher.jobs.submit_calls == []


def test_failed_job_fails_the_run_with_the_tail_of_its_logs(dispatcher, example_spec):
    run, job_id = _running(dispatcher, example_spec)
    dispatcher.jobs.logs[job_id] = "\n".join(f"line {i}" for i in range(100)) + "\nValueError: shapes differ"
    dispatcher.jobs.set_status(job_id, "FAILED")
    dispatcher.tick()
    failed = dispatcher.repo.get_run(run.id)
    assert failed.status is S.FAILED
    assert failed.error.endswith("line 99\nValueError: shapes differ") and "line 10\n" not in failed.error


def test_failed_job_keeps_the_error_the_worker_already_reported(dispatcher, example_spec):
    run, job_id = _running(dispatcher, example_spec)
    dispatcher.repo.transition(run.id, S.RESTARTING, error="worker 1 died: OOM")
    dispatcher.jobs.logs[job_id] = "unrelated driver noise"
    dispatcher.jobs.set_status(job_id, "FAILED")
    dispatcher.tick()
    failed = dispatcher.repo.get_run(run.id)
    # Not known to be the machine's: a worker whose FAILED report never got through fails its job too.
    assert (failed.error, failed.failure) == ("worker 1 died: OOM", None)


# A job that succeeded without its worker's word: nothing the training raised ended it (the
# worker reports every exception), so it is not the code's; one stopped outside Tessera: neither.
@pytest.mark.parametrize(("job_status", "error", "failure"),
                         [("STOPPED", STOPPED_OUTSIDE, None), ("SUCCEEDED", ENDED_WITHOUT_RESULT, "machine")])
def test_job_that_ended_behind_tessera_s_back_fails_the_run(dispatcher, example_spec, job_status, error, failure):
    run, job_id = _running(dispatcher, example_spec)
    dispatcher.jobs.set_status(job_id, job_status)
    dispatcher.tick()
    ended = dispatcher.repo.get_run(run.id)
    assert (ended.status, ended.error, ended.failure) == (S.FAILED, error, failure)


def test_completed_run_is_left_alone_when_its_job_succeeds(dispatcher, example_spec):
    run, job_id = _running(dispatcher, example_spec)
    dispatcher.repo.transition(run.id, S.COMPLETED)
    dispatcher.jobs.set_status(job_id, "SUCCEEDED")
    dispatcher.tick()
    assert dispatcher.repo.get_run(run.id).status is S.COMPLETED and dispatcher.repo.get_run(run.id).error is None


def test_vanished_job_requeues_the_run_as_a_new_attempt_with_a_new_submission(dispatcher, example_spec):
    run, job_id = _running(dispatcher, example_spec)
    old_token = dispatcher.jobs.jobs[job_id]["env"]["TESSERA_RUN_TOKEN"]
    dispatcher.jobs.forget(job_id)
    dispatcher.tick()
    requeued = dispatcher.repo.get_run(run.id)
    assert requeued.status is S.QUEUED and requeued.attempt == 2
    assert not dispatcher.repo.check_token(run.id, old_token)
    dispatcher.tick()
    assert dispatcher.jobs.submit_calls[-1] == f"run-{run.id}-attempt-2"
    assert dispatcher.jobs.jobs[f"run-{run.id}-attempt-2"]["env"]["TESSERA_ATTEMPT"] == "2"


def test_one_run_s_problem_does_not_stop_the_others(dispatcher, example_spec):
    stuck, stuck_job = _running(dispatcher, example_spec)
    other, other_job = _running(dispatcher, example_spec)
    real_status = dispatcher.jobs.status

    def flaky_status(job_id):
        if job_id == stuck_job:
            raise RuntimeError("Request failed with status code 500: internal error")
        return real_status(job_id)

    dispatcher.jobs.status = flaky_status
    dispatcher.jobs.set_status(other_job, "FAILED")
    dispatcher.tick()
    assert dispatcher.repo.get_run(stuck.id).status is S.RUNNING
    assert dispatcher.repo.get_run(other.id).status is S.FAILED


def test_a_tick_sends_its_first_run_alone_then_starts_the_rest_in_batches_of_one_transaction(dispatcher, example_spec, monkeypatch):
    from service import job_follower

    monkeypatch.setattr(job_follower, "SUBMIT_BATCH", 3)
    runs = [dispatcher.repo.create_run(example_spec) for _ in range(7)]
    batches = []
    real = dispatcher.repo.begin_attempts

    def counted(queued, tokens, message):
        assert len(dispatcher.jobs.submit_calls) == sum(batches)  # the earlier batches' jobs are sent first
        batches.append(len(queued))
        return real(queued, tokens, message)

    monkeypatch.setattr(dispatcher.repo, "begin_attempts", counted)
    dispatcher.tick()
    assert batches == [1, 3, 3]  # the first alone: if Ray cannot take it, the rest stay QUEUED
    assert dispatcher.jobs.submit_calls == [f"run-{run.id}-attempt-1" for run in runs]  # oldest first
    assert all(dispatcher.repo.get_run(run.id).status is S.STARTING for run in runs)


def test_a_batch_that_cannot_be_started_at_once_is_started_run_by_run(dispatcher, example_spec, monkeypatch):
    runs = [dispatcher.repo.create_run(example_spec) for _ in range(4)]
    poisoned = runs[2].id
    real = dispatcher.repo.begin_attempts

    def fails_with_the_poisoned_run(queued, tokens, message):
        if any(run.id == poisoned for run in queued):
            raise ValueError("a value the database refuses")
        return real(queued, tokens, message)

    monkeypatch.setattr(dispatcher.repo, "begin_attempts", fails_with_the_poisoned_run)
    dispatcher.tick()
    assert dispatcher.repo.get_run(poisoned).status is S.QUEUED  # tried again next tick
    others = [run for run in runs if run.id != poisoned]
    assert all(dispatcher.repo.get_run(run.id).status is S.STARTING for run in others)
    assert sorted(dispatcher.jobs.submit_calls) == sorted(f"run-{run.id}-attempt-1" for run in others)


def test_background_thread_dispatches_until_stopped(dispatcher, example_spec):
    run = dispatcher.repo.create_run(example_spec)
    dispatcher.start()
    try:
        deadline = time.monotonic() + 10
        while dispatcher.repo.get_run(run.id).status is S.QUEUED:
            assert time.monotonic() < deadline, "dispatcher thread never submitted the run"
            time.sleep(0.02)
    finally:
        dispatcher.stop()
    assert dispatcher._thread is None
    assert dispatcher.jobs.submit_calls == [f"run-{run.id}-attempt-1"]


def test_a_tick_reads_the_active_runs_once_without_their_metrics(dispatcher, example_spec, monkeypatch):
    from service.repository import ActiveRun

    running, _ = _running(dispatcher, example_spec)
    dispatcher.repo.create_run(example_spec)  # a queued run: the admission plan needs the active runs too
    reads = []
    real = dispatcher.repo.snapshots
    monkeypatch.setattr(dispatcher.repo, "snapshots", lambda statuses: reads.append(set(statuses)) or real(statuses))
    monkeypatch.setattr(dispatcher.repo, "with_status", lambda statuses: pytest.fail("a tick read whole run records"))
    import service.dispatcher as dispatcher_module

    handed = {}
    archive_tick, enforce = dispatcher.log_archiver.tick, dispatcher_module.wall_clock.enforce

    def archive_tick_seen(records, folded, states, listed_at):
        handed["archiver"] = records["run"]
        return archive_tick(records, folded, states, listed_at)

    def enforce_seen(*args, active):
        handed["wall_clock"] = active
        return enforce(*args, active=active)

    monkeypatch.setattr(dispatcher.log_archiver, "tick", archive_tick_seen)
    monkeypatch.setattr(dispatcher_module.wall_clock, "enforce", enforce_seen)
    dispatcher.tick()
    active = {S.STARTING, S.RUNNING, S.RESTARTING, S.CANCELING}
    # The run follower's read, shared with the queue's plan, the log archiver and the wall-clock check
    assert reads == [active, {S.QUEUED}]
    assert handed["archiver"] is handed["wall_clock"] and [r.id for r in handed["archiver"]] == [running.id]
    assert all(type(run) is ActiveRun for run in handed["archiver"])


def test_the_objects_a_service_made_at_startup_are_frozen_while_it_runs_and_freed_after(tmp_path, fake_jobs):
    import gc

    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    before = gc.get_freeze_count()
    app = create_app(Settings(home=tmp_path / "home", public_url="http://tessera.test:8000"), jobs=fake_jobs,
                     run_dispatcher=False)
    with TestClient(app):
        assert gc.get_freeze_count() > before  # a full collection no longer walks them
    assert gc.get_freeze_count() == 0  # given back to the collector when the service stops
