"""Run logs: the dispatcher copies attempts' Ray job logs to storage; the route pages through them."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import update

from api.views import RunStatus, SweepStatus
from service.db.models import Run
from service.log_store import LogStore
from service.storage_paths import attempt_log_url
from service.settings import Settings

S, SS = RunStatus, SweepStatus
TRACEBACK = "epoch 1\nTraceback (most recent call last):\n  File \"x.py\", line 1\nValueError: boom\n"


@pytest.fixture
def settings(tmp_path) -> Settings:  # storage of this test only: logs are written there
    return Settings(home=tmp_path / "home", public_url="http://tessera.test:8000",
                    worker_python="/opt/venv/bin/python", storage_url=f"file://{tmp_path}/storage")


def _start(client, fake_jobs, body) -> tuple[str, str]:
    run_id = client.post("/api/v1/runs", json=body).json()["id"]
    client.app.state.dispatcher.tick()
    job_id = f"run-{run_id}-attempt-1"
    fake_jobs.set_status(job_id, "RUNNING")
    return run_id, job_id


def _hand_clock(archiver) -> list[float]:
    """Give the archiver a clock the test moves (``clock[0] += s``) and the default 10 s wait."""
    clock = [1000.0]
    archiver.clock, archiver.forget_after_s = (lambda: clock[0]), 10
    return clock


def test_a_failed_attempt_s_traceback_is_stored_and_outlives_ray(client, fake_jobs, example_body, settings):
    client.app.state.dispatcher.log_archiver.forget_after_s = 0
    run_id, job_id = _start(client, fake_jobs, example_body)
    fake_jobs.logs[job_id] = TRACEBACK
    fake_jobs.set_status(job_id, "FAILED")
    client.app.state.dispatcher.tick()  # the run fails
    assert client.get(f"/api/v1/runs/{run_id}").json()["status"] == "FAILED"
    client.app.state.dispatcher.tick()  # its attempt is no longer followed: the final log is copied
    assert LogStore(settings.storage_url).read(run_id, 1) == TRACEBACK.encode()
    assert job_id not in fake_jobs.jobs  # stored, so Ray was told to forget the job
    page = client.get(f"/api/v1/runs/{run_id}/logs").json()
    assert page["text"] == TRACEBACK and page["source"] == "storage" and page["live"] is False
    assert "ValueError: boom" in page["text"]


def test_a_log_read_as_its_run_ends_stays_live_until_the_job_has_written_its_last_lines(client, fake_jobs,
                                                                                      example_body, settings):
    """A run ends as its worker reports it; its job's driver then writes the failure's traceback
    and exits. A reader that follows the log until ``live`` turns false gets those lines too, and
    not the shorter copy stored while the run was live."""
    dispatcher = client.app.state.dispatcher
    run_id, job_id = _start(client, fake_jobs, example_body)
    client.app.state.repo.apply_worker_report(run_id, S.RUNNING)
    fake_jobs.logs[job_id] = "epoch 1\n"
    dispatcher.tick()  # a live attempt's copy
    store = LogStore(settings.storage_url)
    assert store.read(run_id, 1) == b"epoch 1\n" and not store.is_final(run_id, 1)
    client.app.state.repo.apply_worker_report(run_id, S.FAILED, error="ValueError: boom")
    fake_jobs.logs[job_id] = TRACEBACK  # the driver writes on, its job still running
    page = client.get(f"/api/v1/runs/{run_id}/logs").json()
    assert (page["text"], page["source"], page["live"]) == (TRACEBACK, "ray", True)
    fake_jobs.logs[job_id] = TRACEBACK + "run failed\n"
    fake_jobs.set_status(job_id, "FAILED")
    page = client.get(f"/api/v1/runs/{run_id}/logs", params={"after": page["next_offset"]}).json()
    assert (page["text"], page["source"], page["live"]) == ("run failed\n", "ray", False)
    assert store.is_final(run_id, 1)  # stored on the way, marked as the whole log
    page = client.get(f"/api/v1/runs/{run_id}/logs").json()
    assert (page["text"], page["source"], page["live"]) == (TRACEBACK + "run failed\n", "storage", False)


def test_an_ended_run_s_log_stops_being_live_when_its_job_hangs_or_is_forgotten_and_follows_a_restart(
        client, fake_jobs, example_body, settings, monkeypatch):
    """Three cases of an ended attempt whose stored copy is not marked final: its job still runs
    long after the run ended (a hung driver): live no longer; Ray has forgotten its job (a copy
    stored before there were markers): the copy is final, and is marked so; a Ray Train restart
    went on in the first attempt's job: the second attempt reads that job."""
    import service.routes.logs as logs_route

    run_id, job_id = _start(client, fake_jobs, example_body)
    repo, store = client.app.state.repo, LogStore(settings.storage_url)
    repo.apply_worker_report(run_id, S.RUNNING)
    repo.apply_worker_report(run_id, S.RESTARTING)  # Ray Train restarted the group: attempt 2, same job
    repo.apply_worker_report(run_id, S.RUNNING)
    assert repo.get_run(run_id).attempt == 2 and repo.get_run(run_id).ray_job_id == job_id
    fake_jobs.logs[job_id] = "attempt 1\nattempt 2\n"
    page = client.get(f"/api/v1/runs/{run_id}/logs").json()
    assert (page["attempt"], page["text"], page["source"], page["live"]) == (2, "attempt 1\nattempt 2\n", "ray", True)
    store.save(run_id, 1, "attempt 1\n")  # the first attempt's copy; Ray's log of its job goes on with attempt 2
    page = client.get(f"/api/v1/runs/{run_id}/logs", params={"attempt": 1}).json()
    assert (page["text"], page["source"], page["live"]) == ("attempt 1\n", "storage", False)

    # An end reported late, after an outage: its time is long past, but the service only now
    # heard of it, and the job's last lines follow the report. The log stays live a while.
    an_hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    with repo.engine.begin() as conn:
        began = an_hour_ago - timedelta(minutes=5)  # the current attempt's start: where its end is kept after
        conn.execute(update(Run).where(Run.id == run_id).values(started_at=began, attempt_started_at=began))
    repo.apply_worker_report(run_id, S.COMPLETED, ended_at=an_hour_ago)
    assert (datetime.now(timezone.utc) - repo.get_run(run_id).finished_at).total_seconds() > 3000
    assert client.get(f"/api/v1/runs/{run_id}/logs").json()["live"] is True
    monkeypatch.setattr(logs_route, "FINISHING_S", 0.0)  # its job still runs: a driver that hangs
    page = client.get(f"/api/v1/runs/{run_id}/logs").json()
    assert (page["text"], page["source"], page["live"]) == ("attempt 1\nattempt 2\n", "ray", False)

    store.save(run_id, 2, "attempt 1\nattempt 2\n")  # as a service before markers stored it
    fake_jobs.forget(job_id)
    assert not store.is_final(run_id, 2)
    page = client.get(f"/api/v1/runs/{run_id}/logs").json()
    assert (page["text"], page["source"], page["live"]) == ("attempt 1\nattempt 2\n", "storage", False)
    assert store.is_final(run_id, 2)  # Ray forgot the job: nothing more will come, and later reads ask Ray no more


