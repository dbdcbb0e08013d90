"""``tessera sweeps`` and the quota caps from the CLI, against the real app on a loopback port
(no Ray: a submitted sweep stays QUEUED, which is what ``list``/``show``/``cancel`` need)."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from cli.main import app
from tests.dashboard.conftest import LocalService
from tests.service.test_code_routes import stub_project


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


def test_a_sweep_over_your_own_model_from_the_cli_with_code_and_json(tmp_path, example_body, monkeypatch):
    """``tessera sweeps submit --code DIR`` uploads the package once (saying so, as ``tessera
    submit --code`` does) and records it as ``base.code.digest``; with ``--json`` stdout is the
    SweepView alone and the messages go to stderr."""
    from api.code_package import pack_directory

    root = stub_project(tmp_path)
    digest = pack_directory(root).digest
    base = {**example_body, "model": {"import": "my_project.nets:build", "params": {"width": 8}}, "algorithms": []}
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump({"name": "byo-sweep", "base": base,
                                    "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}}))
    runner = CliRunner()
    with LocalService(tmp_path) as service:
        url = ["--url", service.url]
        first = runner.invoke(app, ["sweeps", "submit", str(spec), "--code", str(root), "--json", *url])
        assert first.exit_code == 0, first.output
        sweep = json.loads(first.stdout)  # the SweepView, nothing else
        assert sweep["spec"]["base"]["code"] == {"digest": digest} and sweep["status"] == "QUEUED"
        assert f"code package {digest[:12]} (2 files" in first.stderr and "KiB) uploaded" in first.stderr
        assert f"submitted sweep {sweep['id']}" in first.stderr

        again = runner.invoke(app, ["sweeps", "submit", str(spec), "--code", str(root), *url])
        assert again.exit_code == 0, again.output
        assert f"code package {digest[:12]}" in again.stdout and "already on the service" in again.stdout
        second_id = again.stdout.split("submitted sweep ")[1].split()[0]
        shown = json.loads(runner.invoke(app, ["sweeps", "show", second_id, "--json", *url]).stdout)
        assert shown["spec"]["base"]["code"] == {"digest": digest}

        from api.client import Client

        # No Ray here, so no sweep ends: "waiting" cancels it, and --wait --json prints the final view alone.
        monkeypatch.setattr(Client, "wait_sweep", lambda self, sweep_id, **_: self.cancel_sweep(sweep_id))
        waited = runner.invoke(app, ["sweeps", "submit", str(spec), "--code", str(root), "--wait", "--json", *url])
        assert waited.exit_code == 1, waited.output  # not COMPLETED
        final = json.loads(waited.stdout)
        assert final["status"] in ("CANCELING", "CANCELED") and final["spec"]["base"]["code"] == {"digest": digest}
        assert f"sweep {final['id']}: {final['status']}" in waited.stderr and "submitted sweep" in waited.stderr

        needing = tmp_path / "needing.yaml"  # a base with requirements: --code adds the digest beside them
        needing.write_text(yaml.safe_dump({"name": "byo-needs", "base": {**base, "code": {"requirements": ["einops"]}},
                                           "search": {"params": {"optimizer.lr": {"grid": [0.05]}}}}))
        kept = runner.invoke(app, ["sweeps", "submit", str(needing), "--code", str(root), "--json", *url])
        assert kept.exit_code == 0, kept.output
        assert json.loads(kept.stdout)["spec"]["base"]["code"] == {"requirements": ["einops"], "digest": digest}

        not_a_folder = runner.invoke(app, ["sweeps", "submit", str(spec), "--code", str(tmp_path / "nope"), "--json",
                                           *url])
        # A bad option value: a usage error (exit 2), as the README's table of exit codes has it.
        assert not_a_folder.exit_code == 2 and "not a folder" in not_a_folder.stderr and not_a_folder.stdout == ""
        no_base = tmp_path / "no-base.yaml"
        no_base.write_text(yaml.safe_dump({"name": "no-base", "search": {}}))
        refused = runner.invoke(app, ["sweeps", "submit", str(no_base), "--code", str(root), *url])
        assert refused.exit_code == 1 and "base must be a mapping" in refused.stderr and "got nothing" in refused.stderr


def test_sweeps_list_filters_by_name_and_status_and_takes_a_limit(tmp_path, monkeypatch, example_body):
    """``tessera sweeps list --name/--status/--limit``, as ``tessera runs`` takes them: a status in any
    case, a wrong one a usage error that lists the sweep statuses."""
    from cli.output import console

    monkeypatch.setattr(console, "_width", 240)  # tables unclipped
    runner = CliRunner()
    spec = tmp_path / "sweep.yaml"
    with LocalService(tmp_path) as service:
        url = ["--url", service.url]
        ids = {}
        for name in ("lr_search-a", "lrXsearch-b", "width-search"):
            spec.write_text(yaml.safe_dump({"name": name, "base": example_body,
                                            "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}}))
            submitted = runner.invoke(app, ["sweeps", "submit", str(spec), "--json", *url])
            assert submitted.exit_code == 0, submitted.output
            ids[name] = json.loads(submitted.stdout)["id"]
        assert runner.invoke(app, ["sweeps", "cancel", ids["width-search"], *url]).exit_code == 0

        def listed(*options: str) -> list[str]:
            result = runner.invoke(app, ["sweeps", "list", *options, "--json", *url])
            assert result.exit_code == 0, result.output
            return [sweep["id"] for sweep in json.loads(result.stdout)]

        assert listed("--name", "LR_") == [ids["lr_search-a"]]  # _ is no wildcard
        assert listed("--name", "search", "--status", "queued") == [ids["lrXsearch-b"], ids["lr_search-a"]]
        assert listed("--status", "CANCELING") == [ids["width-search"]]
        assert listed("--limit", "1") == [ids["width-search"]]
        table = runner.invoke(app, ["sweeps", "list", "--name", "search", "--status", "queued", "--limit", "1", *url])
        assert ids["lrXsearch-b"] in table.output and ids["lr_search-a"] not in table.output
        wrong = runner.invoke(app, ["sweeps", "list", "--status", "stopped", *url])
        said = " ".join(wrong.output.replace("│", " ").split())  # the error box wraps the line
        assert wrong.exit_code == 2 and "'stopped' is not a sweep status; one of QUEUED, STARTING, RUNNING" in said


def test_a_trial_s_wall_time_reads_as_seconds_at_any_length():
    from cli.sweeps import _seconds

    assert [_seconds(s) for s in (None, 0.7, 12.34, 99.4, 7200.4)] == ["-", "0.7", "12.3", "99.4", "7200"]


def test_sweeps_wait_prints_a_line_each_time_the_sweeps_progress_changes():
    from io import StringIO

    from rich.console import Console

    from api.views import SweepView
    from cli.sweeps import _ProgressLines

    def view(counts, trials=(), best=None):
        return SweepView.model_validate({
            "id": "s1", "name": "n", "status": "RUNNING", "attempt": 1, "driver": "service", "metric": "eval/accuracy",
            "mode": "max", "spec": {}, "created_at": "2026-01-01T00:00:00Z", "counts": counts, "best_run_id": best,
            "trials": [{"run_id": run, "trial_id": run, "name": run, "status": status, "attempt": 1, "algorithms": [],
                        "metric": metric} for run, status, metric in trials]})

    buffer = StringIO()
    lines = _ProgressLines(Console(file=buffer, width=200))
    lines(view({}))
    lines(view({}))  # unchanged: no second line
    lines(view({"RUNNING": 2}, [("r1", "RUNNING", None), ("r2", "RUNNING", None)]))
    lines(view({"COMPLETED": 1, "RUNNING": 1}, [("r1", "COMPLETED", 0.97123), ("r2", "RUNNING", None)], best="r1"))
    assert buffer.getvalue().splitlines() == [
        "RUNNING: 0 trials",
        "RUNNING: 2 trials (2 RUNNING)",
        "RUNNING: 2 trials (1 COMPLETED, 1 RUNNING), best r1 eval/accuracy 0.9712"]
