"""A warm interpreter that forks job drivers: ``python -m workers.fork_server --socket PATH``.

Started by ``workers.fork_exec`` (never by hand) with a job's environment minus its per-job
variables. It imports what every driver imports first (torch, Ray, Ray Train and Tune: 2.3 s
on 2 cores) and then, for each request on its unix socket, forks a child that becomes the
driver (``workers.fork_child``): it takes the request's stdin/stdout/stderr (passed as file
descriptors), environment, working directory and arguments, and runs the module as
``__main__``. Tessera's training code is not preloaded, so a driver runs the code on disk.

The server reports each child's exit status on its request's connection; when that connection
drops (the job's stand-in was killed), it kills the child's process group. Requests are served
from one thread, the only one a fork copies (torch and pyarrow start idle native threads at
import; both handle a fork).

It stops taking requests when it has had no child for ``--idle-s`` seconds, when the Ray cluster
at ``RAY_ADDRESS`` has not answered for ``--ray-gone-s``, when its socket is no longer its
own, or on SIGTERM; it exits once its running drivers have ended. An exclusive lock beside the
socket keeps one server per socket. It logs to ``PATH`` with ``.log`` (appended).

CUDA is never initialised here: a forked child could not use it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path

from workers.fork_child import become_driver, end
from workers.fork_exec import read_line, send_line

# What a driver imports before it does anything of its own. Third-party only: see the docstring.
PRELOAD = ("torch", "ray", "ray.train", "ray.train.torch", "ray.tune", "httpx", "pydantic", "yaml")
CHECK_EVERY_S = 2.0
REQUEST_TIMEOUT_S = 5.0


def log(message: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # a full disk must not break the server
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} fork_server[{os.getpid()}]: {message}", file=sys.stderr,
              flush=True)


def host_and_port(address: str) -> tuple[str, int] | None:
    """``host:port`` or ``[v6]:port`` as Ray writes GCS addresses; None if it is neither."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)


def ray_is_up(address: str | None) -> bool:
    """Whether the GCS at ``address`` accepts connections (True without an address)."""
    target = host_and_port(address) if address else None
    if target is None:
        return True
    try:
        with socket.create_connection(target, timeout=1.0):
            return True
    except OSError:
        return False


def parent_cmdline() -> bytes:
    try:
        return Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return b""


def captured_by_ray() -> bool:
    """Whether a Ray process adopted this orphan (Ray's subreaper option), which would kill it,
    and so every driver it forked, when that process ends."""
    deadline = time.monotonic() + 2.0
    while b"workers.fork_exec" in parent_cmdline() and time.monotonic() < deadline:
        time.sleep(0.01)  # the double fork's middle process is about to exit
    parent = parent_cmdline()
    return parent.startswith(b"ray::") or b"raylet" in parent