def test_a_resumed_run_s_new_attempt_has_no_log_until_its_job_starts_and_the_old_one_keeps_its_own(
        client, fake_jobs, example_body, settings):
    """Resumed, a run is QUEUED as attempt 2 while attempt 1's job may still be in Ray: attempt 2
    reads nothing (live: it has not started), attempt 1 its own job; once attempt 2's job starts,
    it reads that job from its first byte."""
    run_id, job_id = _start(client, fake_jobs, example_body)
    repo = client.app.state.repo
    repo.apply_worker_report(run_id, S.RUNNING)
    fake_jobs.logs[job_id] = "attempt 1\n" + TRACEBACK
    repo.apply_worker_report(run_id, S.FAILED, error="ValueError: boom")
    assert client.post(f"/api/v1/runs/{run_id}/resume", json={}).status_code == 200
    page = client.get(f"/api/v1/runs/{run_id}/logs").json()
    assert (page["attempt"], page["text"], page["source"], page["live"]) == (2, "", "none", True)
    first = client.get(f"/api/v1/runs/{run_id}/logs", params={"attempt": 1}).json()
    assert (first["text"], first["source"], first["live"]) == ("attempt 1\n" + TRACEBACK, "ray", True)  # still ending
    fake_jobs.set_status(job_id, "FAILED")
    client.app.state.dispatcher.tick()  # attempt 2's job starts
    fake_jobs.set_status(f"run-{run_id}-attempt-2", "RUNNING")
    fake_jobs.logs[f"run-{run_id}-attempt-2"] = "attempt 2\n"
    page = client.get(f"/api/v1/runs/{run_id}/logs", params={"after": page["next_offset"]}).json()
    assert (page["text"], page["source"], page["live"]) == ("attempt 2\n", "ray", True)
    first = client.get(f"/api/v1/runs/{run_id}/logs", params={"attempt": 1}).json()
    assert (first["text"], first["live"]) == ("attempt 1\n" + TRACEBACK, False)


def test_a_finished_job_is_forgotten_by_ray_only_once_its_final_log_is_stored(client, fake_jobs, example_body,
                                                                            settings):
    run_id, job_id = _start(client, fake_jobs, example_body)
    dispatcher = client.app.state.dispatcher
    dispatcher.log_archiver.forget_after_s = 0
    client.app.state.repo.apply_worker_report(run_id, S.RUNNING)
    dispatcher.tick()
    client.app.state.repo.apply_worker_report(run_id, S.COMPLETED)
    dispatcher.tick()  # the attempt is no longer followed, but its job has not ended yet
    assert fake_jobs.jobs[job_id]["status"] == "RUNNING"
    fake_jobs.logs[job_id] = "all done\n"
    fake_jobs.set_status(job_id, "SUCCEEDED")
    store, save = dispatcher.log_archiver.store, dispatcher.log_archiver.store.save

    def failing_save(*args, **kwargs):  # not an OSError, which would end the pass before any forget
        raise RuntimeError("storage refused the write")

    store.save = failing_save
    dispatcher.tick()
    assert job_id in fake_jobs.jobs  # not stored: Ray keeps the job, and its log
    store.save = save
    dispatcher.tick()
    assert LogStore(settings.storage_url).read(run_id, 1) == b"all done\n"
    assert job_id not in fake_jobs.jobs
    page = client.get(f"/api/v1/runs/{run_id}/logs").json()
    assert page["text"] == "all done\n" and page["source"] == "storage"


