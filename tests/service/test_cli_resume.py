"""``tessera resume`` against the real app on a loopback port (no Ray): a FAILED run becomes
QUEUED as attempt 2; a run that cannot be resumed exits 1 with the API's reason."""

from __future__ import annotations

from typer.testing import CliRunner

from api.views import RunStatus
from cli.main import app
from tests.dashboard.conftest import LocalService


def test_resume_requeues_a_failed_run_as_its_next_attempt_and_refuses_a_queued_one(tmp_path, example_spec):
    runner = CliRunner()
    with LocalService(tmp_path) as service:
        url = ["--url", service.url]
        run = service.repo.create_run(example_spec)
        refused = runner.invoke(app, ["resume", run.id, *url])
        assert refused.exit_code == 1 and "409" in refused.output
        service.repo.transition(run.id, RunStatus.FAILED, error="worker lost")
        resumed = runner.invoke(app, ["resume", run.id, "--workers", "1", *url])
        assert resumed.exit_code == 0, resumed.output
        assert "QUEUED (attempt 2)" in resumed.output
        assert service.repo.get_run(run.id).spec["parallelism"]["num_workers"] == 1
