"""Stopping the embedded Ray head (``service.ray_head``), as the service does on Ctrl-C or SIGTERM:
no process of the head waits out Ray's second between SIGTERM and SIGKILL, none is left behind,
and the process that ran the head skips the interpreter's final garbage collections at exit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO_ROOT
from tests.e2e.conftest import wait_until

pytestmark = pytest.mark.integration


def stop_report() -> None:
    """In a fresh interpreter (the test runs it with ``python -c``): start the head as the service
    does, stop it, and print what happened to its processes as JSON lines on stdout."""
    import atexit
    import gc
    import time

    # Registered before Ray is imported and the head started, so it runs after every atexit
    # handler they add (the last registered runs first), just before the final collections.
    atexit.register(lambda: print(json.dumps({"frozen_at_exit": gc.get_freeze_count()}), flush=True))
    from ray._private import node

    from service import ray_head
    from service.settings import load_settings

    at_rays_turn = {}  # process type -> whether it ran when ray.shutdown() came to it, and how it ended
    kill_process = node.Node._kill_process_impl

    def recording_kill_process(self, process_type, **kwargs):
        processes = [info.process for info in self.all_processes.get(process_type, [])]
        running = any(process.poll() is None for process in processes)
        kill_process(self, process_type, **kwargs)
        at_rays_turn[process_type] = {"running": running, "returncodes": [p.returncode for p in processes]}

    node.Node._kill_process_impl = recording_kill_process
    ray_head.start_embedded_ray(load_settings())
    head = psutil.Process().children(recursive=True)
    temp_dirs = list(ray_head._temp_dirs)
    started = time.monotonic()
    ray_head.stop_embedded_ray()
    seconds = time.monotonic() - started
    # The dashboard's multiprocessing helpers (its fork server, resource tracker) end once its
    # pipes close, a moment after it; a process of the head still there 30 s on is left behind.
    deadline = time.monotonic() + 30
    while (left := [process for process in head if not ended(process.pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    print(json.dumps({"at_rays_turn": at_rays_turn, "head": len(head), "seconds": seconds,
                      "left": [command_line(process) for process in left],
                      "temp_dirs_left": [d for d in temp_dirs if os.path.exists(d)]}), flush=True)


def command_line(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:200]
    except psutil.Error:  # it ended meanwhile
        return f"pid {process.pid}"


def fork_server_pids(tmp: Path) -> set[int]:
    """The warm driver interpreters the head's start-up probe started, from their logs."""
    return {int(line.split("fork_server[")[1].split("]")[0]) for log in tmp.glob("tessera-forks-*/*.log")
            for line in log.read_text().splitlines() if "fork_server[" in line}


def ended(pid: int) -> bool:
    """Gone, or a zombie that only waits for its parent (whoever adopted it) to reap it."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_embedded_head_stops_without_waiting_on_a_process_and_leaves_nothing(tmp_path):
    # Short: the warm driver interpreter's unix socket lives under TMPDIR.
    tmp = Path(tempfile.mkdtemp(prefix="ts", dir="/tmp"))
    env = {name: value for name, value in os.environ.items() if not name.startswith(("TESSERA_", "RAY_ADDRESS"))}
    env.update(TESSERA_HOME=str(tmp_path), TMPDIR=str(tmp))
    try:
        done = subprocess.run([sys.executable, "-c", "from tests.e2e.test_embedded_ray_stop import stop_report; "
                               "stop_report()"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        report = next(line for line in lines if "at_rays_turn" in line)
        assert report["head"] >= 5 and not report["left"] and not report["temp_dirs_left"], report
        # ray.shutdown() gives each process it finds running a second after SIGTERM, then
        # SIGKILLs it (the autoscaler's monitor, every time, before the fix): none may need that.
        assert {"raylet", "gcs_server", "monitor", "dashboard"} <= set(report["at_rays_turn"]), report
        killed_after_the_wait = [kind for kind, seen in report["at_rays_turn"].items()
                                 if seen["running"] and -signal.SIGKILL in seen["returncodes"]]
        assert not killed_after_the_wait, report
        # The head's atexit handler froze the heap before the interpreter's final collections.
        frozen = [line["frozen_at_exit"] for line in lines if "frozen_at_exit" in line]
        assert frozen and frozen[0] > 0, done.stdout
    finally:
        # The warm driver interpreter stops by itself once the head's GCS has gone (after its
        # preload, which may take a while on a busy machine).
        pids = fork_server_pids(tmp)
        wait_until(lambda: all(map(ended, pids)), timeout=180, what=f"the fork servers {pids} to stop after the head")
        shutil.rmtree(tmp, ignore_errors=True)
