"""``GET /runs/{id}/model``: streams the export the workers wrote; 404s name what is missing."""

from __future__ import annotations

import json

import pytest

from api.views import RunStatus
from service.storage_paths import export_url
from service.settings import Settings


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "home", public_url="http://tessera.test:8000",
                    worker_python="/opt/venv/bin/python", storage_url=f"file://{tmp_path}/storage")


def test_the_newest_or_chosen_export_is_streamed(client, example_body, settings):
    run_id = client.post("/api/v1/runs", json=example_body).json()["id"]
    missing = client.get(f"/api/v1/runs/{run_id}/model")
    assert missing.status_code == 404 and "no exported model yet" in missing.json()["detail"]
    for step, data in ((5, b"five"), (9, b"nine" * 300_000)):
        path = export_url(settings.storage_url, run_id, step, "safetensors").removeprefix("file://")
        import os

        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").write(data)
    newest = client.get(f"/api/v1/runs/{run_id}/model")
    assert newest.status_code == 200 and newest.content == b"nine" * 300_000
    assert newest.headers["x-tessera-step"] == "9" and f"{run_id}-step-9.safetensors" in newest.headers["content-disposition"]
    assert client.get(f"/api/v1/runs/{run_id}/model", params={"step": 5}).content == b"five"
    other = client.get(f"/api/v1/runs/{run_id}/model", params={"step": 6})
    assert other.status_code == 404 and "exported steps: [5, 9]" in other.json()["detail"]
    assert client.get(f"/api/v1/runs/{run_id}/model", params={"format": "torch"}).status_code == 404
    assert client.get(f"/api/v1/runs/{run_id}/model", params={"format": "onnx"}).status_code == 422
    assert client.get("/api/v1/runs/nope/model").status_code == 404


def test_a_run_that_ended_before_its_end_says_it_will_have_no_model_and_how_to_export_one(client, example_body):
    run_id = client.post("/api/v1/runs", json=example_body).json()["id"]
    assert client.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
    client.app.state.repo.transition(run_id, RunStatus.CANCELED)
    missing = client.get(f"/api/v1/runs/{run_id}/model")
    detail = missing.json()["detail"]
    assert missing.status_code == 404 and "yet" not in detail, detail
    assert detail.startswith(f"run {run_id} (CANCELED) has no exported model: a model is exported when training ends, "
                             "and this run ended before; export one of its committed checkpoints"), detail
    assert "tessera export RUN --step N" in detail


def test_exporting_an_earlier_step_submits_one_job_and_reads_its_state_back(client, example_body, settings,
                                                                            fake_jobs):
    """POST /exports writes a request and submits a Ray job (202, PENDING); asking again while it
    runs submits nothing; a failed job reads FAILED with its log and a new request retries; the
    file's arrival makes it READY (200). Steps without a committed, still-present checkpoint: 404."""
    import os
    from datetime import datetime, timezone

    from api.views import CheckpointReport, ReportedMetric

    run_id = client.post("/api/v1/runs", json=example_body).json()["id"]
    repo = client.app.state.repo
    folder = f"{settings.storage_url}/runs/{run_id}/checkpoints/ep1-ba10"
    now = datetime.now(timezone.utc)
    for step, url in ((10, folder), (20, folder.replace("ba10", "ba20"))):
        repo.add_checkpoint(run_id, CheckpointReport(step=step, epoch=1, time=now, committed=True, url=url,
                                                     world_size=2))
    repo.add_metrics(run_id, [ReportedMetric(step=s, key=k, value=v, time=now) for s, k, v in
                              ((10, "eval/accuracy", 0.5), (20, "eval/accuracy", 0.75), (10, "train/loss", 1.0))])
    os.makedirs(folder.removeprefix("file://"))
    open(folder.removeprefix("file://") + "/COMMITTED", "w").write("{}")  # step 20's folder is gone (retention)

    gone = client.post(f"/api/v1/runs/{run_id}/exports", json={"step": 20})
    assert gone.status_code == 404 and "steps with one: [10]" in gone.json()["detail"]
    assert client.post(f"/api/v1/runs/{run_id}/exports", json={"step": 11}).status_code == 404

    first = client.post(f"/api/v1/runs/{run_id}/exports", json={"step": 10})
    assert first.status_code == 202 and first.json()["status"] == "PENDING"
    job_id = first.json()["job_id"]
    job = fake_jobs.jobs[job_id]
    assert "-m workers.export --request" in job["entrypoint"]
    request = json.loads(open(job["entrypoint"].split("--request ")[1].removeprefix("file://")).read())
    assert request["checkpoint_url"] == folder and request["metrics"] == {"eval/accuracy": 0.5}
    assert client.post(f"/api/v1/runs/{run_id}/exports", json={"step": 10}).json()["job_id"] == job_id

    fake_jobs.set_status(job_id, "FAILED")
    fake_jobs.logs[job_id] = "Traceback\nRuntimeError: out of memory"
    [failed] = client.get(f"/api/v1/runs/{run_id}/exports").json()["data"]
    assert failed["status"] == "FAILED" and "out of memory" in failed["error"]
    retried = client.post(f"/api/v1/runs/{run_id}/exports", json={"step": 10}).json()
    assert retried["status"] == "PENDING" and retried["job_id"] != job_id

    path = export_url(settings.storage_url, run_id, 10, "safetensors").removeprefix("file://")
    open(path, "wb").write(b"weights")
    ready = client.post(f"/api/v1/runs/{run_id}/exports", json={"step": 10})
    assert ready.status_code == 200 and ready.json()["status"] == "READY"
    assert client.get(f"/api/v1/runs/{run_id}/model", params={"step": 10}).content == b"weights"
    assert client.post("/api/v1/runs/nope/exports", json={"step": 10}).status_code == 404
    assert client.post(f"/api/v1/runs/{run_id}/exports", json={"step": -1}).status_code == 422


