"""``tessera exports RUN``: each export's step and state, and a failed job's error in full."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from api.client import Client
from api.views import ExportView
from cli.main import app

FAILED = ExportView(step=10, status="FAILED", job_id="export-r1-step-10-abcdef",
                    error="export job export-r1-step-10-abcdef ended FAILED: Ray job export-r1-step-10-abcdef failed; "
                          "last lines of its log:\nTraceback (most recent call last):\n"
                          "  File \"/opt/tessera/workers/export.py\", line 172, in export_checkpoint [a long line of "
                          "the log, past eighty columns, kept whole]\nKeyError: ['model']")
READY = ExportView(step=22, status="READY", formats=["safetensors", "torch"])


def test_exports_lists_each_step_and_prints_a_failed_job_s_error_whole(monkeypatch):
    asked = []

    def list_exports(self, run_id):
        asked.append(run_id)
        return [FAILED, READY]

    monkeypatch.setattr(Client, "list_exports", list_exports)  # the SDK's answer (its route: test_model_route)
    runner = CliRunner()
    shown = runner.invoke(app, ["exports", "r1", "--url", "http://tessera.test"], prog_name="tessera")
    assert shown.exit_code == 0, shown.output
    assert asked == ["r1"]
    assert "READY" in shown.output and "safetensors, torch" in shown.output
    assert "step 10 failed: export job" in shown.output and shown.output.rstrip().endswith("KeyError: ['model']")
    assert "[a long line of the log, past eighty columns, kept whole]\n" in shown.output  # no markup, no wrapping
    listed = runner.invoke(app, ["exports", "r1", "--json", "--url", "http://tessera.test"], prog_name="tessera")
    assert json.loads(listed.stdout) == [FAILED.model_dump(mode="json"), READY.model_dump(mode="json")]


def test_a_run_without_exports_says_when_its_model_is_exported(monkeypatch):
    monkeypatch.setattr(Client, "list_exports", lambda self, run_id: [])
    shown = CliRunner().invoke(app, ["exports", "r1", "--url", "http://tessera.test"], prog_name="tessera")
    assert shown.exit_code == 0 and "no export yet" in shown.output and "tessera export r1 --step N" in shown.output
