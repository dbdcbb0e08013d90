"""`tessera serve` with no configuration: SQLite + local storage under TESSERA_HOME + a local Ray head."""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from api.views import TERMINAL_STATUSES, RunStatus
from tests.e2e.conftest import ServiceProcess, wait_for_status, wait_until
from tests.e2e.test_vertical_slice import long_synthetic_spec

pytestmark = pytest.mark.integration


def test_serve_with_embedded_defaults_runs_a_job_to_completion_its_driver_forked_warm(tmp_path, monkeypatch,
                                                                                      ray_head):
    # The environment of a user's shell: RAY_DEDUP_LOGS, which the suite sets, is one the service
    # sets for its jobs, and the probe's warm interpreter must be the one a run's driver asks for.
    for var in ("TESSERA_DATABASE_URL", "TESSERA_STORAGE_URL", "TESSERA_RAY_ADDRESS", "RAY_DEDUP_LOGS"):
        monkeypatch.delenv(var, raising=False)
    # The service's Ray processes, and so its job drivers, keep their fork server under TMPDIR:
    # a folder of this test's own (short: the server's unix socket lives there).
    tmp = Path(tempfile.mkdtemp(prefix="tf", dir="/tmp"))
    ray_sessions = set(Path("/tmp").glob("tsr*"))  # the embedded head's temp dirs (service/ray_head.py)
    service = ServiceProcess(home=tmp_path / "home", env={"TMPDIR": str(tmp)})
    (tmp_path / "home").mkdir()
    service.start(timeout=180)
    own_session = set(Path("/tmp").glob("tsr*")) - ray_sessions  # this service's head's temp dir
    try:
        # The head's start-up probe job started the node's warm driver interpreter.
        servers = tmp / f"tessera-forks-{os.getuid()}"
        wait_until(lambda: any("serving" in log.read_text() for log in servers.glob("*.log")), timeout=120,
                   what="the warm driver interpreter to serve")
        client = service.client()
        run = client.create_run(long_synthetic_spec("embedded", batches=20))
        final = wait_for_status(client, run.id, TERMINAL_STATUSES, timeout=240)
        assert final.status is RunStatus.COMPLETED, final.error
        text = client.logs(run.id).text
        assert "workers.launch forked as pid" in text  # the first run is forked too
        # With another cluster on the machine (the suite's), the driver still joined the service's own.
        ports = [int(m) for m in re.findall(r"Connecting to existing Ray cluster at address: [\d.]+:(\d+)", text)]
        assert ports and ray_head.port not in ports
        assert (tmp_path / "home" / "tessera.db").is_file()
        assert client.health()["database"] == "ok"
        # SIGTERM (kill, systemd, Docker, Kubernetes) stops it as gracefully as Ctrl-C: the
        # embedded Ray head's start must not have taken the signal's handler from uvicorn, whose
        # own re-raises the signal once it has shut down (Ray's exited 15 mid-request).
        service.proc.send_signal(signal.SIGTERM)
        assert service.proc.wait(60) == -signal.SIGTERM, service.log_path.read_text()[-3000:]
        log = service.log_path.read_text()
        assert "Application shutdown complete" in log and "Traceback" not in log, log[-3000:]
        assert own_session and not [d for d in own_session if d.exists()]  # the head's temp dir went with it
        # And the warm driver interpreter its probe started, a few seconds after its Ray (not 30).
        server_pids = {int(line.split("fork_server[")[1].split("]")[0]) for log in servers.glob("*.log")
                       for line in log.read_text().splitlines() if "fork_server[" in line}
        assert server_pids
        wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in server_pids), timeout=15,
                   what=f"the fork servers {server_pids} to stop after the service")
    finally:
        service.stop()
        shutil.rmtree(tmp, ignore_errors=True)