def _with_checkpoint(client, settings, run_id: str, project: str = "default") -> None:
    """A committed checkpoint of ``run_id`` at step 10, its marker in the project's storage."""
    import os
    from datetime import datetime, timezone

    from api.views import CheckpointReport
    from service.storage_paths import project_storage_url

    folder = f"{project_storage_url(settings.storage_url, project)}/runs/{run_id}/checkpoints/ep1-ba10"
    client.app.state.repo.add_checkpoint(run_id, CheckpointReport(
        step=10, epoch=1, time=datetime.now(timezone.utc), committed=True, url=folder, world_size=1))
    os.makedirs(folder.removeprefix("file://"))
    open(folder.removeprefix("file://") + "/COMMITTED", "w").write("{}")


def _export_requested(client, example_body, settings, fake_jobs, project: str = "default") -> tuple[str, str]:
    """A run of ``project`` with a committed checkpoint at step 10 whose export was requested:
    (run id, job id). The fake Ray lists its jobs, as the real one does (one call a tick)."""
    run_id = client.post("/api/v1/runs", json=example_body, params={"project": project}).json()["id"]
    _with_checkpoint(client, settings, run_id, project)
    fake_jobs.states = lambda: {job_id: job["status"] for job_id, job in fake_jobs.jobs.items()}
    return run_id, client.post(f"/api/v1/runs/{run_id}/exports", json={"step": 10}).json()["job_id"]


@pytest.fixture
def hand_clock(client) -> list[float]:
    """The log archiver's clock, moved by the test (``clock[0] += s``), with the default 10 s wait."""
    clock = [1000.0]
    archiver = client.app.state.dispatcher.log_archiver
    archiver.clock, archiver.forget_after_s = (lambda: clock[0]), 10
    return clock


