"""A warm interpreter that forks job drivers: ``python -m workers.fork_server --socket PATH``.

Started by ``workers.fork_exec`` (never by hand) with a job's environment minus its per-job
variables. It imports what every driver imports first (torch, Ray, Ray Train and Tune: 2.3 s
on 2 cores) and then, for each request on its unix socket, forks a child that becomes the
driver: it takes the request's stdin/stdout/stderr (passed as file descriptors), environment,
working directory and arguments, and runs the module as ``__main__``. Tessera's own modules are
not preloaded, so a driver always runs the code on disk.

The server reports each child's exit status on its request's connection; when that connection
drops (the job's stand-in was killed), it kills the child's process group. It runs single
threaded (a fork copies only the calling thread) and exits when it has had no child for
``--idle-s`` seconds, when the Ray cluster at ``RAY_ADDRESS`` stops
answering, or when its socket is no longer its own. An exclusive lock beside the socket keeps
one server per socket.

CUDA is never initialised here: a forked child could not use it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import importlib
import os
import random
import runpy
import selectors
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

from workers.fork_exec import read_line, send_line

# What a driver imports before it does anything of its own. Third-party only: see the docstring.
PRELOAD = ("torch", "ray", "ray.train", "ray.train.torch", "ray.tune", "httpx", "pydantic", "yaml")
CHECK_EVERY_S = 2.0
REQUEST_TIMEOUT_S = 5.0
PR_SET_PDEATHSIG = 1


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} fork_server[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def ray_is_up(address: str | None) -> bool:
    """Whether the GCS at ``host:port`` accepts connections (True without an address)."""
    if not address or ":" not in address:
        return True
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


class ForkServer:
    def __init__(self, path: Path, *, idle_s: float, lock_fd: int):
        self.path = path
        self.lock_fd = lock_fd  # held for the server's life; never by a child
        self.idle_s = idle_s
        self.children: dict[int, socket.socket] = {}  # pid -> its request's connection
        self.selector = selectors.DefaultSelector()
        self.wakeup_r, self.wakeup_w = socket.socketpair()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.idle_since = time.monotonic()
        self.ray_misses = 0

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
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select(timeout=CHECK_EVERY_S):
                if key.data == "accept":
                    self.accept()
                elif key.data == "signal":
                    self.wakeup_r.recv(4096)
                    self.reap()
                else:
                    self.client_gone(key.data)
            self.reap()  # a SIGCHLD during accept() is in the wakeup fd, but be sure
            if self.should_stop():
                return

    def should_stop(self) -> bool:
        try:
            if self.path.stat().st_ino != self.inode:
                log("socket replaced; stopping")
                return True
        except FileNotFoundError:
            log("socket removed; stopping")
            return True
        self.ray_misses = 0 if ray_is_up(os.environ.get("RAY_ADDRESS")) else self.ray_misses + 1
        if self.ray_misses >= 2:
            log(f"Ray at {os.environ.get('RAY_ADDRESS')} stopped answering; stopping")
            return True
        if not self.children and time.monotonic() - self.idle_since > self.idle_s:
            log(f"idle for {self.idle_s:.0f} s; stopping")
            return True
        return False

    def accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        try:
            conn.setblocking(True)
            conn.settimeout(REQUEST_TIMEOUT_S)
            uid = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            if int.from_bytes(uid[4:8], sys.byteorder) != os.getuid():
                raise PermissionError("a request from another user")
            data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
            try:
                request, _ = read_line(conn, data)
                if request is None or len(fds) != 3:
                    raise ValueError("an incomplete request")
                pid = self.fork_child(conn, fds, request)
            finally:
                for fd in fds:
                    os.close(fd)
        except (OSError, ValueError, KeyError) as exc:
            log(f"dropped a request: {exc!r}")
            conn.close()
            return
        try:
            send_line(conn, {"pid": pid})
        except OSError as exc:  # the stand-in gave up waiting and runs the driver itself
            log(f"the job of driver {pid} has gone before it heard of it ({exc!r}); killing the driver")
            kill_group(pid)
            conn.close()
            return
        conn.settimeout(None)
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def fork_child(self, conn: socket.socket, fds: list[int], request: dict) -> int:
        module, args, env, cwd = request["module"], list(request["args"]), dict(request["env"]), request["cwd"]
        pid = os.fork()
        if pid == 0:
            try:
                code = self.become_driver(conn, fds, module, args, env, cwd)
            except BaseException:  # noqa: BLE001 - the child must never return into the server
                traceback.print_exc()
                code = 1
            os._exit(code)
        try:
            os.setpgid(pid, pid)  # also here, so a signal forwarded at once finds the group
        except OSError:
            pass  # the child did it first, or has already exited
        log(f"forked {module} {' '.join(args)} as {pid}")
        return pid

    def become_driver(self, conn: socket.socket, fds: list[int], module: str, args: list[str],
                      env: dict[str, str], cwd: str) -> int:
        """In the child: take the request's process state, run ``module``, exit as it would."""
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.selector.close()
        for sock in (self.listener, self.wakeup_r, self.wakeup_w, conn, *self.children.values()):
            sock.close()
        os.close(self.lock_fd)
        os.setpgid(0, 0)  # its own group: the stand-in forwards signals to it, the server kills it
        die_with_server()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.path[0] = cwd  # as `python -m` puts it
        reseed()
        sys.argv = [module, *args]
        set_title(" ".join([sys.executable, "-m", module, *args]))
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exit_code(exc.code)
        except KeyboardInterrupt:
            code = 130
        except BaseException:  # noqa: BLE001 - as the interpreter would report it
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()  # ray.init registers ray.shutdown here
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        return code

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
            try:
                send_line(conn, {"exit": code})
            except OSError:
                pass
            conn.close()
            if not self.children:
                self.idle_since = time.monotonic()

    def client_gone(self, pid: int) -> None:
        """The stand-in's connection is readable: it has gone (it never sends more)."""
        conn = self.children[pid]
        try:
            if conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        log(f"the job of driver {pid} has gone; killing the driver")
        kill_group(pid)
        self.selector.unregister(conn)  # reap() will find the child without a connection

    def close(self) -> None:
        for pid in list(self.children):
            kill_group(pid)
        try:
            if self.path.stat().st_ino == getattr(self, "inode", None):
                self.path.unlink()
        except FileNotFoundError:
            pass


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def exit_code(code: object) -> int:
    """The status ``sys.exit(code)`` gives a process."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def reseed() -> None:
    """Fresh seeds for the generators a cold interpreter seeds from the OS at import, which a
    fork would otherwise share with every sibling (an unseeded Tune search drawing the same
    samples in two sweeps, say). torch's default generator starts from a fixed seed anyway."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def set_title(title: str) -> None:
    """Show ``title`` as this process's command line (``ps``, ``pgrep -f``), as a cold driver's
    would read. Ray's own setproctitle (private: it names Ray's workers); without it the
    server's command line stays."""
    try:
        from ray._raylet import setproctitle
    except ImportError:
        return
    setproctitle(title)


def die_with_server() -> None:
    """Have the kernel kill this child if the server dies (Linux; elsewhere best effort)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


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
    args = parser.parse_args(argv)
    lock = os.open(args.socket.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another server holds this socket
    server = ForkServer(args.socket, idle_s=args.idle_s, lock_fd=lock)
    preload()
    try:
        server.bind()
        log(f"serving {args.socket}")
        server.serve()
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
