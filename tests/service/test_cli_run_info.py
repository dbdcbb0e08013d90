"""``tessera checkpoints``, ``metrics`` and ``children``; ``--project`` on ``runs`` and ``sweeps
list``; ``--json`` on ``fork``, ``continue``, ``resume`` and ``keys create``: against the real
app on a loopback port (no Ray: runs stay where the test puts them)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from api.client import Client
from api.views import CheckpointReport, ReportedMetric, RunStatus
from cli.main import app
from cli.output import EXIT_NOT_FOUND
from cli.run_info import duration_text, durations_line, latest_by_key, patch_text, size_text
from tests.conftest import TEST_ADMIN_KEY
from tests.dashboard.conftest import LocalService

runner = CliRunner()
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with LocalService(tmp_path_factory.mktemp("cli-run-info")) as service:
        yield service


@pytest.fixture(autouse=True)
def wide_tables(monkeypatch):
    from cli.output import console

    monkeypatch.setattr(console, "_width", 240)  # tables unclipped


def tessera(service, *args: str):
    return runner.invoke(app, [*args, "--url", service.url], prog_name="tessera")


def table_rows(stdout: str) -> list[list[str]]:
    """The body rows of a rich table, as their cells' text."""
    return [[cell.strip() for cell in line.strip("│").split("│")] for line in stdout.splitlines()
            if line.startswith("│")]


def _running(service, spec, name: str):
    run = service.repo.create_run(spec.model_copy(update={"name": name}))
    service.repo.begin_attempt(run.id, token="test-token")
    service.repo.transition(run.id, RunStatus.RUNNING)
    return run


def _checkpoint(service, run_id: str, step: int, *, committed: bool = True) -> None:
    service.repo.add_checkpoint(run_id, CheckpointReport(
        step=step, epoch=step // 3, time=NOW, bytes=3 * 1024 * 1024, committed=committed, world_size=2,
        url=f"file:///tmp/runs/{run_id}/checkpoints/ba{step}", error=None if committed else "disk full"))


def test_checkpoints_lists_the_committed_ones_and_their_steps(service, example_spec):
    run = _running(service, example_spec, "with-checkpoints")
    empty = tessera(service, "checkpoints", run.id)
    assert empty.exit_code == 0 and "no committed checkpoint yet" in empty.stdout
    _checkpoint(service, run.id, 9)
    _checkpoint(service, run.id, 12, committed=False)
    _checkpoint(service, run.id, 18)
    shown = tessera(service, "checkpoints", run.id)
    assert shown.exit_code == 0, shown.output
    rows = table_rows(shown.stdout)
    assert [row[0] for row in rows] == ["9", "18"]  # the failed write at 12 is left out
    assert rows[0][-1] == f"file:///tmp/runs/{run.id}/checkpoints/ba9" and rows[0][4] == "3.0 MiB"
    listed = json.loads(tessera(service, "checkpoints", run.id, "--json").stdout)
    assert [(c["step"], c["committed"], c["world_size"]) for c in listed] == [(9, True, 2), (18, True, 2)]


def test_metrics_shows_each_keys_latest_value_and_json_every_point_through_every_page(service, example_spec,
                                                                                       monkeypatch):
    from cli import run_info

    monkeypatch.setattr(run_info, "METRICS_PAGE", 3)  # seven points: three pages
    run = _running(service, example_spec, "with-metrics")
    assert "no metric points yet" in tessera(service, "metrics", run.id).stdout
    service.repo.add_metrics(run.id, [ReportedMetric(step=s, key="train/loss", value=2.0 / s, time=NOW)
                                      for s in range(1, 6)])
    service.repo.add_metrics(run.id, [ReportedMetric(step=s, key="eval/accuracy", value=s / 10, time=NOW)
                                      for s in (2, 4)])
    table = tessera(service, "metrics", run.id)
    assert table.exit_code == 0, table.output
    rows = {row[0]: row[1:4] for row in table_rows(table.stdout)}
    assert rows == {"eval/accuracy": ["4", "0.4", "2"], "train/loss": ["5", "0.4", "5"]}  # step, latest, points
    points = json.loads(tessera(service, "metrics", run.id, "--json").stdout)
    assert [(p["key"], p["step"]) for p in points] == [("train/loss", s) for s in range(1, 6)] + [
        ("eval/accuracy", 2), ("eval/accuracy", 4)]
    assert [p["seq"] for p in points] == sorted(p["seq"] for p in points)
    only = json.loads(tessera(service, "metrics", run.id, "--key", "eval/accuracy", "--json").stdout)
    assert [(p["step"], p["value"]) for p in only] == [(2, 0.2), (4, 0.4)]
    missing = tessera(service, "metrics", run.id, "--key", "eval/nope")
    assert missing.exit_code == 0 and "no points for key 'eval/nope'" in missing.stdout