def test_a_failed_export_s_error_is_stored_and_ray_forgets_its_job(client, example_body, settings, fake_jobs,
                                                                    hand_clock):
    """Ray's job list is read every tick, so finished export jobs must leave it: once one has
    ended, its error is stored beside the request (in its project's storage) and Ray forgets the
    job 10 s later; the export still reads FAILED with that error, also when Ray writes the job
    again as failed (it does, for a job deleted too soon), which is then forgotten again. A new
    request retries; a job that wrote its file leaves no outcome and is forgotten too."""
    import os

    from service.export_jobs import outcome_url
    from service.storage_paths import project_storage_url

    assert client.post("/api/v1/projects", json={"name": "vision"}).status_code == 201
    run_id, job_id = _export_requested(client, example_body, settings, fake_jobs, project="vision")
    dispatcher = client.app.state.dispatcher
    dispatcher.tick()
    assert job_id in fake_jobs.jobs  # still running: nothing to store
    fake_jobs.set_status(job_id, "FAILED")
    fake_jobs.logs[job_id] = "Traceback\nRuntimeError: out of memory"
    dispatcher.tick()
    outcome = outcome_url(project_storage_url(settings.storage_url, "vision"), run_id, job_id)
    stored = open(outcome.removeprefix("file://")).read()
    assert json.loads(stored)["state"] == "FAILED" and "out of memory" in json.loads(stored)["error"]
    hand_clock[0] += 9.9
    dispatcher.tick()
    assert job_id in fake_jobs.jobs  # Ray's job manager may still be writing the job
    hand_clock[0] += 0.1
    dispatcher.tick()
    assert job_id not in fake_jobs.jobs
    [failed] = client.get(f"/api/v1/runs/{run_id}/exports").json()["data"]
    assert failed["status"] == "FAILED" and failed["job_id"] == job_id
    assert "ended FAILED" in failed["error"] and "RuntimeError: out of memory" in failed["error"]

    fake_jobs.jobs[job_id] = {"status": "FAILED"}  # written again: "Job supervisor actor died"
    fake_jobs.logs[job_id] = "Job supervisor actor died"
    [again] = client.get(f"/api/v1/runs/{run_id}/exports").json()["data"]
    assert again["error"] == failed["error"]  # the stored outcome, not the new record's
    dispatcher.tick()
    hand_clock[0] += 10
    dispatcher.tick()
    assert job_id not in fake_jobs.jobs and open(outcome.removeprefix("file://")).read() == stored

    retried = client.post(f"/api/v1/runs/{run_id}/exports", json={"step": 10}).json()
    assert retried["status"] == "PENDING" and retried["job_id"] != job_id
    path = export_url(project_storage_url(settings.storage_url, "vision"), run_id, 10, "safetensors")
    open(path.removeprefix("file://"), "wb").write(b"weights")
    fake_jobs.set_status(retried["job_id"], "SUCCEEDED")
    dispatcher.tick()
    hand_clock[0] += 10
    dispatcher.tick()
    assert retried["job_id"] not in fake_jobs.jobs
    assert not os.path.exists(outcome.replace(job_id, retried["job_id"]).removeprefix("file://"))
    assert [(e["step"], e["status"]) for e in client.get(f"/api/v1/runs/{run_id}/exports").json()["data"]] == \
        [(10, "READY")]


def test_a_failed_export_asked_again_before_ray_forgot_its_job_starts_a_new_one(client, example_body, settings,
                                                                                 fake_jobs):
    client.app.state.dispatcher.log_archiver.forget_after_s = 0
    run_id, job_id = _export_requested(client, example_body, settings, fake_jobs)
    fake_jobs.set_status(job_id, "STOPPED")
    retried = client.post(f"/api/v1/runs/{run_id}/exports", json={"step": 10}).json()
    assert retried["status"] == "PENDING" and retried["job_id"] != job_id
    for _ in range(2):  # the old job: its outcome stored, then forgotten; the new one runs on
        client.app.state.dispatcher.tick()
    assert job_id not in fake_jobs.jobs and fake_jobs.jobs[retried["job_id"]]["status"] == "PENDING"
    [export] = client.get(f"/api/v1/runs/{run_id}/exports").json()["data"]
    assert export["status"] == "PENDING" and export["job_id"] == retried["job_id"]


