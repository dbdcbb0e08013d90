"""``tessera keys`` and ``tessera projects`` against the real app on a loopback port (no Ray)."""

from __future__ import annotations

from typer.testing import CliRunner

from cli.main import app
from tests.dashboard.conftest import LocalService


def test_projects_and_keys_from_the_cli(tmp_path, monkeypatch):
    from cli import main

    monkeypatch.setattr(main.console, "_width", 240)  # tables unclipped
    runner = CliRunner()
    with LocalService(tmp_path) as service:
        url = ["--url", service.url]
        created = runner.invoke(app, ["projects", "create", "vision", *url])
        assert created.exit_code == 0, created.output
        assert "vision" in runner.invoke(app, ["projects", "list", *url]).output
        # A quota change sets what it names and keeps the rest; --unset removes one.
        set_two = runner.invoke(app, ["projects", "quota", "vision", "--max-running-runs", "4", "--max-gpus", "8", *url])
        assert set_two.exit_code == 0 and "max_running_runs 4, max_gpus 8" in set_two.output, set_two.output
        capped = runner.invoke(app, ["projects", "quota", "vision", "--max-duration-cap", "ep=50000", *url])
        assert "max_running_runs 4, max_gpus 8, max_duration_caps {'ep': 50000}" in capped.output, capped.output
        unset = runner.invoke(app, ["projects", "quota", "vision", "--unset", "max-gpus", *url])
        assert "max_running_runs 4, max_duration_caps" in unset.output and "max_gpus" not in unset.output
        bogus = runner.invoke(app, ["projects", "quota", "vision", "--unset", "max-cpus", *url])
        assert bogus.exit_code == 2 and "'max-cpus' is not a quota" in bogus.output
        both = runner.invoke(app, ["projects", "quota", "vision", "--max-gpus", "2", "--unset", "max-gpus", *url])
        assert both.exit_code == 2 and "both given and unset" in both.output
        made = runner.invoke(app, ["keys", "create", "--project", "vision", "--role", "viewer", *url])
        assert made.exit_code == 0, made.output
        secret = made.output.strip().splitlines()[-1]
        assert secret.startswith("tsk_")
        key_id = made.output.split()[1]
        assert key_id in runner.invoke(app, ["keys", "list", *url]).output
        monkeypatch.setenv("TESSERA_API_KEY", secret)  # act as the new viewer
        listing = runner.invoke(app, ["projects", "list", *url])
        assert "vision" in listing.output and "viewer" in listing.output and "default" not in listing.output
        monkeypatch.delenv("TESSERA_API_KEY")
        monkeypatch.setenv("TESSERA_API_KEY", "tsk_test-admin-key-for-the-whole-suite-0123456789")
        assert runner.invoke(app, ["keys", "revoke", key_id, *url]).exit_code == 0
        monkeypatch.setenv("TESSERA_API_KEY", secret)
        refused = runner.invoke(app, ["projects", "list", *url])
        assert refused.exit_code == 1 and "401" in refused.output


def test_runs_of_several_projects_are_listed_with_their_project(tmp_path, monkeypatch, example_spec):
    from cli import main

    monkeypatch.setattr(main.console, "_width", 240)  # tables unclipped
    runner = CliRunner()
    with LocalService(tmp_path) as service:
        url = ["--url", service.url]
        assert runner.invoke(app, ["projects", "create", "vision", *url]).exit_code == 0
        service.repo.create_run(example_spec)
        alone = runner.invoke(app, ["runs", *url])
        assert alone.exit_code == 0 and "┃project" not in alone.output  # one project: no column
        service.repo.create_run(example_spec, project="vision")
        both = runner.invoke(app, ["runs", *url])
        assert both.exit_code == 0 and "┃name          ┃project ┃status" in both.output
        assert "│vision  │QUEUED" in both.output and "│default │QUEUED" in both.output
