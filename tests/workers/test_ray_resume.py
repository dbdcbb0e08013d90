"""A worker killed with SIGKILL under Ray Train, at three points: the worker group restarts and
resumes from the newest committed checkpoint (on S3 over HTTP, reached from the Ray workers),
ending bitwise equal to the same run uninterrupted, and tells the service the step it resumed
from (so the service supersedes what the lost attempt reported after it). ``bench/faults.py``
runs the same at 20 points."""

from __future__ import annotations

import pytest

from tests.workers.helpers_specs import tiny_spec
from tests.workers.kill_and_resume import run_killed, run_plain

pytestmark = pytest.mark.integration

# (kill at the end of batch, the checkpoint it resumes from): mid-interval after a commit, at a
# batch whose save is due (that save never happens), and just before the final save.
KILL_POINTS = [(5, 4), (4, 2), (7, 6)]


def test_resume_after_worker_kill_matches_uninterrupted_run(ray_client, s3_server, tmp_path):
    spec = tiny_spec(max_duration="8ba", deterministic=True, max_restarts=1, algorithms=[{"name": "cutmix"}],
                     checkpoint={"interval": "2ba", "keep_last": 2},
                     parallelism={"strategy": "ddp", "num_workers": 2})
    storage_url = s3_server.url("ray-resume")
    plain_id = run_plain(spec, storage_url=storage_url, ray_dir=tmp_path / "ray")
    for kill_at, resumed_from in KILL_POINTS:
        run = run_killed(spec, storage_url=storage_url, ray_dir=tmp_path / "ray", marker=tmp_path / f"killed-{kill_at}",
                         plain_id=plain_id, kill_at_batch=kill_at)
        metrics, service = run.metrics, run.service
        assert metrics["time/batch"] == 8
        assert [s["status"] for s in service.statuses] == ["RUNNING", "RESTARTING", "RUNNING"]
        assert [s.get("step") for s in service.statuses] == [0, None, resumed_from]  # sent only with RUNNING
        assert "resuming from s3://" in service.statuses[-1]["message"]
        # Nothing lost: what was measured up to the checkpoint was spooled before it was written,
        # and the batches after it trained (and were reported) again after the restart.
        assert set(service.steps("train/loss")) == set(range(1, 9))
        assert [c["step"] for c in service.checkpoints if c["committed"]][-1] == 8
        assert run.assert_final_checkpoints_bitwise_equal("checkpoints/ep2-ba8") > 0