def test_ray_forgets_a_finished_job_only_forget_after_s_after_its_final_copy(client, fake_jobs, example_body):
    clock = _hand_clock(client.app.state.dispatcher.log_archiver)
    run_id, job_id = _start(client, fake_jobs, example_body)
    fake_jobs.set_status(job_id, "FAILED")
    client.app.state.dispatcher.tick()
    client.app.state.dispatcher.tick()  # the final copy
    clock[0] += 9.9
    client.app.state.dispatcher.tick()
    assert job_id in fake_jobs.jobs
    clock[0] += 0.1
    client.app.state.dispatcher.tick()
    assert job_id not in fake_jobs.jobs


def test_a_job_ray_will_not_forget_is_tried_three_times_and_holds_no_other_back(client, fake_jobs, example_body):
    from service.log_archive import FORGET_TRIES
    from service.ray_client import RayAmbiguous

    clock = _hand_clock(client.app.state.dispatcher.log_archiver)
    stuck = _start(client, fake_jobs, example_body)[1]
    other = _start(client, fake_jobs, example_body)[1]
    deletes = []
    real_delete = fake_jobs.delete

    def delete(job_id):
        deletes.append(job_id)
        if job_id == stuck:  # Ray answers a job it will not delete with a 500
            raise RayAmbiguous(f"Ray answered DELETE /api/jobs/{job_id} with 500")
        real_delete(job_id)

    fake_jobs.delete = delete
    for job_id in (stuck, other):
        fake_jobs.set_status(job_id, "FAILED")
    client.app.state.dispatcher.tick()
    client.app.state.dispatcher.tick()  # both final copies
    for _ in range(2 * FORGET_TRIES + 2):
        clock[0] += 10
        client.app.state.dispatcher.tick()
    assert other not in fake_jobs.jobs and deletes.count(other) == 1
    assert deletes.count(stuck) == FORGET_TRIES == 3 and stuck in fake_jobs.jobs


def test_a_job_that_ended_while_no_process_dispatched_is_forgotten_once_the_new_leader_reconciles(
        client, fake_jobs, example_body, settings):
    from service.dispatcher import Dispatcher

    run_id, job_id = _start(client, fake_jobs, example_body)
    fake_jobs.logs[job_id] = TRACEBACK
    fake_jobs.set_status(job_id, "FAILED")  # while the service was down: its archiver never saw the run live
    restarted = Dispatcher(client.app.state.repo, fake_jobs, client.app.state.dispatcher.settings)
    restarted.log_archiver.forget_after_s = 0
    assert restarted.take_lead()  # reconciles: the run fails
    assert client.get(f"/api/v1/runs/{run_id}").json()["status"] == "FAILED"
    restarted.tick()
    assert LogStore(settings.storage_url).read(run_id, 1) == TRACEBACK.encode()
    assert job_id not in fake_jobs.jobs


def _ended_before_a_restart(client, fake_jobs, body) -> tuple[str, str]:
    """A run whose attempt failed and was seen to fail, its job not yet forgotten (that is due
    10 s after its final copy) and its log grown since (the copy stored is not the final one):
    then the service restarts, and the new process's archiver never saw the attempt."""
    run_id, job_id = _start(client, fake_jobs, body)
    fake_jobs.logs[job_id] = "epoch 1\n"
    fake_jobs.set_status(job_id, "FAILED")
    client.app.state.dispatcher.tick()  # the run fails
    assert client.get(f"/api/v1/runs/{run_id}").json()["status"] == "FAILED"
    fake_jobs.logs[job_id] += f"final line of {run_id}\n"
    return run_id, job_id


def test_a_new_leader_sweeps_finished_run_jobs_left_in_ray_s_list(client, fake_jobs, example_body, settings):
    from service.dispatcher import Dispatcher

    ended = [_ended_before_a_restart(client, fake_jobs, example_body) for _ in range(3)]
    live_run, live_job = _start(client, fake_jobs, example_body)
    foreign = {"run-not-in-this-database-attempt-1": "SUCCEEDED",  # other services', on a shared cluster
               "sweep-s1-attempt-1": "SUCCEEDED",
               "export-notindb-step-3-abcdef": "SUCCEEDED"}  # an export of a run not in this database: left
    for job_id, status in foreign.items():
        fake_jobs.jobs[job_id] = {"status": status}
    fake_jobs.states = lambda: {job_id: job["status"] for job_id, job in fake_jobs.jobs.items()}
    restarted = Dispatcher(client.app.state.repo, fake_jobs, client.app.state.dispatcher.settings)
    restarted.log_archiver.forget_after_s, restarted.log_archiver.copies_per_tick = 0, 2
    assert restarted.take_lead()
    restarted.tick()  # two of the three ended attempts a pass
    assert sum(job_id in fake_jobs.jobs for _, job_id in ended) == 1
    restarted.tick()
    for run_id, job_id in ended:
        assert LogStore(settings.storage_url).read(run_id, 1) == f"epoch 1\nfinal line of {run_id}\n".encode()
        assert job_id not in fake_jobs.jobs
    assert set(foreign) <= set(fake_jobs.jobs) and fake_jobs.jobs[live_job]["status"] == "RUNNING"
    restarted.tick()
    assert client.get(f"/api/v1/runs/{live_run}").json()["status"] == "STARTING"


