"""``tessera runs list`` filters, ``tag``, ``note``, ``archive``, ``delete`` and ``diff`` against the
real app on a loopback port (no Ray), and the SDK calls under them."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from typer.testing import CliRunner

from api.client import Client
from api.views import ReportedMetric, RunStatus
from cli.main import app
from tests.dashboard.conftest import LocalService


def _ended(repo, spec, name: str, accuracy: float) -> str:
    run = repo.create_run(spec.model_copy(update={"name": name}))
    repo.begin_attempt(run.id, token="t")
    repo.transition(run.id, RunStatus.RUNNING)
    repo.add_metrics(run.id, [ReportedMetric(step=1, key="eval/accuracy", value=accuracy,
                                             time=datetime.now(timezone.utc))])
    repo.transition(run.id, RunStatus.COMPLETED)
    return run.id


def test_find_compare_and_clean_up_runs_from_the_cli(tmp_path, monkeypatch, example_spec):
    from cli import main

    monkeypatch.setattr(main.console, "_width", 240)  # tables unclipped
    runner = CliRunner()
    with LocalService(tmp_path) as service:
        url = ["--url", service.url]
        low = _ended(service.repo, example_spec, "low", 0.3)
        high = _ended(service.repo, example_spec.model_copy(update={"seed": 7}), "high", 0.9)
        same = _ended(service.repo, example_spec, "same", 0.5)

        tagged = runner.invoke(app, ["tag", *url, low, "+baseline", "+keep", "-keep"])
        assert tagged.exit_code == 0 and "baseline" in tagged.output, tagged.output
        assert runner.invoke(app, ["tag", *url, low, "bad"]).exit_code == 1
        assert runner.invoke(app, ["note", low, "first try", *url]).exit_code == 0
        assert Client(service.url).get_run(low).notes == "first try"

        listed = runner.invoke(app, ["runs", "list", "--tag", "baseline", *url])
        assert low in listed.output and high not in listed.output, listed.output
        ordered = runner.invoke(app, ["runs", "list", "--order-by", "best:eval/accuracy", *url]).output
        assert ordered.index(high) < ordered.index(same) < ordered.index(low)

        differ = runner.invoke(app, ["diff", low, high, "--json", *url])
        assert differ.exit_code == 1 and json.loads(differ.output) == {"name": ["low", "high"], "seed": [42, 7]}
        identical = runner.invoke(app, ["diff", low, low, *url])
        assert identical.exit_code == 0 and "identical" in identical.output
        assert runner.invoke(app, ["diff", low, "000000000000", *url]).exit_code == 3  # not found

        assert runner.invoke(app, ["archive", high, *url]).exit_code == 0
        assert high not in runner.invoke(app, ["runs", *url]).output
        assert high in runner.invoke(app, ["runs", "--archived", "true", *url]).output
        assert runner.invoke(app, ["archive", high, "--undo", *url]).exit_code == 0

        assert runner.invoke(app, ["delete", same, *url], input="n\n").exit_code == 1  # asked, refused
        deleted = runner.invoke(app, ["delete", same, "--yes", *url])
        assert deleted.exit_code == 0 and "deleted run" in deleted.output, deleted.output
        assert [r.id for r in Client(service.url).iter_runs(order_by="best:eval/accuracy")] == [high, low]
