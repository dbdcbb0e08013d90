"""The ``tessera`` CLI against a live service: submit --follow, runs, show, cancel, bad files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT, TEST_ADMIN_KEY
from tests.e2e.test_vertical_slice import long_synthetic_spec

pytestmark = pytest.mark.integration
TESSERA = str(Path(sys.executable).with_name("tessera"))


def tessera(*args: str, url: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([TESSERA, *args, "--url", url], capture_output=True, text=True, timeout=timeout,
                          env={"COLUMNS": "200", "PATH": str(Path(sys.executable).parent),
                               "TESSERA_API_KEY": TEST_ADMIN_KEY, "PYTHONPATH": str(REPO_ROOT)})


def test_submit_follow_shows_progress_until_completed_then_runs_and_show_list_it(service, tmp_path):
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(yaml.safe_dump(long_synthetic_spec("cli-tiny", batches=40)))
    result = tessera("submit", str(spec_file), "--follow", url=service.url)
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = result.stdout.split("submitted run ")[1].split()[0]
    assert "COMPLETED" in result.stdout and "train/loss=" in result.stdout

    listing = tessera("runs", url=service.url)
    assert run_id in listing.stdout and "COMPLETED" in listing.stdout

    shown = tessera("show", run_id, url=service.url)
    assert shown.returncode == 0
    for status in ("QUEUED", "STARTING", "RUNNING", "COMPLETED"):
        assert status in shown.stdout

    refused = tessera("cancel", run_id, url=service.url)
    assert refused.returncode == 1 and "HTTP 409" in refused.stderr


def test_submitting_a_bad_spec_prints_the_field_error_and_stores_nothing(service, tmp_path):
    spec = long_synthetic_spec("cli-bad", batches=10)
    spec["optimizer"]["lr"] = -1
    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    before = [r.id for r in service.client().iter_runs()]
    result = tessera("submit", str(spec_file), url=service.url)
    assert result.returncode == 1
    assert "HTTP 422" in result.stderr and "optimizer.lr" in result.stderr and "-1" in result.stderr
    assert [r.id for r in service.client().iter_runs()] == before


def test_show_of_an_unknown_run_says_not_found(service):
    result = tessera("show", "doesnotexist", url=service.url)
    assert result.returncode == 3 and "HTTP 404" in result.stderr  # not found (cli/output.py)
