"""``tessera resume`` against the real app on a loopback port (no Ray): a FAILED run becomes
QUEUED as attempt 2; a run that cannot be resumed exits 1 with the API's reason."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from typer.testing import CliRunner

from api.views import RunStatus
from cli.main import app
from service.db.models import Run
from tests.dashboard.conftest import LocalService


def running_run(service, spec):
    """A run stored, its first attempt begun and RUNNING, as a worker's first report leaves it."""
    run = service.repo.create_run(spec)
    service.repo.begin_attempt(run.id, token="t")
    service.repo.transition(run.id, RunStatus.RUNNING)
    return run


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
        # It saved no checkpoint: the user hears that it trains again from the start.
        assert ("no checkpoint (none was reported: checkpoint.interval sets how often one is saved), so it trains "
                "again from the start") in " ".join(resumed.output.split())


def test_a_resumed_run_with_a_checkpoint_says_nothing_more_and_a_fork_without_one_starts_from_its_parents(
        tmp_path, example_spec):
    from api.lineage import ForkInfo
    from api.views import CheckpointReport

    runner = CliRunner()
    with LocalService(tmp_path) as service:
        url = ["--url", service.url]
        saved = running_run(service, example_spec)
        service.repo.add_checkpoint(saved.id, CheckpointReport(step=4, epoch=0, time=datetime.now(timezone.utc),
                                                               url=f"file:///c/{saved.id}/ep0-ba4", committed=True,
                                                               bytes=10, world_size=1))
        service.repo.transition(saved.id, RunStatus.FAILED, error="worker lost")
        resumed = runner.invoke(app, ["resume", saved.id, *url])
        assert resumed.exit_code == 0, resumed.output
        assert re.search(r"QUEUED \(attempt 2\): resumed by key '[^']+' \(\w+\)$", resumed.output.strip()), resumed.output
        fork = ForkInfo.model_validate({"from": "latest", "checkpoint_url": f"file:///c/{saved.id}/ep0-ba4", "step": 4})
        child = service.repo.create_run(example_spec)
        with service.repo.db.write() as session:  # as a fork of it is stored (service.lineage)
            session.get(Run, child.id).fork = fork.model_dump(mode="json", by_alias=True)
        service.repo.begin_attempt(child.id, token="t2")
        service.repo.transition(child.id, RunStatus.FAILED, error="worker lost")
        resumed = runner.invoke(app, ["resume", child.id, *url])
        assert "no checkpoint of its own, so it starts again from its parent's" in " ".join(resumed.output.split())


def test_show_of_a_resumed_run_gives_its_first_start_and_this_attempts(tmp_path, example_spec):
    runner = CliRunner()
    with LocalService(tmp_path) as service:
        url = ["--url", service.url]
        run = running_run(service, example_spec)
        first = runner.invoke(app, ["show", run.id, *url])
        assert first.exit_code == 0 and "(attempt 1 started" not in first.output, first.output
        service.repo.transition(run.id, RunStatus.FAILED, error="worker lost")
        assert runner.invoke(app, ["resume", run.id, *url]).exit_code == 0
        service.repo.begin_attempt(run.id, token="t2")
        now = datetime.now(timezone.utc).replace(microsecond=0)
        with service.repo.db.write() as session:  # attempt 2 was submitted ten minutes ago
            session.get(Run, run.id).attempt_started_at = now - timedelta(minutes=10)
        began = now - timedelta(minutes=5)  # and its RUNNING, made then, came through an outage only now
        service.repo.apply_worker_report(run.id, RunStatus.RUNNING, started_at=began)
        shown = " ".join(runner.invoke(app, ["show", run.id, *url]).output.split())
        # started_at stays the first start; the second attempt's, when it began training, follows it
        assert shown.count(" started ") == 2 and f"(attempt 2 started {began})" in shown, shown


def test_show_of_a_failed_run_says_whether_a_resume_may_pass(tmp_path, example_spec):
    runner = CliRunner()
    with LocalService(tmp_path) as service:
        url = ["--url", service.url]
        lost, broken, old = (running_run(service, example_spec) for _ in range(3))
        service.repo.apply_worker_report(lost.id, RunStatus.FAILED, error="WorkerHealthCheckFailedError: worker 1",
                                         failure="machine")
        service.repo.apply_worker_report(broken.id, RunStatus.FAILED, error="ValueError: lr", failure="code")
        service.repo.apply_worker_report(old.id, RunStatus.FAILED, error="ValueError: lr")  # a worker that does not say

        def shown(run):
            return " ".join(runner.invoke(app, ["show", run.id, *url]).output.split())

        machine = f"the machine, not the code (Ray lost a worker process, a node or the job): `tessera resume {lost.id}`"
        assert machine in shown(lost)
        assert "a resume would fail again" in shown(broken)
        assert "failed:" not in shown(old)


def test_show_gives_the_time_a_resumed_run_trained_and_beside_it_the_span_from_its_first_start(tmp_path, example_spec):
    runner = CliRunner()
    now = datetime.now(timezone.utc).replace(microsecond=0)
    with LocalService(tmp_path) as service:
        url = ["--url", service.url]
        one = running_run(service, example_spec)
        service.repo.transition(one.id, RunStatus.COMPLETED)
        shown = " ".join(runner.invoke(app, ["show", one.id, *url]).output.split())
        assert re.search(r"trained \d+s project", shown), shown  # one attempt: the span says the same

        run = service.repo.create_run(example_spec)
        for attempt, (began, ended) in enumerate([(now - timedelta(hours=2), now - timedelta(minutes=110)),
                                                  (now - timedelta(minutes=30), now - timedelta(minutes=25))]):
            service.repo.begin_attempt(run.id, token=f"t{attempt}")
            with service.repo.db.write() as session:  # the attempt was submitted when it began training
                session.get(Run, run.id).attempt_started_at = began
            service.repo.apply_worker_report(run.id, RunStatus.RUNNING, started_at=began)
            service.repo.apply_worker_report(run.id, RunStatus.FAILED, error="NodeDiedError", ended_at=ended)
            if attempt == 0:
                service.repo.resume_run(run.id)
        shown = " ".join(runner.invoke(app, ["show", run.id, *url]).output.split())
        assert "trained 15m 00s (1h 35m from first start to end, 2 attempts)" in shown, shown