def test_children_lists_forks_with_where_they_started_and_what_they_changed(service, example_spec):
    parent = _running(service, example_spec, "parent")
    assert "has no forks" in tessera(service, "children", parent.id).stdout
    _checkpoint(service, parent.id, 9)
    scratch = tessera(service, "fork", parent.id, "--from", "scratch", "--set", "optimizer.lr=0.05", "--json")
    assert scratch.exit_code == 0, scratch.output
    first = json.loads(scratch.stdout)  # stdout holds nothing but the new run's view
    assert first["parent_id"] == parent.id and "forked run" in scratch.stderr
    latest = json.loads(tessera(service, "fork", parent.id, "--set", "max_duration=4ep", "--json").stdout)
    assert latest["fork"]["step"] == 9
    table = tessera(service, "children", parent.id)
    assert table.exit_code == 0, table.output
    rows = table_rows(table.stdout)
    assert [(row[0], row[5], row[6]) for row in rows] == [(first["id"], "scratch", "optimizer.lr=0.05"),
                                                          (latest["id"], "batch 9", "max_duration=4ep")]
    listed = json.loads(tessera(service, "children", parent.id, "--json").stdout)
    assert [r["id"] for r in listed] == [first["id"], latest["id"]]


@pytest.mark.parametrize("command", ["checkpoints", "metrics", "children"])
def test_an_unknown_run_exits_3_with_the_apis_detail_on_stderr(service, command):
    missing = tessera(service, command, "doesnotexist", "--json")
    assert missing.exit_code == EXIT_NOT_FOUND and "doesnotexist" in missing.stderr and missing.stdout == ""


def test_continue_and_resume_print_the_runs_view_with_json(service, example_spec):
    run = _running(service, example_spec, "to-continue")
    _checkpoint(service, run.id, 9)
    service.repo.transition(run.id, RunStatus.COMPLETED)
    continued = tessera(service, "continue", run.id, "--max-duration", "5ep", "--json")
    assert continued.exit_code == 0, continued.output
    view = json.loads(continued.stdout)
    assert (view["id"], view["status"], view["attempt"], view["spec"]["max_duration"]) == (run.id, "QUEUED", 2, "5ep")
    assert "continues to 5ep" in continued.stderr

    failed = _running(service, example_spec, "to-resume")
    service.repo.transition(failed.id, RunStatus.FAILED, error="worker lost")
    resumed = tessera(service, "resume", failed.id, "--json")
    assert resumed.exit_code == 0, resumed.output
    assert (json.loads(resumed.stdout)["status"], json.loads(resumed.stdout)["attempt"]) == ("QUEUED", 2)
    assert "(attempt 2)" in resumed.stderr
    refused = tessera(service, "resume", failed.id, "--json")  # QUEUED now: 409, nothing on stdout
    assert refused.exit_code == 1 and "409" in refused.stderr and refused.stdout == ""


