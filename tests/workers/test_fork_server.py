"""workers.fork_exec / workers.fork_server: job drivers forked from a warm interpreter.

Real processes throughout: each test runs ``python -m workers.fork_exec`` as Ray's job
supervisor would (a shell command with its own stdout), against a fork server the first call
starts in this test's own TMPDIR (a short folder: ``make_node``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.e2e.conftest import wait_until
from workers.fork_exec import read_exit, read_line, send_line, server_env, server_key

# Prints what a driver sees, then traps, kills itself, raises, sleeps or exits as the test asks
# (TESSERA_PROBE_* variables: per-job, so they never change which server forks it).
PROBE = """
import json, os, signal, sys, time
if os.environ.get("TESSERA_PROBE_TRAP"):  # a graceful stop: say so, exit 42
    signal.signal(signal.SIGTERM, lambda *_: (print("trapped", flush=True), os._exit(42)))
stdio = {os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)}
fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
print(json.dumps({"stdio_dups": [fd for fd in fds if fd > 2 and os.path.exists(f"/proc/self/fd/{fd}")
                                 and os.readlink(f"/proc/self/fd/{fd}") in stdio],
                  "pid": os.getpid(), "argv": sys.argv, "cwd": os.getcwd(), "warm": "torch" in sys.modules,
                  "secret": os.environ.get("TESSERA_RUN_TOKEN"), "path": sys.path,
                  "draw": sys.modules["numpy"].random.random() if "numpy" in sys.modules else None}), flush=True)
if os.environ.get("TESSERA_PROBE_KILL9"):
    os.kill(os.getpid(), signal.SIGKILL)
if os.environ.get("TESSERA_PROBE_RAISE"):
    raise RuntimeError("the probe failed on purpose")
time.sleep(float(os.environ.get("TESSERA_PROBE_SLEEP", "0")))
sys.exit(int(os.environ.get("TESSERA_PROBE_EXIT", "0")))
"""


def make_node():
    """A cwd holding the probe module, and an environment whose fork servers live there (its
    TMPDIR); stops the servers it started and removes the folder. A short folder of its own,
    not pytest's tmp_path: a socket's path must stay under ``MAX_SOCKET_PATH`` bytes, which
    ``/tmp/pytest-of-USER/pytest-NNN/<test name>/...`` passes once pytest's count reaches 100
    (fork_exec then starts every driver cold, as it should)."""
    folder = Path(tempfile.mkdtemp(prefix="tfs-", dir="/tmp"))
    (folder / "probe_driver.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "RAY_ADDRESS"))}
    env.update({"TMPDIR": str(folder), "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"})
    yield folder, env
    for pid in server_pids(folder):  # each logs its pid before it preloads
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        wait_gone(pid, timeout_s=30)
    shutil.rmtree(folder, ignore_errors=True)


def server_pids(tmp_path: Path) -> set[int]:
    logs = (tmp_path / f"tessera-forks-{os.getuid()}").glob("*.log")
    return {int(line.split("fork_server[")[1].split("]")[0]) for log in logs
            for line in log.read_text().splitlines() if "fork_server[" in line}


@pytest.fixture
def node():
    yield from make_node()


@pytest.fixture(scope="module")
def warm_node():
    """One node whose fork server is up, shared by the tests that only need a warm server."""
    nodes = make_node()
    cwd, env = next(nodes)
    run_driver(cwd, env)
    wait_until_serving(cwd, env)
    yield cwd, env
    next(nodes, None)


def wait_gone(pid: int, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still runs after {timeout_s} s")


def signal_state(pid: int) -> str:
    """A process's state and signal masks (hex bit sets) from /proc, or why they cannot be read."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return f"{pid}: {exc!r}"
    return f"{pid}: " + ", ".join(line for line in lines if line.startswith(("State", "SigPnd", "ShdPnd", "SigBlk",
                                                                              "SigIgn", "SigCgt")))


def where_it_hangs(proc: subprocess.Popen, driver_pid: int, cwd: Path, env: dict[str, str]) -> str:
    """What a hung stand-in, its driver and their server show: for a test's failure message."""
    state = f"stand-in {signal_state(proc.pid)}\ndriver {signal_state(driver_pid)}"
    for pid in (proc.pid, driver_pid):  # the driver holds the stand-in's pipes: both go, or no EOF comes
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        err = "(still open 10 s after both were killed)"
    log = serving_log(cwd, env)
    tail = "\n".join(log.read_text().splitlines()[-20:]) if log.exists() else "(no server log)"
    return f"{state}\nthe stand-in's stderr:\n{err}\nthe server's log:\n{tail}"


