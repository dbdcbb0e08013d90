"""``GET /runs/{id}/model``: streams the export the workers wrote; 404s name what is missing."""

from __future__ import annotations

import json

import pytest

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