def test_keys_create_prints_the_created_key_with_its_secret_with_json(service):
    made = tessera(service, "keys", "create", "--project", "default", "--role", "viewer", "--name", "ci", "--json")
    assert made.exit_code == 0, made.output
    key = json.loads(made.stdout)
    assert key["key"].startswith("tsk_") and key["roles"] == {"default": "viewer"} and key["name"] == "ci"
    assert f"key {key['id']}" in made.stderr
    assert '("key" in the JSON on stdout) is shown only now' in made.stderr
    assert not made.stderr.rstrip().endswith(":")  # nothing follows on stderr: the secret is in the JSON
    with Client(service.url, api_key=key["key"]) as as_viewer:  # the secret printed is the key made
        assert as_viewer.me()["key_id"] == key["id"]
    plain = tessera(service, "keys", "create", "--project", "default", "--role", "viewer")
    assert plain.stdout.strip().splitlines()[-1].startswith("tsk_")  # without --json: the secret alone, last


def test_runs_and_sweeps_list_take_a_project(service, example_body):
    with Client(service.url, api_key=TEST_ADMIN_KEY) as client:
        client.create_project("vision")
        mine = client.create_run({**example_body, "name": "in-vision"}, project="vision")
        other = client.create_run({**example_body, "name": "in-default"}, project="default")
        sweep = {"base": example_body, "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}}
        vision_sweep = client.create_sweep({**sweep, "name": "vision-sweep"}, project="vision")
        default_sweep = client.create_sweep({**sweep, "name": "default-sweep"}, project="default")
    runs = json.loads(tessera(service, "runs", "--project", "vision", "--json").stdout)
    assert [r["id"] for r in runs] == [mine.id]
    table = tessera(service, "runs", "--project", "vision").stdout
    assert mine.id in table and other.id not in table
    sweeps = json.loads(tessera(service, "sweeps", "list", "--project", "vision", "--json").stdout)
    assert [s["id"] for s in sweeps] == [vision_sweep.id]
    table = tessera(service, "sweeps", "list", "--project", "vision").stdout
    assert vision_sweep.id in table and default_sweep.id not in table
    for command in (["runs"], ["sweeps", "list"]):  # a project the key has none in: nothing, as the API says
        nothing = tessera(service, *command, "--project", "no-such-project", "--json")
        assert nothing.exit_code == 0 and json.loads(nothing.stdout) == []


def test_the_tables_helpers():
    assert patch_text({"optimizer": {"lr": 0.05}, "max_duration": "4ep", "scheduler": None,
                       "algorithms": [{"name": "cutmix"}]}) == \
        'optimizer.lr=0.05 max_duration=4ep scheduler=null algorithms=[{"name": "cutmix"}]'
    assert (size_text(812), size_text(4_404_019), size_text(3 * 1024**4)) == ("812 B", "4.2 MiB", "3072.0 GiB")

    class Point:
        def __init__(self, seq, step, key):
            self.seq, self.step, self.key = seq, step, key

    latest = latest_by_key([Point(1, 5, "b"), Point(2, 3, "b"), Point(3, 5, "a"), Point(4, 5, "b")])
    assert [(key, point.seq, count) for key, (point, count) in latest.items()] == [("a", 3, 1), ("b", 4, 3)]


def test_a_runs_durations_read_as_the_dashboards_and_an_older_service_gives_the_span_alone():
    from datetime import datetime, timedelta, timezone

    from api.views import RunView

    assert [duration_text(s) for s in (0.9, 59, 723, 4440, 47 * 3600 + 59 * 60, 50 * 3600)] == [
        "0s", "59s", "12m 03s", "1h 14m", "47h 59m", "2d 2h"]
    now = datetime(2026, 12, 8, 12, tzinfo=timezone.utc)
    run = {"id": "r", "name": "n", "status": "RUNNING", "attempt": 3, "spec": {},
           "created_at": now - timedelta(hours=2), "started_at": now - timedelta(hours=1)}
    queued = RunView.model_validate({**run, "status": "QUEUED", "started_at": None, "trained_seconds": 0.0})
    assert durations_line(queued, now) is None  # it has not trained yet
    training = RunView.model_validate({**run, "trained_seconds": 600.0, "training_since": now - timedelta(minutes=2)})
    assert durations_line(training, now) == "trained 12m 00s (1h 00m from first start to now, 3 attempts)"
    assert durations_line(RunView.model_validate(run), now) == "duration 1h 00m (from first start to now)"
