"""Bring your own model, end to end: a package written here, shipped with ``tessera submit
--code`` to a live service storing code and checkpoints in S3 (moto over HTTP), trained on Ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import yaml

from api.views import RunStatus
from tests.e2e.conftest import wait_for_status
from tests.workers.byo_helpers import user_spec, write_user_package, write_wheel

pytestmark = pytest.mark.integration
TESSERA = str(Path(sys.executable).with_name("tessera"))


def submit(service, spec: dict, code: Path, tmp_path: Path, *follow: str) -> subprocess.CompletedProcess:
    spec_file = tmp_path / f"{spec['name']}.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    return subprocess.run([TESSERA, "submit", str(spec_file), "--code", str(code), *follow, "--url", service.url],
                          capture_output=True, text=True, timeout=300,
                          env={"COLUMNS": "200", "PATH": str(Path(sys.executable).parent),
                               "TESSERA_API_KEY": os.environ["TESSERA_API_KEY"],
                               "PYTHONPATH": os.environ.get("PYTHONPATH", "")})


def run_id_of(result: subprocess.CompletedProcess) -> str:
    assert "submitted run " in result.stdout, result.stdout + result.stderr
    return result.stdout.split("submitted run ")[1].split()[0]


def test_a_shipped_model_trains_to_completion_on_ray_with_s3_storage(s3_service, s3_server, tmp_path):
    # The model takes its width from a pip requirement the workers install (a wheel built here),
    # and trains on the package's own data set, read by two loader processes.
    package = write_user_package(tmp_path / "good", needs="tessera_probe_dep")
    requirement = f"tessera_probe_dep @ {write_wheel(tmp_path / 'wheels', width=5).as_uri()}"
    spec = {**user_spec("byo-e2e", None, algorithms=[{"name": "blurpool"}], batches=6, user_data=True),
            "code": {"requirements": [requirement]}}
    spec["model"]["params"] = {}
    spec["data"]["train"]["num_workers"] = 2
    # A metric of the package's own beside a built-in: imported on the worker, never by the service.
    (package / "metrics.py").write_text("def label_mean(outputs, targets):\n    return targets.float().mean()\n")
    spec["eval_metrics"] = ["f1_macro", {"import": "my_project.metrics:label_mean"}]
    result = submit(s3_service, spec, package, tmp_path, "--follow")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "uploaded" in result.stdout and "COMPLETED" in result.stdout
    client = s3_service.client()
    run = client.get_run(run_id_of(result))
    digest = run.spec["code"]["digest"]
    assert run.spec["code"]["requirements"] == [requirement]  # --code added the digest and kept them
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=s3_server.endpoint_url)
            .list_objects_v2(Bucket=s3_server.bucket, Prefix=f"{s3_service.storage_prefix}/code/")["Contents"]]
    assert keys == [f"{s3_service.storage_prefix}/code/{digest}.zip"]
    assert run.status is RunStatus.COMPLETED and 0.0 <= run.summary["eval/accuracy"] <= 1.0
    assert run.summary["eval/label_mean"] == 1.5  # labels i % 4 of the 32 test items
    assert 0.0 <= run.summary["eval/f1_macro"] <= 1.0
    running = [e.message for e in client.run_events(run.id).data if e.to_status is RunStatus.RUNNING]
    assert "no effect: BlurPool found no" in running[0]  # the surgery's finding, on the run
    again = submit(s3_service, {**spec, "name": "byo-e2e-again"}, package, tmp_path)
    assert "already on the service" in again.stdout, again.stdout + again.stderr


def test_a_shipped_model_that_fails_to_import_ends_failed_with_the_import_error(s3_service, tmp_path):
    package = write_user_package(tmp_path / "broken", broken=True)
    result = submit(s3_service, user_spec("byo-broken", None), package, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    run = wait_for_status(s3_service.client(), run_id_of(result), {RunStatus.FAILED, RunStatus.COMPLETED},
                          timeout=240)
    assert run.status is RunStatus.FAILED
    assert "importing module 'my_project.nets' failed" in run.error
    assert "ModuleNotFoundError: No module named 'not_installed_anywhere'" in run.error
    assert "import not_installed_anywhere" in run.error  # the traceback's tail points at the user's line
