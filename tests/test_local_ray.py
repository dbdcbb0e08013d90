"""The suite's own Ray head (``tests/local_ray.py``): stopping it ends its Ray Client server too."""

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


def test_a_stopped_head_ends_its_client_server_which_listens_on_a_port_of_its_own():
    head = RayHead(num_cpus=1)
    try:
        [server] = client_servers(head)
        # On the port the head was given: Ray's default (10001) is taken once a second head runs.
        assert head.client_server_port != 10001 and f"--port={head.client_server_port}" in server.cmdline()
    finally:
        head.stop()
    _, alive = psutil.wait_procs([server], timeout=10)
    assert not alive and not client_servers(head)