def test_the_sweep_stores_the_job_a_run_ended_on_under_its_last_attempt_and_leaves_active_runs_jobs(
        client, fake_jobs, example_body, settings):
    from service.dispatcher import Dispatcher

    repo = client.app.state.repo
    restarted_run, job_id = _start(client, fake_jobs, example_body)
    repo.apply_worker_report(restarted_run, S.RUNNING)
    repo.apply_worker_report(restarted_run, S.RESTARTING)  # a worker-group restart: attempt 2, same job
    assert client.get(f"/api/v1/runs/{restarted_run}").json()["attempt"] == 2
    fake_jobs.logs[job_id] = "first worker group\nsecond worker group\n"
    fake_jobs.set_status(job_id, "FAILED")
    client.app.state.dispatcher.tick()  # the run fails; its live copy (attempt 2) is not the final log
    assert client.get(f"/api/v1/runs/{restarted_run}").json()["status"] == "FAILED"
    fake_jobs.logs[job_id] += "final line\n"
    earlier_job = f"run-{restarted_run}-attempt-7"  # not the job it ended on: stored when it ended
    fake_jobs.jobs[earlier_job], fake_jobs.logs[earlier_job] = {"status": "FAILED"}, "not this one\n"
    queued_run = client.post("/api/v1/runs", json=example_body).json()["id"]
    queued_job = f"run-{queued_run}-attempt-1"  # e.g. submitted, failed, not yet followed
    fake_jobs.jobs[queued_job] = {"status": "FAILED"}
    fake_jobs.states = lambda: {jid: job["status"] for jid, job in fake_jobs.jobs.items()}
    restarted = Dispatcher(repo, fake_jobs, client.app.state.dispatcher.settings)
    restarted.log_archiver.forget_after_s = 0
    assert restarted.take_lead()
    restarted.log_archiver.tick({})
    store = LogStore(settings.storage_url)
    assert store.read(restarted_run, 2) == b"first worker group\nsecond worker group\nfinal line\n"
    assert store.read(restarted_run, 7) is None
    assert job_id not in fake_jobs.jobs and earlier_job not in fake_jobs.jobs
    assert queued_job in fake_jobs.jobs


def test_a_sweep_that_cannot_ask_ray_is_made_again_at_the_next_pass(client, fake_jobs, example_body, settings):
    from service.dispatcher import Dispatcher
    from service.ray_client import RayUnavailable

    run_id, job_id = _ended_before_a_restart(client, fake_jobs, example_body)
    restarted = Dispatcher(client.app.state.repo, fake_jobs, client.app.state.dispatcher.settings)
    restarted.log_archiver.forget_after_s = 0
    assert restarted.take_lead()
    answers = iter([RayUnavailable("Ray did not answer")])

    def states():
        error = next(answers, None)
        if error is not None:
            raise error
        return {jid: job["status"] for jid, job in fake_jobs.jobs.items()}

    fake_jobs.states = states
    restarted.log_archiver.tick({})
    assert job_id in fake_jobs.jobs
    restarted.log_archiver.tick({})  # found: the final copy, then (forget_after_s = 0) the delete
    assert LogStore(settings.storage_url).read(run_id, 1) == f"epoch 1\nfinal line of {run_id}\n".encode()
    assert job_id not in fake_jobs.jobs


def _sweep_with_a_trial(client, fake_jobs, example_body):
    """A service-driven sweep whose driver job runs, seen live by a tick, and one RUNNING trial."""
    from api.specs import RunSpec
    from api.sweeps import SweepSpec

    dispatcher = client.app.state.dispatcher
    sweep = dispatcher.sweeps.create_sweep(SweepSpec.model_validate({
        "name": "s", "base": example_body, "search": {"algorithms": {"sets": [[], ["channels_last"]]}}}))
    dispatcher.tick()  # submits the driver
    job_id = f"sweep-{sweep.id}-attempt-1"
    fake_jobs.set_status(job_id, "RUNNING")
    dispatcher.sweeps.apply_driver_report(sweep.id, SS.RUNNING)
    trial = dispatcher.sweeps.register_trial(sweep.id, trial_id="t1", spec=RunSpec.model_validate(example_body),
                                             params={}, token="t1")
    client.app.state.repo.transition(trial.id, S.RUNNING)
    fake_jobs.logs[job_id] = "trial t1: epoch 1\n"
    dispatcher.tick()  # the archiver sees the driver's attempt live
    page = client.get(f"/api/v1/sweeps/{sweep.id}/logs").json()
    assert (page["text"], page["source"], page["live"]) == ("trial t1: epoch 1\n", "ray", True)
    return sweep, trial, job_id


def _restart_and_sweep_ray_s_list(client, fake_jobs) -> None:
    """A new process takes the lead (Ray lists every job it holds) and its archiver makes a pass:
    the leftovers in Ray's list are stored and forgotten at once."""
    from service.dispatcher import Dispatcher

    fake_jobs.states = lambda: {jid: job["status"] for jid, job in fake_jobs.jobs.items()}
    restarted = Dispatcher(client.app.state.repo, fake_jobs, client.app.state.dispatcher.settings)
    restarted.log_archiver.forget_after_s = 0
    assert restarted.take_lead()
    restarted.log_archiver.tick({})