def test_export_jobs_that_cannot_be_settled_hold_none_back(client, example_body, settings, fake_jobs,
                                                            monkeypatch):
    """A finished export job whose run this database does not hold (another service's, on a
    shared cluster) stays in Ray's list and is not looked at again. A pass settles at most
    ``copies_per_tick`` export jobs; one whose outcome cannot be stored waits ``every_ticks``
    passes while the others, and a run's job due to be forgotten, go on; a Ray timeout while
    reading a job's log stores nothing (the log would be lost) and the job is tried again."""
    import service.export_jobs as export_jobs
    from service.ray_client import RayUnavailable

    dispatcher = client.app.state.dispatcher
    archiver = dispatcher.log_archiver
    archiver.forget_after_s, archiver.copies_per_tick, archiver.every_ticks = 0, 2, 3
    requested = sorted(_export_requested(client, example_body, settings, fake_jobs) for _ in range(3))
    dispatcher.tick()  # the runs' jobs start
    jobs = sorted(job_id for _, job_id in requested)
    foreign = "export-0-step-3-abcdef"  # sorts first: a pass looks at it before the others
    fake_jobs.jobs[foreign] = {"status": "FAILED"}
    run_job = next(job_id for job_id in fake_jobs.jobs if job_id.startswith("run-"))
    fake_jobs.set_status(run_job, "FAILED")  # a run's job, due to be forgotten after its final copy
    for job_id in jobs:
        fake_jobs.set_status(job_id, "FAILED")
        fake_jobs.logs[job_id] = f"the log of {job_id}"
    write_whole, logs_tail = export_jobs.write_whole, fake_jobs.logs_tail

    refusals = []

    def refused(fs, path, data):
        if jobs[0] in path:
            refusals.append(archiver.passes)
            raise PermissionError(f"storage refused {path}")
        write_whole(fs, path, data)

    def timing_out(job_id, lines=40):
        if job_id == jobs[1]:
            raise RayUnavailable("Ray did not answer in 10 s")
        return logs_tail(job_id, lines)

    monkeypatch.setattr(export_jobs, "write_whole", refused)
    monkeypatch.setattr(fake_jobs, "logs_tail", timing_out)
    first = archiver.passes + 1
    dispatcher.tick()  # the foreign job and jobs[0], which cannot be stored: tried again at pass first + 3
    dispatcher.tick()  # jobs[1]: Ray times out, the pass stalls
    monkeypatch.setattr(fake_jobs, "logs_tail", logs_tail)
    dispatcher.tick()  # jobs[0] and jobs[1] wait; jobs[2] is stored
    dispatcher.tick()  # jobs[2] forgotten; jobs[0]'s second try fails
    assert [job_id in fake_jobs.jobs for job_id in jobs] == [True, True, False]
    assert refusals == [first, first + 3]
    assert run_job not in fake_jobs.jobs and foreign in fake_jobs.jobs
    monkeypatch.setattr(export_jobs, "write_whole", write_whole)
    for _ in range(4):  # jobs[1] stored (its retry is due), forgotten; then jobs[0], at its third try
        dispatcher.tick()
    assert not any(job_id in fake_jobs.jobs for job_id in jobs) and foreign in fake_jobs.jobs
    fake_jobs.logs.clear()  # what Ray had is gone with the jobs: the errors are the stored ones
    for run_id, job_id in requested:
        [export] = client.get(f"/api/v1/runs/{run_id}/exports").json()["data"]
        assert export["status"] == "FAILED" and export["error"].endswith(f"the log of {job_id}"), export


def test_deleting_a_run_stops_its_running_export_and_ray_still_forgets_the_job(client, example_body, settings,
                                                                                fake_jobs):
    """Each export job is marked as this service's before it is submitted (export-jobs/{job}.json):
    Ray forgets it once it has ended even when its run has been deleted meanwhile, and the mark
    goes then. Deleting a run first stops its running export (it would write the model under the
    deleted folder); a live run's deletion is refused and stops nothing."""
    from pathlib import Path

    from service.storage_paths import export_job_url

    client.app.state.dispatcher.log_archiver.forget_after_s = 0
    run_id, job_id = _export_requested(client, example_body, settings, fake_jobs)
    mark = Path(export_job_url(settings.storage_url, job_id).removeprefix("file://"))
    assert json.loads(mark.read_text()) == {"run_id": run_id, "step": 10}
    fake_jobs.set_status(job_id, "RUNNING")
    client.app.state.dispatcher.tick()  # the run starts: a live run
    assert client.delete(f"/api/v1/runs/{run_id}").status_code == 409
    assert fake_jobs.jobs[job_id]["status"] == "RUNNING"

    _, other_job = _export_requested(client, example_body, settings, fake_jobs)  # another run's: left running
    fake_jobs.set_status(other_job, "RUNNING")
    client.post(f"/api/v1/runs/{run_id}/cancel")
    fake_jobs.set_status(f"run-{run_id}-attempt-1", "STOPPED")
    client.app.state.dispatcher.tick()
    assert client.get(f"/api/v1/runs/{run_id}").json()["status"] == "CANCELED"
    stop = fake_jobs.stop
    run_there_when_stopped = []
    fake_jobs.stop = lambda job: (run_there_when_stopped.append(client.get(f"/api/v1/runs/{run_id}").status_code),
                                  stop(job))
    assert client.delete(f"/api/v1/runs/{run_id}").status_code == 200
    assert run_there_when_stopped == [200] and fake_jobs.jobs[job_id]["status"] == "STOPPED"
    assert fake_jobs.jobs[other_job]["status"] == "RUNNING"
    for _ in range(2):  # settled (this service's by its mark; its run is gone: nothing stored), then forgotten
        client.app.state.dispatcher.tick()
    assert job_id not in fake_jobs.jobs and not mark.exists()
    assert not Path(f"{settings.storage_url.removeprefix('file://')}/runs/{run_id}").exists()  # nothing written back


