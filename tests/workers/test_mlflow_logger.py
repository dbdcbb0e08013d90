"""The mlflow logger against a real MLflow tracking server (SQLite backend, started here):
params, tags and every metric read back with MLflow's own client."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from api.views import RunStatus
from workers.loggers import flatten, with_loggers
from workers.reporter import MemorySink
from workers.trainer import train
from tests.workers.helpers_specs import tiny_spec


@pytest.fixture
def mlflow_server(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db",
         "--default-artifact-root", f"{tmp_path}/artifacts", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # readiness: the server answers /health
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "mlflow server did not start"
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


def test_metrics_params_and_tags_reach_the_tracking_server(mlflow_server):
    from mlflow.tracking import MlflowClient

    spec = tiny_spec(eval_interval="1ba", tags=["baseline"],
                     loggers=[{"name": "mlflow", "tracking_uri": mlflow_server, "experiment": "digits"}])
    memory = MemorySink()
    sink = with_loggers(memory, spec, None, run_id="run-abc")
    train(spec, sink=sink)
    sink.status(RunStatus.COMPLETED)
    sink.close()

    client = MlflowClient(tracking_uri=mlflow_server)
    [run] = client.search_runs([client.get_experiment_by_name("digits").experiment_id])
    assert run.data.tags["tessera.run_id"] == "run-abc" and run.data.tags["tag.baseline"] == "true"
    assert run.info.status == "FINISHED"
    assert run.data.params["optimizer.lr"] == flatten(spec.model_dump(mode="json"))["optimizer.lr"]
    for key in ("eval/accuracy", "eval/loss"):
        history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        assert sorted(history) == memory.values(key)