def test_a_sweep_driver_s_final_log_is_stored_and_its_trials_read_it_once_ray_forgot_the_job(
        client, fake_jobs, example_body, settings):
    dispatcher = client.app.state.dispatcher
    dispatcher.log_archiver.forget_after_s = 0
    sweep, trial, job_id = _sweep_with_a_trial(client, fake_jobs, example_body)
    page = client.get(f"/api/v1/runs/{trial.id}/logs").json()
    assert (page["text"], page["source"], page["live"]) == ("trial t1: epoch 1\n", "ray", True)
    client.app.state.repo.transition(trial.id, S.COMPLETED)
    dispatcher.sweeps.apply_driver_report(sweep.id, SS.COMPLETED)
    fake_jobs.logs[job_id] += "sweep done\n"
    fake_jobs.set_status(job_id, "SUCCEEDED")
    dispatcher.tick()  # no longer followed: the final copy, then (forget_after_s = 0) the delete
    final = b"trial t1: epoch 1\nsweep done\n"
    assert LogStore(settings.storage_url).read(sweep.id, 1, kind="sweep") == final
    assert job_id not in fake_jobs.jobs  # Ray's job list no longer grows with every sweep
    page = client.get(f"/api/v1/runs/{trial.id}/logs").json()
    assert (page["text"].encode(), page["source"], page["live"]) == (final, "storage", False)
    page = client.get(f"/api/v1/sweeps/{sweep.id}/logs").json()  # the sweep's own route, for a driver with no trial
    assert (page["sweep_id"], page["text"].encode(), page["source"], page["attempts"]) == (sweep.id, final, "storage", 1)
    bad = client.get(f"/api/v1/sweeps/{sweep.id}/logs", params={"attempt": 2})
    assert bad.status_code == 422 and "attempts 1..1" in bad.text and "attempt" in bad.text


def test_an_ended_trial_reads_ray_before_its_driver_s_periodic_copy(client, fake_jobs, example_body, settings):
    # While the driver runs, its stored copy is only the last of its periodic copies: a trial
    # that ended reads the fresher log from Ray, and the stored copy only once Ray cannot answer.
    dispatcher = client.app.state.dispatcher
    sweep, trial, job_id = _sweep_with_a_trial(client, fake_jobs, example_body)
    assert LogStore(settings.storage_url).read(sweep.id, 1, kind="sweep") == b"trial t1: epoch 1\n"
    client.app.state.repo.transition(trial.id, S.COMPLETED)
    fake_jobs.logs[job_id] += "trial t1: done\n"
    page = client.get(f"/api/v1/runs/{trial.id}/logs").json()
    assert (page["text"], page["source"]) == ("trial t1: epoch 1\ntrial t1: done\n", "ray")
    fake_jobs.job_logs = lambda submission_id: (_ for _ in ()).throw(OSError("Ray did not answer"))
    page = client.get(f"/api/v1/runs/{trial.id}/logs").json()
    assert (page["text"], page["source"]) == ("trial t1: epoch 1\n", "storage")
    assert dispatcher.sweeps.get_sweep(sweep.id).status is SS.RUNNING


def test_a_new_leader_stores_and_forgets_finished_sweep_driver_jobs_left_in_ray_s_list(
        client, fake_jobs, example_body, settings):
    dispatcher = client.app.state.dispatcher
    sweep, _, job_id = _sweep_with_a_trial(client, fake_jobs, example_body)
    dispatcher.sweeps.apply_driver_report(sweep.id, SS.COMPLETED)
    fake_jobs.set_status(job_id, "SUCCEEDED")
    dispatcher.tick()  # its final copy is made; the delete, 10 s later, never comes: the process ends
    fake_jobs.logs[job_id] += "written after that copy\n"
    running_job = _sweep_with_a_trial(client, fake_jobs, example_body)[2]  # a sweep still running
    _restart_and_sweep_ray_s_list(client, fake_jobs)
    assert LogStore(settings.storage_url).read(sweep.id, 1, kind="sweep") == \
        b"trial t1: epoch 1\nwritten after that copy\n"
    assert job_id not in fake_jobs.jobs and fake_jobs.jobs[running_job]["status"] == "RUNNING"


def test_each_trial_attempt_reads_the_driver_attempt_it_ran_under_and_nothing_is_stored_under_the_trial(
        client, fake_jobs, example_body, settings):
    from api.specs import RunSpec

    dispatcher = client.app.state.dispatcher
    dispatcher.log_archiver.forget_after_s = 0
    sweep, trial, job1 = _sweep_with_a_trial(client, fake_jobs, example_body)
    fake_jobs.logs[job1] += "driver 1 died\n"
    fake_jobs.set_status(job1, "FAILED")
    dispatcher.tick()  # the driver died: the sweep is queued again as attempt 2
    dispatcher.tick()  # attempt 2 submitted; attempt 1's final copy made, its job forgotten
    job2 = f"sweep-{sweep.id}-attempt-2"
    assert job2 in fake_jobs.jobs and job1 not in fake_jobs.jobs
    fake_jobs.set_status(job2, "RUNNING")
    fake_jobs.logs[job2] = "driver 2: trial t1 restored\n"
    again = dispatcher.sweeps.register_trial(sweep.id, trial_id="t1", spec=RunSpec.model_validate(example_body),
                                             params={}, token="t1b")
    assert (again.id, again.attempt) == (trial.id, 2)
    pages = {n: client.get(f"/api/v1/runs/{trial.id}/logs", params={"attempt": n}).json() for n in (1, 2)}
    assert (pages[1]["text"], pages[1]["source"]) == ("trial t1: epoch 1\ndriver 1 died\n", "storage")
    assert (pages[2]["text"], pages[2]["source"]) == ("driver 2: trial t1 restored\n", "ray")
    driver_pages = [client.get(f"/api/v1/sweeps/{sweep.id}/logs", params={"attempt": n}).json() for n in (1, 2)]
    assert [p["text"] for p in driver_pages] == [pages[1]["text"], pages[2]["text"]]
    store = LogStore(settings.storage_url)
    assert store.read(trial.id, 1) is None and store.read(trial.id, 2) is None  # one copy, the sweep's