def test_an_export_requested_while_its_run_is_deleted_is_stopped_and_a_refused_one_leaves_no_mark(
        client, example_body, settings, fake_jobs, monkeypatch):
    """An export request that submits its job while the run is deleted (after the deletion
    stopped the run's exports) stops the job itself and answers 404; a job Ray refused was
    never submitted and leaves no mark."""
    from pathlib import Path

    import service.export_jobs as export_jobs
    from service.ray_client import RayRefused, RayUnavailable
    from service.storage_paths import export_job_url

    other = client.post("/api/v1/runs", json=example_body).json()["id"]
    _with_checkpoint(client, settings, other)
    marks = Path(export_job_url(settings.storage_url, "x").removeprefix("file://")).parent
    for error, status in ((RayRefused("Ray answered POST /api/jobs/ with 400: bad runtime_env"), 502),
                          (RayUnavailable("Ray did not answer in 10 s"), 503)):
        fake_jobs.fail_submit = error
        assert client.post(f"/api/v1/runs/{other}/exports", json={"step": 10}).status_code == status
        assert not list(marks.glob(f"export-{other}-*"))  # never submitted: no mark
    fake_jobs.fail_submit = None
    fake_jobs.states = lambda: {job_id: job["status"] for job_id, job in fake_jobs.jobs.items()}

    client.post(f"/api/v1/runs/{other}/cancel")
    client.app.state.dispatcher.tick()
    request = export_jobs.ExportRequests.request

    def deleted_meanwhile(self, *args, **kwargs):
        view = request(self, *args, **kwargs)
        assert client.delete(f"/api/v1/runs/{other}").status_code == 200  # while the export was submitted
        return view

    monkeypatch.setattr(export_jobs.ExportRequests, "request", deleted_meanwhile)
    late = client.post(f"/api/v1/runs/{other}/exports", json={"step": 10})
    assert late.status_code == 404
    [job_id] = [job_id for job_id in fake_jobs.jobs if job_id.startswith(f"export-{other}-")]
    assert fake_jobs.jobs[job_id]["status"] == "STOPPED"