def start_driver(cwd: Path, env: dict[str, str], *args: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workers.fork_exec", "probe_driver", *args], cwd=cwd,
                            env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_driver(cwd: Path, env: dict[str, str], *args: str, **extra: str) -> tuple[int, dict, str]:
    proc = start_driver(cwd, env, *args, **extra)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, json.loads(out.splitlines()[0]), err


def serving_log(cwd: Path, env: dict[str, str]) -> Path:
    return cwd / f"tessera-forks-{os.getuid()}" / f"{server_key(env, sys.executable)}.log"


def wait_until_serving(cwd: Path, env: dict[str, str], timeout_s: float = 60) -> None:
    log = serving_log(cwd, env)
    wait_until(lambda: log.exists() and "serving" in log.read_text(), timeout=timeout_s, interval=0.05,
               what=f"a fork server to serve at {log.with_suffix('.sock')}")


def test_the_first_driver_runs_cold_and_the_next_is_forked_warm_with_its_own_arguments_and_exit_code(node):
    cwd, env = node
    code, first, _ = run_driver(cwd, env, "a", TESSERA_PROBE_EXIT="3")
    assert code == 3 and first["warm"] is False
    wait_until_serving(cwd, env)
    code, second, _ = run_driver(cwd, env, "b", "c", TESSERA_PROBE_EXIT="4", TESSERA_RUN_TOKEN="tok-2")
    assert code == 4 and second["warm"] is True
    assert second["argv"][1:] == ["b", "c"] and second["argv"][0].endswith("probe_driver.py")
    assert second["cwd"] == str(cwd) and str(cwd) in second["path"]  # where `python -m` puts it
    assert second["secret"] == "tok-2"  # a per-job variable reaches the child...
    assert second["stdio_dups"] == [] and first["stdio_dups"] == []  # no stray copy of the job's stdio
    server_pid = int(serving_log(cwd, env).read_text().split("fork_server[")[1].split("]")[0])
    environ = Path(f"/proc/{server_pid}/environ").read_bytes()
    assert b"tok-2" not in environ and b"TESSERA_PROBE_EXIT" not in environ  # ...never the server


def test_forked_drivers_do_not_share_the_random_state_a_cold_start_seeds_from_the_os(warm_node):
    cwd, env = warm_node
    draws = [run_driver(cwd, env)[1] for _ in range(2)]
    assert all(d["warm"] for d in draws) and draws[0]["draw"] != draws[1]["draw"]


def test_a_forked_driver_killed_by_sigkill_ends_its_stand_in_the_same_way(warm_node):
    cwd, env = warm_node
    proc = start_driver(cwd, env, TESSERA_PROBE_KILL9="1")
    out, err = proc.communicate(timeout=60)
    assert json.loads(out.splitlines()[0])["warm"] is True
    assert proc.returncode == -signal.SIGKILL and "Traceback" not in err


def test_an_uncaught_exception_in_a_forked_driver_exits_1_with_its_traceback(warm_node):
    cwd, env = warm_node
    code, out, err = run_driver(cwd, env, TESSERA_PROBE_RAISE="1")
    assert code == 1 and out["warm"] is True
    assert "RuntimeError: the probe failed on purpose" in err


def test_a_stop_signal_to_the_stand_in_reaches_the_forked_driver(warm_node):
    cwd, env = warm_node
    proc = start_driver(cwd, env, TESSERA_PROBE_SLEEP="60", TESSERA_PROBE_TRAP="1")
    driver = json.loads(proc.stdout.readline())
    assert driver["warm"] is True and driver["pid"] != proc.pid
    proc.send_signal(signal.SIGTERM)  # what Ray's job stop does
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the stand-in still runs 30 s after its SIGTERM\n{where_it_hangs(proc, driver['pid'], cwd, env)}")
    assert code == 42  # the driver stopped gracefully, and the stand-in exits as it did
    assert proc.stdout.read().strip() == "trapped"
    wait_gone(driver["pid"], timeout_s=10)


def test_killing_the_stand_in_kills_the_forked_driver(warm_node):
    cwd, env = warm_node
    proc = start_driver(cwd, env, TESSERA_PROBE_SLEEP="60")
    driver = json.loads(proc.stdout.readline())
    assert driver["warm"] is True
    proc.kill()  # Ray's SIGKILL after its stop timeout, or the supervisor's death
    proc.wait(timeout=30)
    wait_gone(driver["pid"], timeout_s=10)


def test_a_driver_with_another_library_environment_is_not_forked_from_this_server(warm_node):
    cwd, env = warm_node
    other = {**env, "OMP_NUM_THREADS": "7"}  # torch read it at import: the server's value would stick
    assert server_key(other, sys.executable) != server_key(env, sys.executable)
    code, out, _ = run_driver(cwd, other)
    assert code == 0 and out["warm"] is False


def test_forks_turned_off_run_every_driver_cold_and_start_no_server(node):
    cwd, env = node
    off = {**env, "TESSERA_DRIVER_FORKS": "0"}
    for _ in range(2):
        code, out, _ = run_driver(cwd, off)
        assert code == 0 and out["warm"] is False
    assert not (cwd / f"tessera-forks-{os.getuid()}").exists()


def test_a_server_stops_once_its_ray_cluster_stops_answering(node):
    cwd, env = node
    gone = {**env, "RAY_ADDRESS": "127.0.0.1:9",  # nothing listens on the discard port
            "TESSERA_FORK_SERVER_RAY_GONE_S": "3"}
    run_driver(cwd, gone)
    wait_until_serving(cwd, gone)
    log = serving_log(cwd, gone)
    server_pid = int(log.read_text().split("fork_server[")[1].split("]")[0])
    wait_gone(server_pid, timeout_s=30)
    assert "Ray at 127.0.0.1:9 stopped answering; taking no more requests" in log.read_text()


def test_the_server_environment_leaves_out_per_job_variables_and_secrets():
    env = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "TESSERA_RUN_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s",
           "RAY_JOB_CONFIG_JSON_ENV_VAR": "{}", "RAY_ADDRESS": "10.0.0.1:6379"}
    assert server_env(env) == {"PATH": "/bin", "OMP_NUM_THREADS": "1", "RAY_ADDRESS": "10.0.0.1:6379"}
    # A sweep driver's job adds Ray Train's worker-group start timeout, and every job of the service
    # a plain colour prefix, which the start-up probe that warms the server lacks: one server serves all.
    again = {**env, "TESSERA_RUN_TOKEN": "other", "RAY_JOB_CONFIG_JSON_ENV_VAR": '{"a": 1}',
             "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "30", "RAY_COLOR_PREFIX": "0"}
    assert server_key(again, "/usr/bin/python3") == server_key(env, "/usr/bin/python3")
    assert server_key(env, "/usr/bin/python3") != server_key(env, "/opt/venv/bin/python")


def test_a_server_told_to_stop_lets_its_running_driver_end_and_report_its_status(node):
    cwd, env = node
    run_driver(cwd, env)
    wait_until_serving(cwd, env)
    proc = start_driver(cwd, env, TESSERA_PROBE_SLEEP="3", TESSERA_PROBE_EXIT="5")
    assert json.loads(proc.stdout.readline())["warm"] is True
    (server_pid,) = server_pids(cwd)
    os.kill(server_pid, signal.SIGTERM)
    log = serving_log(cwd, env)
    wait_until(lambda: "SIGTERM; taking no more requests, 1 running driver(s) end first" in log.read_text(),
               timeout=60, what="the server to stop taking requests")
    code, out, _ = run_driver(cwd, env)  # meanwhile: cold, and it starts the next server
    assert code == 0 and out["warm"] is False
    assert proc.wait(timeout=30) == 5  # the old server's driver ended as it would have
    wait_gone(server_pid, timeout_s=15)
    assert f"fork_server[{server_pid}]: stopped" in log.read_text()
    wait_until(lambda: log.read_text().count("serving") == 2, timeout=60,
               what="a new server to take the socket")


def test_an_exit_status_sent_with_the_pid_is_not_lost():
    """A driver that ends at once: the server's pid and exit lines arrive in one read."""
    server, stand_in = socket.socketpair()
    with server, stand_in:
        server.sendall(b'{"pid": 7}\n{"exit": 4}\n')
        reply, rest = read_line(stand_in)
        assert reply == {"pid": 7} and read_exit(stand_in, rest, 7) == 4
        send_line(server, {"exit": 3})
        assert read_exit(stand_in, b"", 7) == 3
