"""Ctrl-C on a command that follows a run, a log or a sweep stops only the command: it says on
stderr that the run (sweep) goes on and how to stop it, and exits 130 (a stub client: no service)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from api.client import Client
from api.views import RunStatus, SweepStatus
from cli.main import app
from cli.output import EXIT_INTERRUPTED
from tests.conftest import REPO_ROOT

runner = CliRunner()
URL = ["--url", "http://127.0.0.1:9"]  # nothing is sent: the stubs answer


def tessera(*args: str):
    return runner.invoke(app, [*args, *URL], prog_name="tessera")


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("as_json", [[], ["--json"]])
def test_ctrl_c_on_submit_follow_says_the_run_goes_on_and_exits_130(monkeypatch, as_json):
    queued = SimpleNamespace(id="abc123", name="digits", status=RunStatus.QUEUED, replayed=False)
    running = SimpleNamespace(id="abc123", status=RunStatus.RUNNING)
    monkeypatch.setattr(Client, "create_run", lambda self, body, **_: queued)
    monkeypatch.setattr(Client, "get_run", lambda self, run_id: running)
    monkeypatch.setattr(Client, "metrics", lambda self, run_id, **_: SimpleNamespace(data=[], last_seq=0))
    monkeypatch.setattr("cli.follow.time.sleep", interrupt)  # Ctrl-C between two polls
    result = tessera("submit", str(REPO_ROOT / "examples" / "digits_resnet.yaml"), "--follow", *as_json)
    assert result.exit_code == EXIT_INTERRUPTED, result.output
    assert result.stderr.splitlines()[-1] == "stopped following; run abc123 goes on (tessera cancel abc123 stops it)"
    assert "goes on" not in result.stdout and (result.stdout == "") == bool(as_json)  # --json: stdout holds no view


def test_ctrl_c_on_resume_follow_says_the_same(monkeypatch):
    resumed = SimpleNamespace(id="abc123", name="digits", status=RunStatus.QUEUED, attempt=2)
    monkeypatch.setattr(Client, "resume_run", lambda self, run_id, **_: resumed)
    monkeypatch.setattr(Client, "run_events", lambda self, run_id: SimpleNamespace(data=[]))
    monkeypatch.setattr(Client, "get_run", interrupt)  # Ctrl-C during a poll
    result = tessera("resume", "abc123", "--follow")
    assert result.exit_code == EXIT_INTERRUPTED, result.output
    assert result.stderr.strip() == "stopped following; run abc123 goes on (tessera cancel abc123 stops it)"


def test_ctrl_c_on_logs_follow_says_the_run_goes_on_and_without_follow_nothing(monkeypatch):
    monkeypatch.setattr(Client, "logs", interrupt)
    followed = tessera("logs", "abc123", "--follow")
    assert followed.exit_code == EXIT_INTERRUPTED, followed.output
    assert followed.stderr.strip() == "stopped following the log; run abc123 goes on (tessera cancel abc123 stops it)"
    read = tessera("logs", "abc123")  # reading the log so far follows nothing: typer's silent 130
    assert read.exit_code == EXIT_INTERRUPTED and read.stderr == ""


def test_ctrl_c_on_sweeps_wait_submit_wait_and_logs_follow_says_the_sweep_goes_on(monkeypatch, tmp_path):
    monkeypatch.setattr(Client, "get_sweep", interrupt)  # wait_sweep's poll
    monkeypatch.setattr(Client, "sweep_logs", interrupt)
    line = "sweep s1 goes on (tessera sweeps cancel s1 stops it)"
    waited = tessera("sweeps", "wait", "s1")
    assert waited.exit_code == EXIT_INTERRUPTED and waited.stderr.strip() == f"stopped waiting; {line}"
    followed = tessera("sweeps", "logs", "s1", "-f")
    assert followed.exit_code == EXIT_INTERRUPTED and followed.stderr.strip() == f"stopped following the log; {line}"

    made = SimpleNamespace(id="s1", name="lr", status=SweepStatus.QUEUED, replayed=False)
    monkeypatch.setattr(Client, "create_sweep", lambda self, body, **_: made)
    spec = tmp_path / "sweep.yaml"
    spec.write_text("name: lr\nbase: {}\nsearch: {algorithms: {sets: [[]]}}\n")
    submitted = tessera("sweeps", "submit", str(spec), "--wait")
    assert submitted.exit_code == EXIT_INTERRUPTED, submitted.output
    assert submitted.stderr.strip() == f"stopped waiting; {line}"
