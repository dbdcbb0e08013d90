"""A worker killed with SIGKILL under Ray Train, at three points: the worker group restarts and
resumes from the newest committed checkpoint (on S3 over HTTP, reached from the Ray workers),
ending bitwise equal to the same run uninterrupted, and tells the service the step it resumed
from (so the service supersedes what the lost attempt reported after it). ``bench/faults.py``
runs the same at 20 points, a Ray Train run each."""

from __future__ import annotations

import pytest

from tests.workers.helpers_specs import tiny_spec
from tests.workers.kill_and_resume import run_killed, run_plain

pytestmark = pytest.mark.integration

# (kill at the end of batch, the checkpoint it resumes from), in the order training reaches them:
# at a batch whose save is due (that save never happens), mid-interval after a commit, and just
# before the final save. One run is killed at all three, so a point costs one worker-group restart
# (a Ray Train run per point cost a controller and two worker groups), and each kill must resume
# from its own checkpoint, which the reported steps and the resume messages show.
KILL_POINTS = [(4, 2), (5, 4), (7, 6)]


def test_resume_after_worker_kill_matches_uninterrupted_run(ray_client, s3_server, tmp_path):
    spec = tiny_spec(max_duration="8ba", deterministic=True, max_restarts=len(KILL_POINTS),
                     algorithms=[{"name": "cutmix"}], checkpoint={"interval": "2ba", "keep_last": 2},
                     parallelism={"strategy": "ddp", "num_workers": 2})
    storage_url = s3_server.url("ray-resume")
    plain_id = run_plain(spec, storage_url=storage_url, ray_dir=tmp_path / "ray")
    run = run_killed(spec, storage_url=storage_url, ray_dir=tmp_path / "ray", marker=tmp_path / "killed",
                     plain_id=plain_id, kill_at_batch=[kill_at for kill_at, _ in KILL_POINTS])
    metrics, service = run.metrics, run.service
    assert metrics["time/batch"] == 8
    # Each kill at its batch, each in a worker process of its own (a restarted group's).
    assert [batch for batch, _ in run.kills] == [kill_at for kill_at, _ in KILL_POINTS]
    assert len({pid for _, pid in run.kills}) == len(KILL_POINTS)
    # After each kill, a restart that resumed from that kill's checkpoint.
    assert [s["status"] for s in service.statuses] == ["RUNNING"] + ["RESTARTING", "RUNNING"] * len(KILL_POINTS)
    assert [s.get("step") for s in service.statuses] == [0] + [v for _, step in KILL_POINTS for v in (None, step)]
    for status, (_, resumed_from) in zip(service.statuses[2::2], KILL_POINTS):
        assert "resuming from s3://" in status["message"] and status["message"].endswith(f"-ba{resumed_from}")
    # Nothing lost: what was measured up to each checkpoint was spooled before it was written,
    # and the batches after it trained (and were reported) again after the restart.
    assert set(service.steps("train/loss")) == set(range(1, 9))
    assert [c["step"] for c in service.checkpoints if c["committed"]][-1] == 8
    # Bitwise equal where the attempt resumed from batch 4 saved (batch 6), and at the end.
    assert run.assert_final_checkpoints_bitwise_equal("checkpoints/ep1-ba6") > 0
    assert run.assert_final_checkpoints_bitwise_equal("checkpoints/ep2-ba8") > 0
