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

``python -m workers.fork_exec --warm`` only starts the node's server: the embedded Ray head's
start-up probe job runs it, so the first run's driver is forked too.

Stdlib only: this module runs before anything heavy is imported.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import signal
import socket
import stat
import sys
from pathlib import Path

# Variables that differ from one job to the next or that must not sit in a long-lived process:
# the server's environment leaves them out, and each child gets them from its own request.
PER_JOB_PREFIXES = ("TESSERA_", "AWS_")
# RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S is set for sweep drivers only (service.job_kinds) and Ray
# Train reads it when it builds a worker group (WorkerGroup.__init__ in Ray 2.60), not at import:
# left out, sweep drivers fork from the same warm server as run drivers. RAY_COLOR_PREFIX is read
# as Ray prints a worker's line, not at import, so a job may set it as it likes.
PER_JOB_ENV = frozenset({"RAY_JOB_CONFIG_JSON_ENV_VAR", "PWD", "OLDPWD", "SHLVL", "_",
                         "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "RAY_COLOR_PREFIX"})
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
ENABLE_ENV = "TESSERA_DRIVER_FORKS"
REPLY_TIMEOUT_S = 30.0
MAX_SOCKET_PATH = 100  # a unix socket's path holds at most 107 bytes on Linux
IDLE_ENV = "TESSERA_FORK_SERVER_IDLE_S"  # how long a server waits for its next driver (default 900)
RAY_GONE_ENV = "TESSERA_FORK_SERVER_RAY_GONE_S"  # how long its Ray cluster may not answer (default 30)


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


def forked_child(path: Path, module: str, args: list[str],
                 blocked: set[int]) -> tuple[socket.socket, int, bytes] | None:
    """Ask the server at ``path`` to fork ``module``: its connection, the child's pid and what
    the server sent after the pid; None where no server answers or it declines (the caller then
    runs the module itself). ``blocked``: the signal mask the child takes, as an exec would."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0)
    os.umask(umask)
    request = {"module": module, "args": args, "env": dict(os.environ), "cwd": os.getcwd(), "umask": umask,
               "blocked": sorted(int(s) for s in blocked)}
    try:
        sock.settimeout(REPLY_TIMEOUT_S)  # a stuck server: run cold (it kills a child we did not hear of)
        sock.connect(str(path))
        send_line(sock, request, fds=[0, 1, 2])
        reply, rest = read_line(sock)
        sock.settimeout(None)
    except (OSError, ValueError):
        sock.close()
        return None
    if not reply or "pid" not in reply:
        sock.close()
        return None
    return sock, int(reply["pid"]), rest  # rest may hold the exit already: a driver that ended at once


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
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # nothing of this job stays in the server
        options = [arg for name, flag in ((IDLE_ENV, "--idle-s"), (RAY_GONE_ENV, "--ray-gone-s"))
                   if os.environ.get(name) for arg in (flag, os.environ[name])]
        os.execve(sys.executable, [sys.executable, "-m", "workers.fork_server", "--socket", str(path), *options], env)
    finally:
        os._exit(1)


def exit_like(status: int) -> None:
    """Exit as a process that ended with ``status`` (negative: killed by that signal)."""
    if status < 0:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the driver dumped its core, if any; not us
        with contextlib.suppress(OSError):  # SIGKILL and SIGSTOP cannot be caught: nothing to reset
            signal.signal(-status, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {-status})
        os.kill(os.getpid(), -status)
    os._exit(status if 0 <= status < 256 else 1)


def read_exit(sock: socket.socket, rest: bytes, pid: int) -> int:
    """The child's exit status, as the server reports it (1 if the server goes first)."""
    reply, _ = read_line(sock, rest)
    if reply is None or "exit" not in reply:
        print(f"workers.fork_exec: the fork server stopped before driver {pid} ended", file=sys.stderr)
        return 1
    return int(reply["exit"])


def wait_for(sock: socket.socket, pid: int, rest: bytes) -> int:
    """Forward stop signals to the child's process group until the server reports its exit.
    The signals were blocked since main() began: one sent before now is forwarded here."""
    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError):  # the driver has already ended
            os.killpg(pid, signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(FORWARDED_SIGNALS))
    return read_exit(sock, rest, pid)


def warm(path: Path) -> None:
    """Start a server at ``path`` unless one answers there (``--warm``: a head's start-up probe)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        with contextlib.suppress(OSError):  # refused or absent: no server yet
            sock.connect(str(path))
            return
    print(f"workers.fork_exec: starting a warm interpreter at {path}", file=sys.stderr, flush=True)
    start_server(path)


def main(argv: list[str]) -> None:
    if not argv or (argv[0].startswith("-") and argv != ["--warm"]):
        print("usage: python -m workers.fork_exec MODULE [ARGS...] | --warm", file=sys.stderr)
        os._exit(2)
    # Until the driver's pid is known, a stop signal waits (blocked) instead of killing this
    # process alone, which would leave the driver to be SIGKILLed without its graceful stop.
    inherited = signal.pthread_sigmask(signal.SIG_BLOCK, set(FORWARDED_SIGNALS))
    module, args = argv[0], argv[1:]
    folder = server_dir()
    path = folder / f"{server_key(dict(os.environ), sys.executable)}.sock"
    enabled = (os.environ.get(ENABLE_ENV, "1") != "0" and sys.platform.startswith("linux")  # SO_PEERCRED
               and len(os.fsencode(path)) < MAX_SOCKET_PATH and private_dir(folder))
    if module == "--warm":
        if enabled:
            warm(path)
        signal.pthread_sigmask(signal.SIG_SETMASK, inherited)
        return
    if enabled:
        child = forked_child(path, module, args, inherited)
        if child is not None:
            print(f"workers.fork_exec: {module} forked as pid {child[1]} from the warm interpreter at {path}",
                  file=sys.stderr, flush=True)
            exit_like(wait_for(*child))
        print(f"workers.fork_exec: no warm interpreter at {path}: {module} starts cold, and one is started "
              "for the next driver", file=sys.stderr, flush=True)
        start_server(path)
    signal.pthread_sigmask(signal.SIG_SETMASK, inherited)  # a mask survives exec
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
