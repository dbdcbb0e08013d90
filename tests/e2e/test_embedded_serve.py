"""`tessera serve` with no configuration: SQLite + local storage under TESSERA_HOME + a local Ray head."""

from __future__ import annotations

import pytest

from api.views import TERMINAL_STATUSES, RunStatus
from tests.e2e.conftest import ServiceProcess, wait_for_status
from tests.e2e.test_vertical_slice import long_synthetic_spec

pytestmark = pytest.mark.integration


def test_serve_with_embedded_defaults_runs_a_job_to_completion(tmp_path, monkeypatch):
    for var in ("TESSERA_DATABASE_URL", "TESSERA_STORAGE_URL", "TESSERA_RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    service = ServiceProcess(home=tmp_path / "home", env={})
    (tmp_path / "home").mkdir()
    service.start(timeout=180)
    try:
        client = service.client()
        run = client.create_run(long_synthetic_spec("embedded", batches=20))
        final = wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=240)
        assert final.status is RunStatus.COMPLETED, final.error
        assert (tmp_path / "home" / "tessera.db").is_file()
        assert client.health()["database"] == "ok"
    finally:
        service.stop()
