"""Runs and sweeps canceled through the service end their MLflow runs KILLED, end to end: a live
service, real Ray jobs, a real MLflow tracking server (the session's: it takes a minute to start
on a busy machine).

A run: ``workers.fork_exec`` → ``workers.launch`` → Ray Train. The cancel stops the Ray job, whose
driver gets Ray's stop signal and ends the MLflow run that rank 0, killed with the job, never
ends (``workers.loggers.end_interrupted_mlflow_runs``).

A sweep: the Tune driver job (``python -m workers.tune``) and its trial actors. A trial's rank 0
ends its MLflow run when the trial trains to its end; when Tune stops it, the driver does, with
the same ``workers.loggers.end_running_mlflow_runs``: FINISHED (tagged STOPPED) for the trial that
ASHA stopped, KILLED for the trial that trained when the sweep was canceled (the driver, stopped
or seeing the cancel, ends it before it exits; the trial actors die with its job)."""

from __future__ import annotations

import pytest

from api.views import TERMINAL_STATUSES, RunStatus, SweepStatus
from tests.e2e.conftest import wait_for_status, wait_until
from tests.e2e.test_vertical_slice import long_synthetic_spec
from tests.workers.helpers_specs import SWEEP_BASE

pytestmark = pytest.mark.integration


def mlflow_runs_of(tracking_uri: str, experiment: str, run_id: str | None = None) -> list:
    """The experiment's MLflow runs (of Tessera run ``run_id`` only, if given)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    return client.search_runs([found.experiment_id],
                              filter_string=f"tags.`tessera.run_id` = '{run_id}'" if run_id else "")


def test_a_run_canceled_through_the_service_ends_its_mlflow_run_killed(service, mlflow_server):
    client = service.client()
    spec = long_synthetic_spec("mlflow-canceled", batches=1_000_000)  # trains until it is canceled
    spec["loggers"] = [{"name": "mlflow", "tracking_uri": mlflow_server, "experiment": "canceled"}]
    run = client.create_run(spec)
    # Rank 0 creates its MLflow run before it reports RUNNING.
    wait_for_status(client, run.id, {RunStatus.RUNNING}, timeout=240)
    [live] = mlflow_runs_of(mlflow_server, "canceled", run.id)
    assert live.info.status == "RUNNING"
    # Something trained: the MLflow run was live when the cancel came, not just created.
    wait_until(lambda: client.get_run(run.id).summary.get("time/batch", 0) > 0, timeout=120,
               what=f"run {run.id} to report a batch")

    client.cancel_run(run.id)
    # The service ends the run CANCELED once the job is no longer live, which is after its driver,
    # which ends the MLflow run before it exits, has exited.
    assert wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=120).status is RunStatus.CANCELED
    [ended] = mlflow_runs_of(mlflow_server, "canceled", run.id)
    assert ended.info.run_id == live.info.run_id
    assert ended.info.status == "KILLED" and ended.info.end_time is not None


def test_a_sweeps_trials_end_their_mlflow_runs_when_asha_stops_one_and_the_sweep_is_canceled(service,
                                                                                            mlflow_server):
    client = service.client()
    # Evaluations at half of each trial's duration, where ASHA's rung is (grace 1ep of the base's
    # 2ep). One trial at a time, in grid order: the 2-epoch trial completes (0.47 eval accuracy at
    # its rung); the 1-epoch one (0.23 at its rung, half an epoch) is stopped there by ASHA, and
    # its trial actor is reused for the third, which trains 2000 epochs (its first evaluation and
    # rung at 1000) until the sweep is canceled.
    base = {**SWEEP_BASE, "eval_interval": "0.5dur",
            "loggers": [{"name": "mlflow", "tracking_uri": mlflow_server, "experiment": "sweep"}]}
    created = client.create_sweep({
        "name": "mlflow-sweep", "base": base,
        "search": {"params": {"max_duration": {"grid": ["2ep", "1ep", "2000ep"]}}},
        "scheduler": {"name": "asha", "grace_period": "1ep", "reduction_factor": 2}, "max_concurrent_trials": 1})

    def trial(duration: str, status: RunStatus):
        return next((r for r in client.iter_runs(sweep_id=created.id)
                     if r.spec["max_duration"] == duration and r.status is status), None)

    long = wait_until(lambda: trial("2000ep", RunStatus.RUNNING), timeout=300, what="the long trial to train")
    completed, stopped = trial("2ep", RunStatus.COMPLETED), trial("1ep", RunStatus.STOPPED)
    assert completed is not None and stopped is not None, [(r.spec["max_duration"], r.status)
                                                           for r in client.iter_runs(sweep_id=created.id)]
    # The evaluation ASHA stopped it on reached the service before Tune saw it: a STOPPED run
    # takes no more reports, and sent after the stop it was refused and lost. (A race: seen in
    # one trial of eight; tests/workers/test_trainer.py and test_reporters.py pin the order.)
    assert "eval/accuracy" in stopped.best and "eval/accuracy" in stopped.summary, stopped.summary
    [stopped_trial] = [t for t in client.get_sweep(created.id).trials if t.run_id == stopped.id]
    assert stopped_trial.metric == pytest.approx(stopped.best["eval/accuracy"])

    def mlflow_runs() -> dict:
        """The trials' MLflow runs (this test's experiment holds nothing else), by Tessera run id."""
        found = mlflow_runs_of(mlflow_server, "sweep")
        runs = {run.data.tags["tessera.run_id"]: run for run in found}
        assert len(runs) == len(found)  # one MLflow run per trial (each trained once)
        return runs

    def ended_as(run) -> tuple[str, str | None]:
        return run.info.status, run.data.tags.get("tessera.status")

    # Before the cancel: rank 0 ended the completed trial's run; the driver ended the stopped
    # one's as Tune stopped it (its rank 0 leaves it: it cannot tell ASHA's stop from a cancel).
    before = mlflow_runs()
    assert {run_id: run.info.status for run_id, run in before.items()} == \
        {completed.id: "FINISHED", stopped.id: "FINISHED", long.id: "RUNNING"}
    assert ended_as(before[completed.id]) == ("FINISHED", "COMPLETED")
    assert ended_as(before[stopped.id]) == ("FINISHED", "STOPPED")
    assert {run.data.tags.get("tessera.sweep_id") for run in before.values()} == {created.id}
    wait_until(lambda: client.get_run(long.id).summary.get("time/batch", 0) > 0, timeout=120,
               what="the long trial to report a batch")

    client.cancel_sweep(created.id)
    # The service ends the sweep CANCELED once its driver's job is no longer live: after the
    # driver, which ends its trials' MLflow runs before it exits, has exited.
    sweep = client.wait_sweep(created.id, timeout=120)
    assert sweep.status is SweepStatus.CANCELED
    assert client.get_run(long.id).status is RunStatus.CANCELED
    after = mlflow_runs()
    assert set(after) == set(before) and after[long.id].info.status == "KILLED"
    assert ended_as(after[long.id]) == ("KILLED", "CANCELED") and after[long.id].info.end_time is not None
    # The trials that had ended are left as they ended: not ended again, nothing overwritten.
    for ended in (completed.id, stopped.id):
        assert (after[ended].info.status, after[ended].info.end_time, after[ended].data.tags) == \
            (before[ended].info.status, before[ended].info.end_time, before[ended].data.tags)
