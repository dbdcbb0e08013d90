"""The startup reconciler: the database agrees with Ray before anything new is submitted."""

from __future__ import annotations

from fastapi.testclient import TestClient

from api.views import RunStatus
from tests.conftest import ADMIN_HEADERS
from service.app import create_app
from service.dispatcher import Dispatcher
from service.job_follower import JobFollower
from service.job_kinds import RUN_JOBS
from service.settings import Settings

S = RunStatus


def reconcile(repo, jobs):
    """The runs' half of ``Dispatcher.reconcile``, the app's startup reconcile."""
    return JobFollower(RUN_JOBS, repo, jobs, Settings()).reconcile()


def _submitted(repo, fake_jobs, settings, spec, *, running: bool = True):
    run = repo.create_run(spec)
    Dispatcher(repo, fake_jobs, settings).tick()
    job_id = f"run-{run.id}-attempt-1"
    if running:
        repo.transition(run.id, S.RUNNING)
        fake_jobs.set_status(job_id, "RUNNING")
    return repo.get_run(run.id), job_id


def test_run_whose_job_is_still_running_is_left_alone(sqlite_repo, fake_jobs, settings, example_spec):
    run, job_id = _submitted(sqlite_repo, fake_jobs, settings, example_spec)
    token = fake_jobs.jobs[job_id]["env"]["TESSERA_RUN_TOKEN"]
    events_before = sqlite_repo.events(run.id)
    assert reconcile(sqlite_repo, fake_jobs) == []
    assert sqlite_repo.get_run(run.id) == run and sqlite_repo.events(run.id) == events_before
    assert sqlite_repo.check_token(run.id, token)  # its worker keeps reporting
    assert fake_jobs.submit_calls == [job_id]


def test_starting_run_whose_job_is_pending_is_left_alone(sqlite_repo, fake_jobs, settings, example_spec):
    run, _ = _submitted(sqlite_repo, fake_jobs, settings, example_spec, running=False)
    assert reconcile(sqlite_repo, fake_jobs) == [] and sqlite_repo.get_run(run.id).status is S.STARTING


def test_run_whose_job_is_gone_is_requeued_as_the_next_attempt_saying_why(sqlite_repo, fake_jobs, settings,
                                                                         example_spec):
    run, job_id = _submitted(sqlite_repo, fake_jobs, settings, example_spec)
    fake_jobs.forget(job_id)
    [fix] = reconcile(sqlite_repo, fake_jobs)
    requeued = sqlite_repo.get_run(run.id)
    assert requeued.status is S.QUEUED and requeued.attempt == 2
    event = sqlite_repo.events(run.id)[-1]
    assert (event.from_status, event.to_status, event.attempt) == (S.RUNNING, S.QUEUED, 2)
    assert event.message == f"reconciler: Ray job {job_id} not found after a service restart; re-queued as attempt 2"
    assert run.id in fix


def test_canceling_run_whose_job_is_gone_becomes_canceled(sqlite_repo, fake_jobs, settings, example_spec):
    run, job_id = _submitted(sqlite_repo, fake_jobs, settings, example_spec)
    sqlite_repo.transition(run.id, S.CANCELING)
    fake_jobs.forget(job_id)
    reconcile(sqlite_repo, fake_jobs)
    assert sqlite_repo.get_run(run.id).status is S.CANCELED


def test_run_whose_job_failed_while_the_service_was_down_fails_with_its_logs(sqlite_repo, fake_jobs, settings,
                                                                             example_spec):
    run, job_id = _submitted(sqlite_repo, fake_jobs, settings, example_spec)
    fake_jobs.set_status(job_id, "FAILED")
    fake_jobs.logs[job_id] = "Traceback (most recent call last):\nRuntimeError: NCCL timeout"
    reconcile(sqlite_repo, fake_jobs)
    failed = sqlite_repo.get_run(run.id)
    assert failed.status is S.FAILED and failed.error.endswith("RuntimeError: NCCL timeout")


def test_unreachable_ray_changes_nothing(sqlite_repo, fake_jobs, settings, example_spec):
    run, _ = _submitted(sqlite_repo, fake_jobs, settings, example_spec)

    def unreachable(_job_id):
        raise ConnectionError("Failed to connect to Ray")

    fake_jobs.status = unreachable
    assert reconcile(sqlite_repo, fake_jobs) == []
    assert sqlite_repo.get_run(run.id) == run


def test_service_restart_resubmits_only_runs_whose_jobs_were_lost(settings, fake_jobs, example_body):
    """Two runs are RUNNING; the service restarts; Ray kept one job and lost the other."""
    with TestClient(create_app(settings, jobs=fake_jobs, run_dispatcher=False), headers=ADMIN_HEADERS) as client:
        ids = [client.post("/api/v1/runs", json=example_body).json()["id"] for _ in range(2)]
        client.app.state.dispatcher.tick()
        for run_id in ids:
            token = fake_jobs.jobs[f"run-{run_id}-attempt-1"]["env"]["TESSERA_RUN_TOKEN"]
            client.post(f"/api/v1/runs/{run_id}/report/status", json={"status": "RUNNING"},
                        headers={"Authorization": f"Bearer {token}"})
            fake_jobs.set_status(f"run-{run_id}-attempt-1", "RUNNING")
    kept, lost = ids
    fake_jobs.forget(f"run-{lost}-attempt-1")

    with TestClient(create_app(settings, jobs=fake_jobs, run_dispatcher=False), headers=ADMIN_HEADERS) as client:
        assert client.get(f"/api/v1/runs/{kept}").json()["status"] == "RUNNING"
        lost_run = client.get(f"/api/v1/runs/{lost}").json()
        assert (lost_run["status"], lost_run["attempt"]) == ("QUEUED", 2)
        client.app.state.dispatcher.tick()
    assert fake_jobs.submit_calls[2:] == [f"run-{lost}-attempt-2"]
