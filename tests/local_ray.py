"""A Ray head on this machine in a process group of its own, as the suite and the benchmarks
start it: ``ray start --head`` (so a service can stop and restart around it), with its dashboard
(the Jobs API), on free loopback ports, ended by its temp dir rather than ``ray stop`` (which
would end every Ray cluster on the machine)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (``ip_local_port_range``; 32768 if unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's ephemeral range and not handed out
    before by this process. Not one ``bind(("127.0.0.1", 0))`` gives: the kernel hands the ports
    of that range to every ``bind(0)`` and outgoing connection too, so between this choice and a
    server binding it, one of Ray's own processes could take it (a Ray head failed so in a run of
    the suite: its dashboard port 'address already in use'). Below the range only another
    explicit choice can collide, and a bind check rules out those already made. Above 19999:
    Ray keeps 10002-19999 for its workers and refuses a component port inside them."""
    low = _ephemeral_low()
    if low <= 21000:  # no room between Ray's worker ports and the ephemeral range: the kernel's choice
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    for _ in range(200):
        port = random.randrange(20000, low)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free loopback port below {low} after 200 tries")


def kill_processes_mentioning(marker: str, *more: str) -> None:
    """SIGKILL every process whose command line contains ``marker`` (a Ray temp dir, say) and each
    of ``more``, with its whole tree: Ray's agents retitle themselves (``ray::DashboardAgent``), so
    their command lines no longer name the temp dir. A process already gone, or not ours to see,
    is skipped."""
    import psutil

    me = os.getpid()
    doomed: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if proc.pid != me and all(m in cmdline for m in (marker, *more)):
                doomed[proc.pid] = proc
                doomed.update({child.pid: child for child in proc.children(recursive=True)})
    for proc in doomed.values():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.kill()


def end_head(temp_dir: str, client_server_port: int) -> None:
    """End a ``ray start --head`` started with ``--temp-dir=temp_dir`` and
    ``--ray-client-server-port=client_server_port``, and remove its temp dir.

    The head's Ray Client server (``python -m ray.util.client.server``) is found by its port:
    its command line does not name the temp dir (only ``--address=<node ip>:<head port>``), and
    in proxy mode it never exits on its own when the GCS is gone, so ending a head by its temp
    dir alone left it running after the tests. (Left to Ray's default port, 10001, a second head
    on the machine also finds that port taken: hence a port of each head's own.)"""
    kill_processes_mentioning(temp_dir)
    # Ray builds the command as ``... --host=H --port=P --mode=M ...``: the space after the port
    # keeps 1234 from matching 12345.
    kill_processes_mentioning("ray.util.client.server", f"--port={client_server_port} ")
    shutil.rmtree(temp_dir, ignore_errors=True)


class RayHead:
    """A Ray head in its own process group: ``address`` for ray.init, ``dashboard_url`` for jobs.
    Its workers import from the repository (``PYTHONPATH``) and inherit this process's
    environment, so set ``AWS_*`` and ``RAY_*`` variables before starting it. Starting one sets
    ``RAY_AUTH_MODE=disabled`` in this process's environment unless it is set already."""

    def __init__(self, num_cpus: int = 4, *, timeout_s: float = 120):
        # The head and this process's clients must agree on auth. Left unset, they did not once
        # another local Ray had written ``~/.ray/auth_token`` (the head wanted a token, the
        # client sent none), so unset means a throwaway cluster without a token. Set (a
        # ``ray.init`` of a local cluster in this process sets "token"), both follow it.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        self.temp_dir = tempfile.mkdtemp(prefix="tray")  # short: Ray puts sockets under it
        self.port = free_port()
        self.dashboard_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}"
        self.client_server_port = free_port()  # see end_head
        ray = str(Path(sys.executable).with_name("ray"))
        subprocess.run(
            [ray, "start", "--head", f"--port={self.port}", f"--num-cpus={num_cpus}", "--num-gpus=0",
             "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
             # Two heads on the default job-agent port (52365) break job submission on both.
             f"--dashboard-agent-listen-port={free_port()}",
             f"--temp-dir={self.temp_dir}", "--object-store-memory=200000000", "--disable-usage-stats",
             f"--ray-client-server-port={self.client_server_port}"],
            check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=timeout_s,
        )

    def stop(self) -> None:
        end_head(self.temp_dir, self.client_server_port)


_RAY_OWN = ("ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::IDLE")


def ray_process_stacks(limit_chars: int = 60_000, timeout_s: float = 45.0) -> str:
    """``py-spy dump`` of the processes a run is made of on this machine (``ray::...`` but Ray's
    own agents and idle workers; the ``workers.launch`` job drivers; loader workers and their fork
    servers, which preload ``workers.data``), for a failed test's report: where a run that timed
    out was waiting. All at once, within ``timeout_s`` in all. ``ray stack`` dumps Ray's workers
    through ``sudo``, which CI may not have."""
    import psutil

    py_spy = str(Path(sys.executable).with_name("py-spy"))
    dumps: dict[int, tuple[str, subprocess.Popen]] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            cmdline = " ".join(proc.info["cmdline"] or [])
            ours = cmdline.startswith("ray::") and not cmdline.startswith(_RAY_OWN)
            if ours or "workers.launch" in cmdline or "workers.data" in cmdline:
                dumps[proc.pid] = (cmdline.strip()[:120], subprocess.Popen(
                    [py_spy, "dump", "--pid", str(proc.pid)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    text=True))
    deadline = time.monotonic() + timeout_s
    texts = []
    for pid, (cmdline, dump) in dumps.items():
        try:
            out, _ = dump.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            dump.kill()
            out = f"no dump within {timeout_s:.0f} s\n"
        texts.append(f"--- {pid} {cmdline}\n{out}")
    text = "\n".join(texts)
    return text if len(text) <= limit_chars else f"[first {limit_chars} characters]\n{text[:limit_chars]}"
