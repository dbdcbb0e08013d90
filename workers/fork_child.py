"""How a child forked by ``workers.fork_server`` becomes a job driver, as a cold start would.

``python -m MODULE`` in a fresh interpreter would have: the job's stdin/stdout/stderr and no
other descriptor of it, the job's environment, working directory, umask and signal mask,
``sys.argv[0]`` the module's file and ``sys.path[0]`` the working directory, ``MODULE`` as
``__main__`` until the end, fresh random seeds, and the interpreter's ending: non-daemon threads
joined, ``atexit`` handlers run (``ray.init`` registers ``ray.shutdown``), an uncaught exception
through ``sys.excepthook`` (Ray's records a driver's error) with status 1, ``KeyboardInterrupt``
as death by SIGINT. ``become_driver`` gives the child all of that.

What stays the server's: modules already imported (third-party ones, and the ``workers``
package with these fork modules), the hash seed, resource limits, nice value and cgroup,
``sys.orig_argv``. And the child ends with ``os._exit`` after ``atexit``, not the interpreter's
finalisation: a file the driver leaves open unflushed loses what is buffered (Tessera's drivers
close theirs).
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib.util
import os
import random
import signal
import sys
import threading
import types
from typing import Any

PR_SET_PDEATHSIG = 1


def become_driver(request: dict[str, Any], fds: list[int], *, server_pid: int, server_path0: str) -> int:
    """Take the request's process state and run its module; the status to exit with (negative:
    the signal to die of). Call in the child, with the server's sockets already closed."""
    os.setpgid(0, 0)  # its own group: the stand-in forwards signals to it, the server kills it
    die_with(server_pid)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.umask(int(request.get("umask", 0o022)))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if server_path0 in sys.path:  # the server's `python -m` entry (the first job's cwd)
        sys.path[sys.path.index(server_path0)] = request["cwd"]
    reseed()
    set_title(" ".join([sys.executable, "-m", request["module"], *request["args"]]))
    # The stop signals were blocked since the fork: one forwarded meanwhile arrives now.
    signal.pthread_sigmask(signal.SIG_SETMASK, set(request.get("blocked", [])))
    return run_as_main(request["module"], request["args"])


def run_as_main(module: str, args: list[str]) -> int:
    """Run ``module`` as ``python -m`` does and end as the interpreter would."""
    code = 0
    try:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations is not None:  # a package: its __main__
            spec = importlib.util.find_spec(f"{module}.__main__")
        if spec is None or spec.loader is None:
            print(f"{sys.executable}: No module named {module}", file=sys.stderr)  # as `python -m` says it
            return 1
        main = types.ModuleType("__main__")
        main.__dict__.update(__file__=spec.origin, __cached__=spec.cached, __spec__=spec, __loader__=spec.loader,
                             __package__=spec.parent, __builtins__=builtins)
        sys.modules["__main__"] = main
        sys.argv = [spec.origin or module, *args]
        exec(spec.loader.get_code(spec.name), main.__dict__)  # noqa: S102 - what `python -m` does
    except SystemExit as exc:
        code = exit_code(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - reported as the interpreter would
        sys.excepthook(*sys.exc_info())
        code = 1
    shutdown = getattr(threading, "_shutdown", None)  # joins non-daemon threads, as Py_Finalize does
    try:
        if shutdown is not None:
            shutdown()
    except KeyboardInterrupt:
        code = -signal.SIGINT
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing left to flush
            stream.flush()
    return code


def exit_code(code: object) -> int:
    """The status ``sys.exit(code)`` gives a process."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def end(code: int) -> None:
    """Exit with ``code``, or die of signal ``-code``."""
    if code < 0:
        with contextlib.suppress(OSError):
            signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {-code})
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


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


def die_with(server_pid: int) -> None:
    """Have the kernel kill this child when the server dies (Linux), and die now if it already has."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # no prctl (not Linux): the server kills its children
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != server_pid:  # it died between our fork and the prctl
        os._exit(1)