def test_a_trial_restarted_in_its_actor_reads_its_driver_s_log_on_its_next_attempt_too(
        client, fake_jobs, example_body, settings):
    """A trial that trains in its Tune actor retries there (max_restarts), reporting RESTARTING:
    its next attempt has no start event of its own and goes on under the same driver attempt."""
    sweep, trial, job1 = _sweep_with_a_trial(client, fake_jobs, example_body)
    client.app.state.repo.apply_worker_report(trial.id, S.RESTARTING)
    assert client.app.state.repo.get_run(trial.id).attempt == 2
    fake_jobs.logs[job1] += "trial t1: restarting\n"
    page = client.get(f"/api/v1/runs/{trial.id}/logs").json()
    assert (page["attempt"], page["text"], page["source"], page["live"]) == \
        (2, "trial t1: epoch 1\ntrial t1: restarting\n", "ray", True)
    assert LogStore(settings.storage_url).read(trial.id, 2) is None  # nothing stored under the trial


def test_a_trial_resumed_by_hand_logs_its_new_attempt_as_a_run_s_and_keeps_its_driver_s_log(
        client, fake_jobs, example_body):
    dispatcher = client.app.state.dispatcher
    dispatcher.log_archiver.forget_after_s = 0
    sweep, trial, job1 = _sweep_with_a_trial(client, fake_jobs, example_body)
    client.app.state.repo.transition(trial.id, S.FAILED, error="boom")
    dispatcher.sweeps.apply_driver_report(sweep.id, SS.COMPLETED)
    fake_jobs.set_status(job1, "SUCCEEDED")
    dispatcher.tick()  # the driver's final copy; its job forgotten
    resumed = client.post(f"/api/v1/runs/{trial.id}/resume", json={})
    assert resumed.status_code == 200, resumed.text
    dispatcher.tick()  # submitted as a run's own job
    run_job = f"run-{trial.id}-attempt-2"
    fake_jobs.set_status(run_job, "RUNNING")
    fake_jobs.logs[run_job] = "resumed by hand\n"
    pages = {n: client.get(f"/api/v1/runs/{trial.id}/logs", params={"attempt": n}).json() for n in (1, 2)}
    assert (pages[1]["text"], pages[1]["source"], pages[1]["live"]) == ("trial t1: epoch 1\n", "storage", False)
    assert (pages[2]["text"], pages[2]["source"], pages[2]["live"]) == ("resumed by hand\n", "ray", True)


def test_a_new_leader_stores_and_forgets_the_job_of_a_sweep_s_earlier_driver_attempt(
        client, fake_jobs, example_body, settings):
    dispatcher = client.app.state.dispatcher
    sweep, _, job1 = _sweep_with_a_trial(client, fake_jobs, example_body)
    fake_jobs.set_status(job1, "FAILED")
    dispatcher.tick()  # queued again as attempt 2; then the process stops before the final copy
    assert dispatcher.sweeps.get_sweep(sweep.id).status is SS.QUEUED
    fake_jobs.logs[job1] += "Traceback: the driver's last words\n"
    lost_answer = f"sweep-{sweep.id}-attempt-2"  # submitted by a process that lost the answer; failed
    fake_jobs.jobs[lost_answer] = {"status": "FAILED"}
    _restart_and_sweep_ray_s_list(client, fake_jobs)
    assert LogStore(settings.storage_url).read(sweep.id, 1, kind="sweep") == \
        b"trial t1: epoch 1\nTraceback: the driver's last words\n"
    assert job1 not in fake_jobs.jobs
    assert lost_answer in fake_jobs.jobs  # the attempt's next submit must find it: it never runs twice
    # The queued attempt has no job of its own yet (its lost submission is no log of it); the one
    # before shows the dead driver's last words.
    pages = [client.get(f"/api/v1/sweeps/{sweep.id}/logs", params=q).json() for q in ({}, {"attempt": 1})]
    assert [(p["attempt"], p["source"], p["text"]) for p in pages] == [
        (2, "none", ""), (1, "storage", "trial t1: epoch 1\nTraceback: the driver's last words\n")]


def test_an_external_driver_s_trials_have_no_job_and_no_log(client, fake_jobs, example_body):
    from api.specs import RunSpec
    from api.sweeps import SweepSpec

    dispatcher = client.app.state.dispatcher
    spec = SweepSpec.model_validate({"name": "ext", "base": example_body,
                                     "search": {"algorithms": {"sets": [[], ["channels_last"]]}}})
    sweep = dispatcher.sweeps.create_sweep(spec, driver="external", token="e")
    dispatcher.sweeps.apply_driver_report(sweep.id, SS.RUNNING)
    trial = dispatcher.sweeps.register_trial(sweep.id, trial_id="t1", spec=RunSpec.model_validate(example_body),
                                             params={}, token="t1")
    client.app.state.repo.transition(trial.id, S.RUNNING)
    dispatcher.tick()
    assert fake_jobs.submit_calls == [] and fake_jobs.jobs == {}
    reads, real = [], fake_jobs.job_logs
    fake_jobs.job_logs = lambda submission_id: reads.append(submission_id) or real(submission_id)
    page = client.get(f"/api/v1/runs/{trial.id}/logs").json()  # nothing to follow: no poll goes on
    assert (page["text"], page["source"], page["live"]) == ("", "none", False)
    page = client.get(f"/api/v1/sweeps/{sweep.id}/logs").json()  # it runs outside Ray's Jobs API
    assert (page["text"], page["source"], page["live"]) == ("", "none", False)
    assert reads == []  # and Ray is not asked


