"""Start a job driver from a warm interpreter: ``python -m workers.fork_exec MODULE [ARGS...]``.

Every run attempt and sweep is a Ray job whose driver is a fresh ``python -m workers.launch``
(or ``workers.tune``). Most of that driver's start-up is importing torch and Ray Train (~2.3 s
on 2 cores), paid again by every run. This entry point asks a fork server
(``workers.fork_server``) on the same node, which has those imports done, to fork a child that
runs ``MODULE`` as ``__main__`` with this process's stdin/stdout/stderr, environment, working
directory and arguments. This process stays as the child's stand-in for Ray: it forwards
SIGTERM, SIGINT and SIGHUP (Ray's job stop) to the child's process group and exits as the child
did. If this process is killed, the server kills the child, so a job's driver still lives and
dies with its job.

Where no server answers yet, this process starts one in the background for the next job and
runs ``MODULE`` itself, by ``exec``: the first job on a node pays the imports as before.
``TESSERA_DRIVER_FORKS=0`` turns the server off (every driver starts cold).

One server serves one environment: the key in its socket's name hashes the interpreter and
every variable of the environment except those a job sets for itself (``PER_JOB_ENV``), so a
driver always runs with the library state a cold start with its environment would give
(``OMP_NUM_THREADS``, ``RAY_*`` and the like are read when torch and Ray are imported).

Stdlib only: this module runs before anything heavy is imported.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import stat
import sys
from pathlib import Path

# Variables that differ from one job to the next or that must not sit in a long-lived process:
# the server's environment leaves them out, and each child gets them from its own request.
PER_JOB_PREFIXES = ("TESSERA_", "AWS_")
PER_JOB_ENV = frozenset({"RAY_JOB_CONFIG_JSON_ENV_VAR", "PWD", "OLDPWD", "SHLVL", "_"})
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
ENABLE_ENV = "TESSERA_DRIVER_FORKS"
REPLY_TIMEOUT_S = 30.0
IDLE_ENV = "TESSERA_FORK_SERVER_IDLE_S"  # how long a server waits for its next driver (default 900)


def server_env(env: dict[str, str]) -> dict[str, str]:
    """The environment a fork server for a job with ``env`` runs with."""
    return {k: v for k, v in env.items() if k not in PER_JOB_ENV and not k.startswith(PER_JOB_PREFIXES)}


def server_key(env: dict[str, str], executable: str) -> str:
    """Which server may fork a driver for ``env``: equal keys, equal imports."""
    items = sorted(server_env(env).items())
    return hashlib.sha256(json.dumps([executable, items]).encode()).hexdigest()[:16]


def server_dir() -> Path:
    """This user's folder of fork-server sockets (0700: a socket there runs code as this user)."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"tessera-forks-{os.getuid()}"


def private_dir(path: Path) -> bool:
    """Create ``path`` (0700) or check that it is this user's alone; False if it is not."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700


def send_line(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode() + b"\n"
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        data = data[sent:]
    sock.sendall(data)


def read_line(sock: socket.socket, first: bytes = b"") -> tuple[dict | None, bytes]:
    """One JSON line from ``sock`` (None at EOF before a full line), and the bytes after it."""
    buffer = first
    while b"\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            return None, buffer
        buffer += chunk
    line, rest = buffer.split(b"\n", 1)
    return json.loads(line), rest


def forked_child(path: Path, module: str, args: list[str]) -> tuple[socket.socket, int] | None:
    """Ask the server at ``path`` to fork ``module``; its connection and the child's pid, or
    None where no server answers or it declines (the caller then runs the module itself)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(REPLY_TIMEOUT_S)  # a stuck server: run cold (it kills a child we did not hear of)
        sock.connect(str(path))
        send_line(sock, {"module": module, "args": args, "env": dict(os.environ), "cwd": os.getcwd()},
                  fds=[0, 1, 2])
        reply, _ = read_line(sock)
        sock.settimeout(None)
    except (OSError, ValueError):
        sock.close()
        return None
    if not reply or "pid" not in reply:
        sock.close()
        return None
    return sock, int(reply["pid"])


def start_server(path: Path) -> None:
    """Start a fork server at ``path`` in its own session, detached from this job (a double
    fork: Ray stops a job by signalling the driver's process tree, which must not hold it)."""
    env = server_env(dict(os.environ))
    log = path.with_suffix(".log")
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:  # the intermediate child: a new session, then the server as its orphan
        os.setsid()
        if os.fork():
            os._exit(0)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        idle = ["--idle-s", os.environ[IDLE_ENV]] if os.environ.get(IDLE_ENV) else []
        os.execve(sys.executable, [sys.executable, "-m", "workers.fork_server", "--socket", str(path), *idle], env)
    finally:
        os._exit(1)


def exit_like(status: int) -> None:
    """Exit as a process that ended with ``status`` (negative: killed by that signal)."""
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status if 0 <= status < 256 else 1)


def wait_for(sock: socket.socket, pid: int) -> int:
    """Forward stop signals to the child's process group until the server reports its exit."""
    def forward(signum, _frame):
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(FORWARDED_SIGNALS))  # Ray blocks SIGINT
    reply, _ = read_line(sock)
    if reply is None or "exit" not in reply:
        print(f"workers.fork_exec: the fork server stopped before driver {pid} ended", file=sys.stderr)
        return 1
    return int(reply["exit"])


def main(argv: list[str]) -> None:
    if not argv or argv[0].startswith("-"):
        print("usage: python -m workers.fork_exec MODULE [ARGS...]", file=sys.stderr)
        os._exit(2)
    module, args = argv[0], argv[1:]
    folder = server_dir()
    if os.environ.get(ENABLE_ENV, "1") != "0" and private_dir(folder):
        path = folder / f"{server_key(dict(os.environ), sys.executable)}.sock"
        child = forked_child(path, module, args)
        if child is not None:
            print(f"workers.fork_exec: {module} forked as pid {child[1]} from the warm interpreter at {path}",
                  file=sys.stderr, flush=True)
            exit_like(wait_for(*child))
        print(f"workers.fork_exec: no warm interpreter at {path}: {module} starts cold, and one is started "
              "for the next driver", file=sys.stderr, flush=True)
        start_server(path)
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