def test_deleting_a_sweep_stops_its_trials_exports_and_ray_forgets_them(client, example_body, settings, fake_jobs):
    client.app.state.dispatcher.log_archiver.forget_after_s = 0
    fake_jobs.states = lambda: {job_id: job["status"] for job_id, job in fake_jobs.jobs.items()}
    sweep = client.post("/api/v1/sweeps", params={"driver": "external"}, json={
        "name": "s", "base": example_body, "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}}).json()
    driver = {"Authorization": f"Bearer {sweep['driver_token']}"}
    trials = [client.post(f"/api/v1/sweeps/{sweep['id']}/trials", headers=driver,
                          json={"trial_id": t, "spec": example_body, "params": {}}).json()["run_id"] for t in ("a", "b")]
    jobs = []
    for trial in trials:
        _with_checkpoint(client, settings, trial)
        jobs.append(client.post(f"/api/v1/runs/{trial}/exports", json={"step": 10}).json()["job_id"])
    fake_jobs.set_status(jobs[0], "RUNNING")
    fake_jobs.set_status(jobs[1], "FAILED")  # ended: not stopped, forgotten all the same
    for trial_id in ("a", "b"):
        client.post(f"/api/v1/sweeps/{sweep['id']}/trials/{trial_id}/end", headers=driver, json={"outcome": "failed"})
    for status in ("RUNNING", "COMPLETED"):
        client.post(f"/api/v1/sweeps/{sweep['id']}/report/status", headers=driver, json={"status": status})
    assert client.delete(f"/api/v1/sweeps/{sweep['id']}").status_code == 200
    assert fake_jobs.stop_calls == [jobs[0]] and fake_jobs.jobs[jobs[0]]["status"] == "STOPPED"
    for _ in range(2):
        client.app.state.dispatcher.tick()
    assert not any(job_id in fake_jobs.jobs for job_id in jobs)


def test_an_export_requested_while_the_deletion_removes_the_run_is_stopped_after_it(client, example_body, settings,
                                                                                    fake_jobs, monkeypatch):
    """A request that submits after the deletion stopped the run's exports but before its rows
    went still finds the run, and answers 202: the deletion looks at Ray's jobs again once done."""
    import service.routes.housekeeping as housekeeping

    run_id, first = _export_requested(client, example_body, settings, fake_jobs)
    fake_jobs.set_status(first, "FAILED")
    client.post(f"/api/v1/runs/{run_id}/cancel")
    client.app.state.dispatcher.tick()
    delete_run, late = housekeeping.delete_run, []

    def with_a_request_first(*args, **kwargs):
        late.append(client.post(f"/api/v1/runs/{run_id}/exports", json={"step": 10}).json())
        return delete_run(*args, **kwargs)

    monkeypatch.setattr(housekeeping, "delete_run", with_a_request_first)
    assert client.delete(f"/api/v1/runs/{run_id}").status_code == 200
    assert late[0]["status"] == "PENDING" and fake_jobs.jobs[late[0]["job_id"]]["status"] == "STOPPED"


def test_deleting_a_trial_of_a_live_sweep_is_refused_before_its_exports_are_stopped(client, example_body, settings,
                                                                                      fake_jobs):
    fake_jobs.states = lambda: {job_id: job["status"] for job_id, job in fake_jobs.jobs.items()}
    sweep = client.post("/api/v1/sweeps", params={"driver": "external"}, json={
        "name": "s", "base": example_body, "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}}).json()
    driver = {"Authorization": f"Bearer {sweep['driver_token']}"}
    trial = client.post(f"/api/v1/sweeps/{sweep['id']}/trials", headers=driver,
                        json={"trial_id": "a", "spec": example_body, "params": {}}).json()["run_id"]
    _with_checkpoint(client, settings, trial)
    job_id = client.post(f"/api/v1/runs/{trial}/exports", json={"step": 10}).json()["job_id"]
    fake_jobs.set_status(job_id, "RUNNING")
    client.post(f"/api/v1/sweeps/{sweep['id']}/trials/a/end", headers=driver, json={"outcome": "failed"})
    client.post(f"/api/v1/sweeps/{sweep['id']}/report/status", headers=driver, json={"status": "RUNNING"})
    refused = client.delete(f"/api/v1/runs/{trial}")
    assert refused.status_code == 409 and "delete it once the sweep has ended" in refused.json()["detail"]
    assert client.delete(f"/api/v1/sweeps/{sweep['id']}").status_code == 409
    assert fake_jobs.stop_calls == [] and fake_jobs.jobs[job_id]["status"] == "RUNNING"


def test_an_export_job_from_before_marks_is_marked_when_its_run_is_deleted_and_a_mark_outlives_a_failed_forget(
        client, example_body, settings, fake_jobs):
    from pathlib import Path

    from service.log_archive import FORGET_TRIES
    from service.ray_client import RayAmbiguous
    from service.storage_paths import export_job_url

    archiver = client.app.state.dispatcher.log_archiver
    archiver.forget_after_s = 0
    run_id, job_id = _export_requested(client, example_body, settings, fake_jobs)
    mark = Path(export_job_url(settings.storage_url, job_id).removeprefix("file://"))
    mark.unlink()  # submitted by a version without marks
    fake_jobs.set_status(job_id, "RUNNING")
    client.post(f"/api/v1/runs/{run_id}/cancel")
    client.app.state.dispatcher.tick()
    assert client.delete(f"/api/v1/runs/{run_id}").status_code == 200
    assert mark.exists() and fake_jobs.jobs[job_id]["status"] == "STOPPED"
    delete, refusals = fake_jobs.delete, []

    def refusing(job):
        if job == job_id:
            refusals.append(job)
            raise RayAmbiguous(f"Ray answered DELETE /api/jobs/{job} with 500")
        return delete(job)

    fake_jobs.delete = refusing
    for _ in range(FORGET_TRIES + 2):
        client.app.state.dispatcher.tick()
    assert len(refusals) == FORGET_TRIES and job_id in fake_jobs.jobs and mark.exists()  # left, still marked


def test_an_export_whose_mark_cannot_be_written_is_a_503_and_leaves_no_request(client, example_body, settings,
                                                                                fake_jobs, monkeypatch):
    import service.export_jobs as export_jobs

    run_id = client.post("/api/v1/runs", json=example_body).json()["id"]
    _with_checkpoint(client, settings, run_id)
    write_whole = export_jobs.write_whole

    def refusing_marks(fs, path, data):
        if "/export-jobs/" in path:
            raise PermissionError(f"storage refused {path}")
        return write_whole(fs, path, data)

    monkeypatch.setattr(export_jobs, "write_whole", refusing_marks)
    refused = client.post(f"/api/v1/runs/{run_id}/exports", json={"step": 10})
    assert refused.status_code == 503 and "storage refused marking the export job" in refused.json()["detail"]
    assert client.get(f"/api/v1/runs/{run_id}/exports").json()["data"] == [] and fake_jobs.submit_calls == []


def test_marks_of_export_jobs_ray_never_listed_at_two_looks_apart_are_removed(client, example_body, settings,
                                                                              fake_jobs, hand_clock):
    """A mark whose job never reached Ray (the service stopped between marking and submitting it)
    would stay forever: every ``stray_marks_after_s`` the archiver lists the marks, and removes
    those Ray listed at neither that look nor the one before. A job submitted after the first
    look keeps its mark, as does one Ray lists; a partial write in the folder is no mark."""
    from pathlib import Path

    from service.export_jobs import mark_export_job
    from service.storage_paths import export_job_url

    archiver = client.app.state.dispatcher.log_archiver
    assert archiver.stray_marks_after_s == 600
    run_id, live = _export_requested(client, example_body, settings, fake_jobs)
    fake_jobs.set_status(live, "RUNNING")
    stray, submitted_late, marked_late = (f"export-{run_id}-step-{step}-abcdef" for step in (20, 30, 40))
    for job_id in (stray, submitted_late):
        mark_export_job(settings.storage_url, job_id)
    marks = Path(export_job_url(settings.storage_url, live).removeprefix("file://")).parent
    (marks / f"{stray}.json.1234abcd.partial").write_text("{")
    dispatcher = client.app.state.dispatcher

    def marked() -> set[str]:
        return {path.name for path in marks.iterdir()}

    dispatcher.tick()  # the first look: stray and submitted_late are not listed
    assert archiver.exports.marked() == {live, stray, submitted_late}  # the partial write is no mark
    fake_jobs.jobs[submitted_late] = {"status": "PENDING"}  # Ray got it after the tick's list
    mark_export_job(settings.storage_url, marked_late)
    hand_clock[0] += 599
    dispatcher.tick()
    assert f"{stray}.json" in marked()  # not looked at again yet
    hand_clock[0] += 1
    archiver.tick(None, states=fake_jobs.states(), listed_at=hand_clock[0] - 0.5)  # a pass that ran late
    assert f"{stray}.json" in marked()  # its list was read too soon after the first look to tell
    dispatcher.tick()  # the second look
    assert marked() == {f"{live}.json", f"{submitted_late}.json", f"{marked_late}.json",
                        f"{stray}.json.1234abcd.partial"}
    hand_clock[0] += 600
    dispatcher.tick()  # the third: marked_late was not listed at the second either
    assert marked() == {f"{live}.json", f"{submitted_late}.json", f"{stray}.json.1234abcd.partial"}
    assert fake_jobs.jobs[live]["status"] == "RUNNING"


def test_a_stray_mark_whose_listing_or_removal_fails_is_removed_at_a_later_look(client, example_body, settings,
                                                                                fake_jobs, hand_clock):
    from pathlib import Path

    from service.export_jobs import mark_export_job
    from service.storage_paths import export_job_url

    run_id, _ = _export_requested(client, example_body, settings, fake_jobs)
    stray = f"export-{run_id}-step-20-abcdef"
    mark_export_job(settings.storage_url, stray)
    mark = Path(export_job_url(settings.storage_url, stray).removeprefix("file://"))
    dispatcher, exports = client.app.state.dispatcher, client.app.state.dispatcher.log_archiver.exports
    listing, unmark = exports.marked, exports.unmark

    def storage_away(*_):
        raise ConnectionError("storage is away")

    dispatcher.tick()  # the first look
    exports.marked = storage_away
    hand_clock[0] += 600
    dispatcher.tick()  # the second: the listing fails, nothing is removed
    exports.marked, exports.unmark = listing, storage_away
    hand_clock[0] += 600
    dispatcher.tick()  # the third: the removal fails
    assert mark.exists()
    exports.unmark = unmark
    hand_clock[0] += 599
    dispatcher.tick()
    assert mark.exists()  # a failed removal waits for the next look
    hand_clock[0] += 1
    dispatcher.tick()
    assert not mark.exists()