def test_live_logs_are_read_from_ray_and_followed_by_byte_offset(client, fake_jobs, example_body):
    run_id, job_id = _start(client, fake_jobs, example_body)
    fake_jobs.logs[job_id] = "line one\nline two\n"
    first = client.get(f"/api/v1/runs/{run_id}/logs", params={"limit": 12}).json()
    assert first["text"] == "line one\n" and first["live"] and first["source"] == "ray"  # cut at a line end
    second = client.get(f"/api/v1/runs/{run_id}/logs", params={"after": first["next_offset"]}).json()
    assert second["text"] == "line two\n"
    empty = client.get(f"/api/v1/runs/{run_id}/logs", params={"after": second["next_offset"]}).json()
    assert empty["text"] == "" and empty["next_offset"] == second["next_offset"]
    fake_jobs.logs[job_id] += "héllo\n"
    more = client.get(f"/api/v1/runs/{run_id}/logs", params={"after": second["next_offset"]}).json()
    assert more["text"] == "héllo\n" and more["size"] == len("line one\nline two\nhéllo\n".encode())


def test_live_logs_are_copied_every_few_ticks(client, fake_jobs, example_body, settings):
    run_id, job_id = _start(client, fake_jobs, example_body)
    fake_jobs.logs[job_id] = "still going\n"
    archiver = client.app.state.dispatcher.log_archiver
    for _ in range(archiver.every_ticks):
        client.app.state.dispatcher.tick()
    assert LogStore(settings.storage_url).read(run_id, 1) == b"still going\n"


def test_a_tick_copies_at_most_copies_per_tick_live_logs(client, fake_jobs, example_body, settings):
    archiver = client.app.state.dispatcher.log_archiver
    archiver.copies_per_tick = 2
    run_ids = [client.post("/api/v1/runs", json=example_body).json()["id"] for _ in range(5)]
    client.app.state.dispatcher.tick()  # submits all five
    started = [(run_id, f"run-{run_id}-attempt-1") for run_id in run_ids]
    for _, job_id in started:
        fake_jobs.set_status(job_id, "RUNNING")
        fake_jobs.logs[job_id] = f"{job_id}\n"
    read: list[str] = []
    real_job_logs = fake_jobs.job_logs
    fake_jobs.job_logs = lambda job_id: read.append(job_id) or real_job_logs(job_id)
    per_tick = []
    for _ in range(archiver.every_ticks + 2):
        before = len(read)
        client.app.state.dispatcher.tick()
        per_tick.append(len(read) - before)
    # 5 live logs due at once, at most 2 Ray calls a tick for them; each copied again every 10 ticks
    assert per_tick == [2, 2, 1] + [0] * (archiver.every_ticks - 3) + [2, 2]
    assert set(read[:5]) == {job_id for _, job_id in started}
    assert read[5:] == read[:4]  # copied longest ago first
    for run_id, job_id in started:
        assert LogStore(settings.storage_url).read(run_id, 1) == f"{job_id}\n".encode()


def _a_pass_waiting_on_a_slow_log(client, fake_jobs, body, text: str, answer: threading.Event) -> str:
    """Start a run whose log reads as ``text`` only once the test sets ``answer``, start the
    archiver's thread and tick: returns the run's id once the thread's pass waits on that read."""
    run_id, slow_job = _start(client, fake_jobs, body)
    fake_jobs.logs[slow_job] = text
    reading = threading.Event()
    real_job_logs = fake_jobs.job_logs

    def job_logs(job_id):
        if job_id == slow_job:
            reading.set()
            assert answer.wait(30)
        return real_job_logs(job_id)

    fake_jobs.job_logs = job_logs
    client.app.state.dispatcher.log_archiver.start()
    client.app.state.dispatcher.tick()  # hands the live run over
    assert reading.wait(30)
    return run_id


def test_on_its_thread_the_archiver_copies_while_ticks_go_on_without_waiting_for_it(client, fake_jobs,
                                                                                  example_body, settings):
    dispatcher, archiver = client.app.state.dispatcher, client.app.state.dispatcher.log_archiver
    answer = threading.Event()
    try:
        run_id = _a_pass_waiting_on_a_slow_log(client, fake_jobs, example_body, "slow to read\n", answer)
        for _ in range(3):
            dispatcher.tick()  # the ticks do not wait: each returns with the copy still waiting
        assert LogStore(settings.storage_url).read(run_id, 1) is None
        assert archiver._offered is not None  # the ticks' runs wait for its next pass, as one
    finally:
        answer.set()
        archiver.stop()  # after the pass it is in
    assert LogStore(settings.storage_url).read(run_id, 1) == b"slow to read\n"


def test_an_attempt_that_starts_and_ends_during_one_slow_pass_still_has_its_final_log_copied(
        client, fake_jobs, example_body, settings):
    dispatcher, archiver = client.app.state.dispatcher, client.app.state.dispatcher.log_archiver
    answer = threading.Event()
    try:
        _a_pass_waiting_on_a_slow_log(client, fake_jobs, example_body, "slow\n", answer)
        brief_run, brief_job = _start(client, fake_jobs, example_body)  # a short run comes and goes:
        dispatcher.tick()  # live in this tick's runs...
        client.app.state.repo.apply_worker_report(brief_run, S.RUNNING)
        client.app.state.repo.apply_worker_report(brief_run, S.COMPLETED)
        fake_jobs.set_status(brief_job, "SUCCEEDED")
        fake_jobs.logs[brief_job] = "brief\n"
        dispatcher.tick()  # ...ended in this one's, which replaces it before any pass took it
    finally:
        answer.set()
        archiver.stop()  # after the slow pass and the one offered last
    assert LogStore(settings.storage_url).read(brief_run, 1) == b"brief\n"


