"""A run canceled through the service ends its MLflow run KILLED, end to end: a live service, a
real Ray job (``workers.fork_exec`` → ``workers.launch`` → Ray Train), a real MLflow tracking
server. The cancel stops the Ray job, whose driver gets Ray's stop signal and ends the MLflow
run that rank 0, killed with the job, never ends (``workers.loggers.end_interrupted_mlflow_runs``)."""

from __future__ import annotations

import pytest

from api.views import TERMINAL_STATUSES, RunStatus
from tests.e2e.conftest import wait_for_status, wait_until
from tests.e2e.test_vertical_slice import long_synthetic_spec
from tests.workers.test_mlflow_logger import mlflow_server  # noqa: F401  (a fixture)

pytestmark = pytest.mark.integration


def mlflow_runs_of(tracking_uri: str, experiment: str, run_id: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    return client.search_runs([found.experiment_id], filter_string=f"tags.`tessera.run_id` = '{run_id}'")


def test_a_run_canceled_through_the_service_ends_its_mlflow_run_killed(service, mlflow_server):  # noqa: F811
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
