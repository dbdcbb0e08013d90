"""``tessera fork`` and ``tessera continue`` (and the SDK calls under them) against the real app
on a loopback port (no Ray)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from api.client import Client
from api.views import CheckpointReport, RunStatus
from cli.lineage import BadAssignment, fork_source, patch_from_assignments
from cli.main import app
from tests.dashboard.conftest import LocalService


def test_set_assignments_become_a_nested_patch_with_yaml_values():
    patch = patch_from_assignments(["optimizer.lr=0.05", "max_duration=4ep", "optimizer.nesterov=true",
                                    "algorithms=[{name: cutmix}]", "scheduler=null"])
    assert patch == {"optimizer": {"lr": 0.05, "nesterov": True}, "max_duration": "4ep",
                     "algorithms": [{"name": "cutmix"}], "scheduler": None}
    for bad in ("optimizer.lr", "=3", "optimizer..lr=1"):
        with pytest.raises(BadAssignment, match="dotted.key=value"):
            patch_from_assignments([bad])
    assert fork_source("latest") == "latest" and fork_source("120") == 120
    with pytest.raises(BadAssignment, match="batch number"):
        fork_source("-3")


def test_fork_and_continue_from_the_cli(tmp_path, example_body):
    runner = CliRunner()
    with LocalService(tmp_path) as service, Client(service.url) as client:
        url = ["--url", service.url]
        parent = client.create_run(example_body)
        forked = runner.invoke(app, ["fork", parent.id, "--set", "optimizer.lr=0.05", "--set", "max_duration=4ep",
                                     "--from", "scratch", *url])
        assert forked.exit_code == 0, forked.output
        [child] = client.run_children(parent.id)
        assert f"forked run {child.id} from {parent.id} (fresh weights)" in forked.output
        assert child.spec["optimizer"]["lr"] == 0.05 and child.spec["max_duration"] == "4ep"
        assert child.parent_id == parent.id and child.fork.patch == {"optimizer": {"lr": 0.05}, "max_duration": "4ep"}
        assert f"forked from {parent.id} (scratch)" in runner.invoke(app, ["show", child.id, *url]).output

        refused = runner.invoke(app, ["fork", parent.id, "--set", "model.name=resnet18", *url])
        assert refused.exit_code == 1 and "422" in refused.output and "model" in refused.output

        early = runner.invoke(app, ["continue", parent.id, "--max-duration", "5ep", *url])
        assert early.exit_code == 1 and "409" in early.output and "only COMPLETED runs" in early.output
        for status in (RunStatus.STARTING, RunStatus.RUNNING):
            service.repo.transition(parent.id, status)
        service.repo.add_checkpoint(parent.id, CheckpointReport(
            step=9, epoch=3, time=datetime.now(timezone.utc), bytes=1, committed=True, world_size=2,
            url=f"file:///tmp/runs/{parent.id}/checkpoints/ep3-ba9"))
        service.repo.transition(parent.id, RunStatus.COMPLETED)
        continued = runner.invoke(app, ["continue", parent.id, "--max-duration", "5ep", *url])
        assert continued.exit_code == 0, continued.output
        assert "continues to 5ep as attempt 2" in continued.output
        assert client.get_run(parent.id).status is RunStatus.QUEUED
