"""The suite's own Ray head (``tests/local_ray.py``): stopping it leaves none of its processes."""

from __future__ import annotations

import psutil
import pytest

from tests.local_ray import RayHead

pytestmark = pytest.mark.integration


def client_servers(head: RayHead) -> list[psutil.Process]:
    """The head's Ray Client server: its command line names the head's port, not its temp dir."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "ray.util.client.server" in cmdline and f":{head.port} " in cmdline:
            found.append(proc)
    return found


def test_a_stopped_head_leaves_no_process_its_client_server_included():
    head = RayHead(num_cpus=1)
    try:
        [server] = client_servers(head)
        # On a port of its own: Ray's default (10001) is taken once a second head runs.
        assert "--port=10001" not in server.cmdline()
    finally:
        head.stop()
    _, alive = psutil.wait_procs([server], timeout=10)
    assert not alive and not client_servers(head)
