"""A worker killed with SIGKILL under Ray Train: the worker group restarts and resumes from the
newest committed checkpoint (on S3 over HTTP, reached from the Ray workers), ending bitwise
equal to the same run uninterrupted."""

from __future__ import annotations

import uuid

import pytest

from tests.workers.checkpoint_helpers import assert_bitwise_equal
from tests.workers.helpers_specs import tiny_spec
from tests.workers.test_ray_training import TOKEN, RecordingService
from workers.paths import run_url as run_url_for
from workers.ray_train import fit_with_ray

pytestmark = pytest.mark.integration


def test_resume_after_worker_kill_matches_uninterrupted_run(ray_client, s3_server, tmp_path, monkeypatch):
    spec = tiny_spec(max_duration="8ba", deterministic=True, max_restarts=1, algorithms=[{"name": "cutmix"}],
                     checkpoint={"interval": "2ba", "keep_last": 2},
                     parallelism={"strategy": "ddp", "num_workers": 2})
    storage_url = s3_server.url("ray-resume")
    plain_id, killed_id = f"plain-{uuid.uuid4().hex[:6]}", f"killed-{uuid.uuid4().hex[:6]}"

    fit_with_ray(spec, run_id=plain_id, storage_path=str(tmp_path / "ray"), storage_url=storage_url)

    marker = tmp_path / "killed"
    monkeypatch.setenv("TESSERA_TEST_KILL_AT_BATCH", "5")  # after the commit of batch 4
    monkeypatch.setenv("TESSERA_TEST_KILL_MARKER", str(marker))
    with RecordingService() as service:
        metrics = fit_with_ray(spec, run_id=killed_id, service_url=service.url, token=TOKEN,
                               storage_path=str(tmp_path / "ray"), storage_url=storage_url)
    assert marker.exists(), "the worker was never killed"
    assert metrics["time/batch"] == 8
    assert [s["status"] for s in service.statuses] == ["RUNNING", "RESTARTING", "RUNNING"]
    assert "resuming from s3://" in service.statuses[-1]["message"]
    # Batch 5 trained twice (before the kill and after the restart from batch 4); nothing skipped.
    assert service.steps("train/loss")[-4:] == [5, 6, 7, 8] and 4 in service.steps("train/loss")
    assert [c["step"] for c in service.checkpoints if c["committed"]][-1] == 8

    final = "checkpoints/ep1-ba8"
    assert_bitwise_equal(f"{run_url_for(storage_url, plain_id)}/{final}", f"{run_url_for(storage_url, killed_id)}/{final}")