def test_the_archiver_keeps_one_thread_and_a_stopped_one_takes_no_more_offers(client, fake_jobs, example_body,
                                                                             settings):
    archiver = client.app.state.dispatcher.log_archiver
    threads_before = set(threading.enumerate())
    answer = threading.Event()
    try:
        run_id = _a_pass_waiting_on_a_slow_log(client, fake_jobs, example_body, "slow\n", answer)
        thread = archiver._thread
        archiver.start()
        assert archiver._thread is thread  # a second start makes no second thread
        archiver.stop(timeout_s=0.05)  # the pass still waits on the log: the join times out
        assert thread.is_alive() and archiver._thread is thread
        passes = archiver.passes
        archiver.offer({})  # a tick that outlasted the stop: neither taken nor run here
        assert archiver._offered is None and archiver.passes == passes
        archiver.start()  # a start after it serves with the same thread...
        assert archiver._thread is thread
        assert {t for t in set(threading.enumerate()) - threads_before if t.name == thread.name} == {thread}
        archiver.offer({})  # ...which takes offers again
        assert archiver._offered is not None
    finally:
        answer.set()
        archiver.stop()
    assert not thread.is_alive() and archiver._thread is None
    assert archiver.passes == passes + 1  # the offer after the restart had its pass
    assert LogStore(settings.storage_url).read(run_id, 1) == b"slow\n"
    passes_after_stop = archiver.passes
    client.app.state.dispatcher.tick()  # a tick after a clean stop: no pass, not even inline
    assert archiver.passes == passes_after_stop


def _five_live_runs(client, fake_jobs, example_body) -> list[str]:
    run_ids = [client.post("/api/v1/runs", json=example_body).json()["id"] for _ in range(5)]
    client.app.state.dispatcher.tick()  # submits all five
    for run_id in run_ids:
        fake_jobs.set_status(f"run-{run_id}-attempt-1", "RUNNING")
    return [f"run-{run_id}-attempt-1" for run_id in run_ids]


def test_copies_rotate_through_every_live_log_and_one_that_keeps_failing_holds_none_back(client, fake_jobs,
                                                                                        example_body):
    archiver = client.app.state.dispatcher.log_archiver
    archiver.copies_per_tick, archiver.every_ticks = 2, 1  # every log due on every tick: only the cap decides
    jobs = _five_live_runs(client, fake_jobs, example_body)
    broken = jobs[0]
    read: list[str] = []
    real_job_logs = fake_jobs.job_logs

    def job_logs(job_id):
        read.append(job_id)
        if job_id == broken:
            raise RuntimeError("Ray refused to read this log")
        return real_job_logs(job_id)

    fake_jobs.job_logs = job_logs
    per_tick = []
    for _ in range(5):
        before = len(read)
        client.app.state.dispatcher.tick()
        per_tick.append(read[before:])
    assert [len(tick) for tick in per_tick] == [2] * 5  # 10 tries: each of the 5 logs twice, in turn
    assert sorted(read) == sorted(jobs * 2) and sorted(read[:5]) == sorted(jobs) and read[5:] == read[:5]
    assert read.count(broken) == 2  # the failing one takes its turns only


def test_an_ended_attempt_missed_by_the_dispatcher_is_stored_when_first_read(client, fake_jobs, example_body,
                                                                           settings):
    run_id, job_id = _start(client, fake_jobs, example_body)
    client.app.state.repo.apply_worker_report(run_id, S.RUNNING)
    client.app.state.repo.apply_worker_report(run_id, S.COMPLETED)
    fake_jobs.set_status(job_id, "SUCCEEDED")
    fake_jobs.logs[job_id] = "done\n"
    client.app.state.dispatcher.log_archiver._watched.clear()  # as after a service restart
    client.app.state.dispatcher.tick()
    assert LogStore(settings.storage_url).read(run_id, 1) is None
    page = client.get(f"/api/v1/runs/{run_id}/logs").json()
    assert page["text"] == "done\n" and page["live"] is False
    assert LogStore(settings.storage_url).read(run_id, 1) == b"done\n"


def test_bad_attempt_and_unknown_run_are_refused(client, fake_jobs, example_body):
    run_id, _ = _start(client, fake_jobs, example_body)
    bad = client.get(f"/api/v1/runs/{run_id}/logs", params={"attempt": 2})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["field"] == "attempt" and "1..1" in bad.json()["detail"][0]["msg"]
    assert client.get(f"/api/v1/runs/{run_id}/logs", params={"attempt": 0}).status_code == 422
    assert client.get("/api/v1/runs/nope/logs").status_code == 404


def test_the_sdk_reads_logs(client, fake_jobs, example_body):
    import httpx

    from api.client import Client

    class ThroughTestClient(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            answer = client.request(request.method, str(request.url), headers=dict(request.headers))
            return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    run_id, job_id = _start(client, fake_jobs, example_body)
    fake_jobs.logs[job_id] = "hello\n"
    with Client("http://testserver", transport=ThroughTestClient()) as sdk:
        page = sdk.logs(run_id)
    assert page.text == "hello\n" and page.attempt == 1
