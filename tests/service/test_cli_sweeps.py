"""``tessera sweeps`` and the quota caps from the CLI, against the real app on a loopback port
(no Ray: a submitted sweep stays QUEUED, which is what ``list``/``show``/``cancel`` need)."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from cli.main import app
from tests.dashboard.conftest import LocalService


def test_a_sweep_from_the_cli_submit_list_show_json_cancel_and_a_capped_one_refused(tmp_path, monkeypatch,
                                                                                  example_body):
    from cli.output import console

    monkeypatch.setattr(console, "_width", 240)  # tables unclipped
    runner = CliRunner()
    sweep = {"name": "lr-search", "base": example_body, "metric": "eval/accuracy", "mode": "max",
             "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}}
    good = tmp_path / "sweep.yaml"
    good.write_text(yaml.safe_dump(sweep))
    with LocalService(tmp_path) as service:
        url = ["--url", service.url]
        submitted = runner.invoke(app, ["sweeps", "submit", str(good), *url])
        assert submitted.exit_code == 0, submitted.output
        sweep_id = submitted.output.split()[2]
        listed = runner.invoke(app, ["sweeps", "list", *url])
        assert sweep_id in listed.output and "lr-search" in listed.output and "QUEUED" in listed.output
        shown = json.loads(runner.invoke(app, ["sweeps", "show", sweep_id, "--json", *url]).stdout)
        assert json.loads(runner.invoke(app, ["sweeps", "list", "--json", *url]).stdout)[0]["id"] == sweep_id
        assert shown["id"] == sweep_id and shown["spec"]["search"]["params"]["optimizer.lr"]["grid"] == [0.05, 0.1]
        canceled = runner.invoke(app, ["sweeps", "cancel", sweep_id, *url])
        assert canceled.exit_code == 0 and "CANCEL" in canceled.output
        archived = runner.invoke(app, ["archive", "--sweep", sweep_id, *url])
        assert archived.exit_code == 0, archived.output
        assert sweep_id not in runner.invoke(app, ["sweeps", "list", *url]).output  # hidden by default...
        assert sweep_id in runner.invoke(app, ["sweeps", "list", "--archived", "true", *url]).output  # ...found here

        capped = tmp_path / "capped.yaml"
        capped.write_text(yaml.safe_dump({**sweep, "base": {**example_body, "max_duration": "20000ep"}}))
        refused = runner.invoke(app, ["sweeps", "submit", str(capped), *url])
        assert refused.exit_code == 1 and "base.max_duration" in refused.output and "10000ep" in refused.output
        raised = runner.invoke(app, ["projects", "quota", "default", "--max-duration-cap", "ep=30000", *url])
        assert raised.exit_code == 0, raised.output
        assert runner.invoke(app, ["sweeps", "submit", str(capped), *url]).exit_code == 0
        bad = runner.invoke(app, ["projects", "quota", "default", "--max-duration-cap", "epochs", *url])
        assert bad.exit_code == 2 and "UNIT=N" in bad.output
