"""A worker killed with SIGKILL under Ray Train: the worker group restarts and resumes from the
newest committed checkpoint (on S3 over HTTP, reached from the Ray workers), ending bitwise
equal to the same run uninterrupted."""

from __future__ import annotations

import pytest

from tests.workers.helpers_specs import tiny_spec
from tests.workers.kill_and_resume import run_plain_then_killed

pytestmark = pytest.mark.integration


def test_resume_after_worker_kill_matches_uninterrupted_run(ray_client, s3_server, tmp_path, monkeypatch):
    spec = tiny_spec(max_duration="8ba", deterministic=True, max_restarts=1, algorithms=[{"name": "cutmix"}],
                     checkpoint={"interval": "2ba", "keep_last": 2},
                     parallelism={"strategy": "ddp", "num_workers": 2})
    # Killed at batch 5: after the commit of batch 4.
    run = run_plain_then_killed(spec, storage_url=s3_server.url("ray-resume"), tmp_path=tmp_path,
                                monkeypatch=monkeypatch, kill_at_batch=5)
    metrics, service = run.metrics, run.service
    assert metrics["time/batch"] == 8
    assert [s["status"] for s in service.statuses] == ["RUNNING", "RESTARTING", "RUNNING"]
    assert "resuming from s3://" in service.statuses[-1]["message"]
    # Batch 5 trained twice (before the kill and after the restart from batch 4); nothing skipped.
    assert service.steps("train/loss")[-4:] == [5, 6, 7, 8] and 4 in service.steps("train/loss")
    assert [c["step"] for c in service.checkpoints if c["committed"]][-1] == 8

    run.assert_final_checkpoints_bitwise_equal("checkpoints/ep1-ba8")
