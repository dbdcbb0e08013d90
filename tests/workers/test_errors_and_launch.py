"""Root causes out of wrapped errors, and the launch entry point's failure path."""

import json
import os
import pickle
import subprocess
import sys

import httpx
import pytest

from api.client import Client
from tests.local_ray import REPO_ROOT
from workers.errors import TrainingError, describe, root_cause
from workers.launch import main, run_attempt
from workers.paths import ray_storage_path as storage_path_for

TOKEN = "tok-never-printed"


class WorkerGroupLike(Exception):
    def __init__(self, failures):
        super().__init__("Training failed due to worker errors")
        self.worker_failures = failures


class TracebackWrapper(Exception):
    def __init__(self, exc):
        super().__init__("Traceback (most recent call last): ...")
        self._base_exc = exc


def test_root_cause_unwraps_per_rank_failures_wrappers_and_cause_chains():
    inner = FileNotFoundError("Fashion-MNIST files not found under /nope")
    try:
        try:
            raise inner
        except FileNotFoundError as exc:
            raise RuntimeError("loading failed") from exc
    except RuntimeError as chained:
        wrapped = WorkerGroupLike({1: TracebackWrapper(ValueError("rank 1")), 0: TracebackWrapper(chained)})
    assert root_cause(wrapped) is inner
    assert describe(wrapped) == "FileNotFoundError: Fashion-MNIST files not found under /nope"


def test_training_error_survives_pickling_with_its_message():
    error = pickle.loads(pickle.dumps(TrainingError("ValueError: boom")))
    assert isinstance(error, TrainingError) and str(error) == "ValueError: boom"
    assert describe(error) == "ValueError: boom"


def test_storage_path_is_a_local_path_for_file_urls_and_kept_for_s3():
    assert storage_path_for("file:///data/store", attempt=2) == "/data/store/ray/attempt-2"
    assert storage_path_for("s3://bucket/tessera/", attempt=1) == "s3://bucket/tessera/ray/attempt-1"
    assert storage_path_for(None, attempt=1) is None


def test_an_invalid_spec_is_reported_as_failed_with_its_cause_and_exit_code_1(capsys):
    requests = []

    def service(request):
        requests.append(request)
        if request.method == "GET":
            return httpx.Response(200, json={"id": "r1", "name": "n", "status": "STARTING", "attempt": 1,
                                             "spec": {"name": "broken"}, "created_at": "2026-01-01T00:00:00Z"})
        return httpx.Response(200, json={"id": "r1", "name": "n", "status": "FAILED", "attempt": 1, "spec": {},
                                         "created_at": "2026-01-01T00:00:00Z"})

    client = Client("http://tessera.test", transport=httpx.MockTransport(service))
    code = run_attempt("r1", service_url="http://tessera.test", token=TOKEN, attempt=1, storage_url=None,
                       client=client)
    assert code == 1
    report = json.loads(requests[-1].content)
    assert requests[-1].url.path == "/api/v1/runs/r1/report/status"
    assert report["status"] == "FAILED" and report["error"].startswith("ValidationError: ")
    assert "model" in report["error"]
    captured = capsys.readouterr()
    assert TOKEN not in captured.out + captured.err


def test_launch_without_its_environment_exits_2_and_names_the_variables(monkeypatch, capsys):
    monkeypatch.delenv("TESSERA_SERVICE_URL", raising=False)
    monkeypatch.delenv("TESSERA_RUN_TOKEN", raising=False)
    assert main(["--run-id", "r1"]) == 2
    assert "TESSERA_SERVICE_URL and TESSERA_RUN_TOKEN" in capsys.readouterr().err


@pytest.mark.parametrize("attempt", ["2nd", "-1"])
def test_launch_with_a_bad_attempt_number_exits_2_and_names_the_variable(monkeypatch, capsys, attempt):
    from workers import launch

    monkeypatch.setenv("TESSERA_SERVICE_URL", "http://tessera.test")
    monkeypatch.setenv("TESSERA_RUN_TOKEN", TOKEN)
    monkeypatch.setenv("TESSERA_ATTEMPT", attempt)
    monkeypatch.setattr(launch, "run_attempt", lambda *args, **kwargs: pytest.fail("trained on a bad attempt number"))
    assert main(["--run-id", "r1"]) == 2
    refusal = f"workers.launch: TESSERA_ATTEMPT must be a whole number from 1, not {attempt!r}"
    assert capsys.readouterr().err.strip() == refusal


def test_the_job_driver_imports_no_trainer_and_no_distributed_checkpointing():
    # What a run's Ray job driver imports before fit_with_ray starts the workers (they import the
    # trainer themselves): anything more is start-up time every run pays (bench/startup.py).
    code = ("import sys, workers.launch, workers.ray_train, ray.train.torch; "
            "bad = [m for m in sys.modules if m == 'torch.distributed.checkpoint' "
            "or m.startswith(('workers.trainer', 'workers.checkpoint', 'workers.models', 'algorithms'))]; "
            "assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=120)
    assert result.returncode == 0, result.stderr
