"""A run's outputs end to end, on a live service with Ray and S3 storage (moto over HTTP): it
trains to COMPLETED with a tensorboard logger; its log is read through the API (and lands in
S3); its model is exported with ``tessera export`` and reloaded with ``load_model`` to give
exactly the eval accuracy the run reported; an earlier checkpoint is exported on request by a Ray
job (``tessera export --step``) and holds exactly that checkpoint's weights; Ray forgets the
run's job and the export's once they have ended."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import torch
from ray.job_submission import JobSubmissionClient

from api.views import RunStatus
from tests.e2e.conftest import wait_for_status, wait_until
from tests.workers.helpers_specs import digits_spec
from tests.workers.test_export import eval_metrics_of
from workers.export import load_model

pytestmark = pytest.mark.integration
TESSERA = str(Path(sys.executable).with_name("tessera"))


def _keys(s3_server, prefix: str) -> list[str]:
    listing = boto3.client("s3", endpoint_url=s3_server.endpoint_url).list_objects_v2(
        Bucket=s3_server.bucket, Prefix=prefix)
    return [o["Key"] for o in listing.get("Contents", [])]


def test_logs_tensorboard_and_the_exported_model_of_a_completed_run(s3_service, s3_server, ray_head, tmp_path):
    spec = digits_spec(name="outputs-e2e", max_duration="1ep", algorithms=[{"name": "blurpool"}],
                       loggers=[{"name": "tensorboard"}], checkpoint={"interval": "11ba", "keep_last": 3})
    client = s3_service.client()
    run_id = client.create_run(spec.model_dump(mode="json")).id
    run = wait_for_status(client, run_id, {RunStatus.FAILED, RunStatus.COMPLETED}, timeout=300)
    assert run.status is RunStatus.COMPLETED, run.error

    # Followed until it is no longer live (the job's driver writes its last lines after the run
    # ended), the log holds the driver's last line.
    wait_until(lambda: not client.logs(run_id).live, timeout=60, what="the job to finish")
    page = client.logs(run_id)
    assert page.attempt == 1 and page.next_offset == page.size and f"run {run_id} completed" in page.text
    prefix = f"{s3_service.storage_prefix}/runs/{run_id}"
    wait_until(lambda: f"{prefix}/logs/attempt-1.log" in _keys(s3_server, f"{prefix}/logs/"), timeout=60,
               what="the attempt's log copied to S3")
    assert client.logs(run_id).source == "storage"
    # Stored, the job is forgotten by Ray, whose job list each dispatcher tick reads.
    jobs = JobSubmissionClient(ray_head.dashboard_url)
    wait_until(lambda: f"run-{run_id}-attempt-1" not in {j.submission_id for j in jobs.list_jobs()}, timeout=60,
               what="Ray to forget the finished job")
    final = client.logs(run_id)  # the final log, stored before Ray was told to forget the job
    assert final.source == "storage" and f"run {run_id} completed" in final.text
    assert any("/tensorboard/events.out.tfevents" in key for key in _keys(s3_server, f"{prefix}/tensorboard/"))

    out = tmp_path / "model.safetensors"
    cli_env = {"PATH": str(Path(sys.executable).parent), "TESSERA_API_KEY": os.environ["TESSERA_API_KEY"],
               "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    exported = subprocess.run([TESSERA, "export", run_id, "-o", str(out), "--url", s3_service.url],
                              capture_output=True, text=True, timeout=120, env=cli_env)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    model = load_model(str(out))
    with torch.no_grad():
        assert eval_metrics_of(model, spec)["eval/accuracy"] == run.summary["eval/accuracy"]

    # An earlier checkpoint, exported on request: a Ray job consolidates the sharded checkpoint.
    first = next(c for c in client.list_checkpoints(run_id) if c.committed)
    assert first.step == 11
    early = tmp_path / "early.pt"
    exported = subprocess.run([TESSERA, "export", run_id, "--step", "11", "--format", "torch", "-o", str(early),
                               "--url", s3_service.url], capture_output=True, text=True, timeout=300, env=cli_env)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert [(e.step, e.status) for e in client.list_exports(run_id)] == [(11, "READY"), (22, "READY")]
    # The export's job is forgotten by Ray once it has ended, as the run's was; the export stays READY.
    wait_until(lambda: not any((j.submission_id or "").startswith(f"export-{run_id}-") for j in jobs.list_jobs()),
               timeout=60, what="Ray to forget the finished export job")
    assert [(e.step, e.status) for e in client.list_exports(run_id)] == [(11, "READY"), (22, "READY")]
    from workers.checkpoint import read_checkpoint

    expected = read_checkpoint(first.url)["model"]
    weights = load_model(str(early)).state_dict()
    assert all(torch.equal(weights[key], expected[key]) for key in expected)
