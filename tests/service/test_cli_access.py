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