class ForkServer:
    def __init__(self, path: Path, *, idle_s: float, ray_gone_s: float, lock_fd: int):
        self.path = path
        self.ray_gone_s = ray_gone_s
        self.lock_fd = lock_fd  # held while it takes requests; never by a child
        self.idle_s = idle_s
        # `python -m` put the starting job's cwd first; a child puts its own there. Read before
        # preload(): `import ray` inserts its thirdparty_files at sys.path[0].
        self.path0 = sys.path[0]
        self.children: dict[int, socket.socket] = {}  # pid -> its request's connection
        self.selector = selectors.DefaultSelector()
        self.wakeup_r, self.wakeup_w = socket.socketpair()
        self.listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.inode = 0
        self.idle_since = time.monotonic()
        self.checked_at = 0.0
        self.ray_down_since: float | None = None
        self.stop_reason: str | None = None

    def bind(self) -> None:
        self.path.unlink(missing_ok=True)  # a dead server's socket: the lock says none is alive
        self.listener.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self.listener.listen(64)
        self.inode = self.path.stat().st_ino
        for sock in (self.listener, self.wakeup_r, self.wakeup_w):
            sock.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wakeup_r, selectors.EVENT_READ, "signal")
        signal.set_wakeup_fd(self.wakeup_w.fileno())
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd hears it
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, *_: object) -> None:
        self.stop_reason = "SIGTERM"

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select(timeout=CHECK_EVERY_S):
                try:
                    if key.data == "accept":
                        self.accept()
                    elif key.data == "signal":
                        self.wakeup_r.recv(4096)
                    else:
                        self.client_gone(key.data)
                except Exception as exc:  # noqa: BLE001 - one bad event must not end every driver
                    log(f"{key.data!r}: {exc!r}")
            self.reap()
            if self.listener is not None:
                try:
                    reason = self.stop_reason or self.check()
                except Exception as exc:  # noqa: BLE001 - stop taking requests; running drivers go on
                    reason = f"checking failed: {exc!r}"
                if reason:
                    self.stop_listening(reason)
            if self.listener is None and not self.children:
                return

    def check(self) -> str | None:
        """Why to stop taking requests, if it is time to (asked at most every CHECK_EVERY_S)."""
        now = time.monotonic()
        if now - self.checked_at < CHECK_EVERY_S:
            return None
        self.checked_at = now
        try:
            if self.path.stat().st_ino != self.inode:
                return "socket replaced"
        except FileNotFoundError:
            return "socket removed"
        address = os.environ.get("RAY_ADDRESS")
        if ray_is_up(address):
            self.ray_down_since = None
        else:
            self.ray_down_since = self.ray_down_since or now
            if now - self.ray_down_since >= self.ray_gone_s:
                return f"Ray at {address} stopped answering"
        if not self.children and now - self.idle_since > self.idle_s:
            return f"idle for {self.idle_s:.0f} s"
        return None

    def stop_listening(self, reason: str) -> None:
        log(f"{reason}; taking no more requests, {len(self.children)} running driver(s) end first")
        with contextlib.suppress(KeyError, ValueError):  # not registered if bind() failed
            self.selector.unregister(self.listener)
        self.listener.close()
        self.listener = None
        with contextlib.suppress(OSError):
            if self.inode and self.path.stat().st_ino == self.inode:
                self.path.unlink()
        os.close(self.lock_fd)  # a new server may take this socket while our drivers run on
        self.lock_fd = -1

    def accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        pid = None
        try:
            conn.setblocking(True)
            conn.settimeout(REQUEST_TIMEOUT_S)
            cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)  # pid, uid, gid
            if int.from_bytes(cred[4:8], sys.byteorder) != os.getuid():
                raise PermissionError("a request from another user")
            data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
            try:
                if not data and not fds:  # a liveness check (fork_exec --warm): nothing to do
                    conn.close()
                    return
                request, _ = read_line(conn, data)
                if not valid(request) or len(fds) != 3:
                    raise ValueError("an incomplete or malformed request")
                pid = self.fork_child(conn, fds, request)
            finally:
                for fd in fds:
                    os.close(fd)
            send_line(conn, {"pid": pid})
            conn.settimeout(None)
            self.children[pid] = conn
            self.selector.register(conn, selectors.EVENT_READ, pid)
        except Exception as exc:  # noqa: BLE001 - drop this request, keep serving
            log(f"dropped a request: {exc!r}")
            if pid is not None and pid not in self.children:  # its stand-in runs it cold instead
                kill_group(pid)
            conn.close()

    def fork_child(self, conn: socket.socket, fds: list[int], request: dict) -> int:
        server_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                # Stop signals wait until the child has taken the job's state (become_driver).
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
                signal.set_wakeup_fd(-1)
                for signum in (signal.SIGCHLD, signal.SIGTERM):
                    signal.signal(signum, signal.SIG_DFL)
                self.selector.close()
                for sock in (self.listener, self.wakeup_r, self.wakeup_w, conn, *self.children.values()):
                    sock.close()
                os.close(self.lock_fd)
                code = become_driver(request, fds, server_pid=server_pid, server_path0=self.path0)
            except BaseException:  # noqa: BLE001 - the child must never return into the server
                with contextlib.suppress(Exception):
                    sys.excepthook(*sys.exc_info())
            end(code)
        with contextlib.suppress(OSError):  # also here, so a signal forwarded at once finds the group
            os.setpgid(pid, pid)
        log(f"forked {request['module']} {' '.join(request['args'])} as {pid}")
        return pid

    def reap(self) -> None:
        while True:  # also children whose stand-in never heard of them (not in self.children)
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            log(f"driver {pid} exited with {code}")
            with contextlib.suppress(KeyError):  # client_gone() may have unregistered it
                self.selector.unregister(conn)
            with contextlib.suppress(OSError):
                send_line(conn, {"exit": code})
            conn.close()
            if not self.children:
                self.idle_since = time.monotonic()

    def client_gone(self, pid: int) -> None:
        """The stand-in's connection is readable: it has gone (it never sends more)."""
        conn = self.children.get(pid)
        if conn is None:  # reaped in this same round
            return
        try:
            if conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                return  # it never sends more than its request; leave it be
        except BlockingIOError:
            return
        except OSError as exc:  # reset by the peer: gone as surely as at EOF
            log(f"the connection of driver {pid} broke: {exc!r}")
        log(f"the job of driver {pid} has gone; killing the driver")
        kill_group(pid)
        self.selector.unregister(conn)  # reap() will find the child and close the connection

    def close(self) -> None:
        """After serve(): unhook the wakeup fd (its socket closes with this process)."""
        signal.set_wakeup_fd(-1)
        if self.listener is not None:
            self.stop_listening("closing")


def valid(request: object) -> bool:
    return (isinstance(request, dict) and isinstance(request.get("module"), str)
            and isinstance(request.get("args"), list) and all(isinstance(a, str) for a in request["args"])
            and isinstance(request.get("env"), dict) and isinstance(request.get("cwd"), str))


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def preload() -> None:
    started = time.monotonic()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a missing extra only makes its drivers import it
            log(f"preloading {name} failed: {exc!r}")
    log(f"preloaded {', '.join(PRELOAD)} in {time.monotonic() - started:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.fork_server", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--idle-s", type=float, default=900.0, help="stop after this long without a driver")
    parser.add_argument("--ray-gone-s", type=float, default=30.0,  # a GCS restart is not a cluster gone
                        help="stop once the Ray cluster at RAY_ADDRESS has not answered for this long")
    args = parser.parse_args(argv)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())  # not the stand-in's mask (Ray blocks SIGINT)
    lock = os.open(args.socket.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another server holds this socket
    if captured_by_ray():
        log("adopted by a Ray process (Ray's subreaper option?), which would kill this server and its "
            "drivers with it; not serving: drivers start cold")
        return 0
    log(f"starting for {args.socket}")
    server = ForkServer(args.socket, idle_s=args.idle_s, ray_gone_s=args.ray_gone_s, lock_fd=lock)
    preload()
    try:
        server.bind()
        log(f"serving {args.socket}")
        server.serve()
    finally:
        server.close()
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
