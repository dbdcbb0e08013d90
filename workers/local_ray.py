"""What the private Ray of a local DDP/FSDP run (``workers.local``) would otherwise leave behind
or print: its files, its signal handlers, the processes of a start cut short and one warning a second.

Light on purpose: Ray imports ``quiet_placement_group_cleaner`` in every worker process of the
private cluster (``worker_process_setup_hook``), so this module imports neither torch nor Ray.
Line numbers are Ray 2.60's.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from typing import Callable, Iterator

# Ray Train starts a detached PlacementGroupCleaner actor per run
# (ray/train/v2/_internal/callbacks/placement_group_callback.py:54-85). Every second
# (check_interval_s=1.0, :32) it asks the state API whether the controller lives
# (ray/train/v2/_internal/execution/controller/placement_group_cleaner.py:79-89, through
# ray/train/v2/_internal/state/util.py:53 is_actor_alive and ray.util.state.get_actor). The state
# API is an HTTP endpoint of the dashboard, and the private Ray runs without it
# (include_dashboard=False: its dashboard.log says "http server disabled", no StateHead loaded), so
# every query raises RayStateApiException and the cleaner logs this warning, forwarded to the
# console, until the controller stops it. Its job (removing the placement group of a controller
# that died while the cluster lives on) is moot for a private Ray, which ``workers.local`` shuts
# down, placement groups and all, whenever the run ends: only this warning is dropped, not the
# cleaner's other messages.
CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"
CLEANER_POLL_FAILED = "Failed to query Ray Train Controller actor state"
# The private Ray's ``runtime_env["worker_process_setup_hook"]``: a module path Ray imports.
SETUP_HOOK = f"{__name__}.quiet_placement_group_cleaner"

TEMP_DIR_PREFIX = "tessera-ray-"


class _DropsCleanerPollFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(CLEANER_POLL_FAILED)


def quiet_placement_group_cleaner() -> None:
    """Drop the cleaner's "Failed to query Ray Train Controller actor state" warning in this
    process (see ``CLEANER_LOGGER``); a second call adds nothing."""
    logger = logging.getLogger(CLEANER_LOGGER)
    if not any(isinstance(f, _DropsCleanerPollFailures) for f in logger.filters):
        logger.addFilter(_DropsCleanerPollFailures())


@contextlib.contextmanager
def private_temp_dir() -> Iterator[str]:
    """A new folder for one private Ray, removed after the block however it ends.

    It is ``ray.init``'s ``_temp_dir`` (Ray would put the session in ``/tmp/ray/session_*`` and
    keep it after ``ray.shutdown``) and, as ``{dir}/tmp``, the ``TMPDIR`` of the cluster's workers:
    a rank's ``multiprocessing`` makes ``/tmp/pymp-*`` folders that only its exit handlers remove,
    and Ray ends its workers without running them. It lies where Ray's own would
    (``ray/_common/utils.py:327`` get_default_system_temp_dir): ``RAY_TMPDIR``, else ``TMPDIR`` on
    Linux, else ``/tmp``, which keeps the session's Unix socket paths short enough."""
    path = tempfile.mkdtemp(prefix=TEMP_DIR_PREFIX, dir=_ray_system_temp_dir())
    try:
        os.mkdir(worker_tmpdir(path))
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def worker_tmpdir(temp_dir: str) -> str:
    """The ``TMPDIR`` of a private Ray's workers, inside its ``private_temp_dir``."""
    return os.path.join(temp_dir, "tmp")


def worker_temp_env(temp_dir: str) -> dict[str, str]:
    """The environment that gives a private Ray's workers ``worker_tmpdir`` as ``TMPDIR`` and
    keeps the caches that would follow it into that folder, which goes with the run, where they
    are for this process: torch.compile's (``TORCHINDUCTOR_CACHE_DIR``, by default
    ``{tmp}/torchinductor_{user}``: torch/_inductor/runtime/cache_dir_utils.py, torch 2.14) and
    Tessera's code packages' (``workers.models.code_cache``). A later run compiles and unpacks
    nothing again that an earlier one did."""
    from workers.models.code_cache import code_cache_dir

    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    return {"TMPDIR": worker_tmpdir(temp_dir), "TORCHINDUCTOR_CACHE_DIR": inductor,
            "TESSERA_CODE_CACHE": str(code_cache_dir())}


def _ray_system_temp_dir() -> str:
    if os.environ.get("RAY_TMPDIR"):
        return os.environ["RAY_TMPDIR"]
    if sys.platform.startswith("linux") and os.environ.get("TMPDIR"):
        return os.environ["TMPDIR"]
    return "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()


@contextlib.contextmanager
def signal_handlers_restored() -> Iterator[Callable[[], None]]:
    """After the block, SIGINT's and SIGTERM's handlers are the ones it began with; the block gets
    a function that puts them back at once, for the moment ``ray.init`` has returned.

    Ray undoes neither of its replacements. ``ray.init`` sets SIGTERM's Python handler to
    ``sys.exit`` (ray/_private/worker.py:1674-1679), and then its core worker installs a C++ crash
    handler over it (abseil's failure signal handler, which logs "*** SIGTERM received at time=")
    that made a ``kill PID`` of a DDP ``tessera train`` end in SIGABRT (status 134) rather than as
    its ``_sigterm_as_interrupt`` says; putting the handler back once Ray runs removes that one too
    (``ray_start_uninterrupted`` keeps both out of a private Ray's start).
    Ray Train's ``fit()`` sets SIGINT's to one that aborts its controller, ignores a second Ctrl-C
    and ``sys.exit(0)``s on the third (ray/train/v2/api/data_parallel_trainer.py:288-321): a
    notebook's later Ctrl-C would otherwise call a controller that is gone. Outside the main
    thread, where no handler can be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    # None: a handler set outside Python, which cannot be put back
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    before = {signum: handler for signum, handler in before.items() if handler is not None}

    def put_back() -> None:
        for signum, handler in before.items():
            signal.signal(signum, handler)

    try:
        yield put_back
    finally:
        put_back()


# What ``ray.init`` calls to set SIGTERM's handler to ``sys.exit(signum)`` (ray/_private/worker.py:
# 1675-1679), and the constant its driver's core worker reads before installing its C++ crash
# handler (ray/_private/ray_constants.py:24; read in _raylet.pyx's CoreWorker, as the environment
# variable RAY_DISABLE_FAILURE_SIGNAL_HANDLER was when Ray was imported).
RAY_SETS_SIGTERM = ("ray._private.utils", "set_sigterm_handler")
RAY_CRASH_HANDLER_OFF = ("ray._private.ray_constants", "RAY_DISABLE_FAILURE_SIGNAL_HANDLER")


@contextlib.contextmanager
def ray_start_uninterrupted() -> Iterator[None]:
    """Within the block (``ray.init`` of a private Ray), a Ctrl-C or SIGTERM is held until the
    block ends and raised then, as ``KeyboardInterrupt``; a second one is raised at once.

    ``ray.init`` stopped part-way leaves what it has started running with nothing to stop it: its
    node is known to ``ray.shutdown`` only once every process has started (``_global_node``,
    ray/_private/worker.py:1927). A ``kill PID`` of a DDP ``tessera train`` in the seconds its Ray
    takes to start (2-5 s on 2 cores) ended it with status 15, as ``ray.init``'s own SIGTERM
    handler says (``sys.exit(signum)``), without the line ``tessera train`` ends an interrupt with,
    and once left Ray's dashboard and runtime-env agents running; in the last moments of the start,
    its driver's C++ crash handler caught the signal and aborted (SIGABRT, a stack dump). So,
    within the block, neither is installed (``RAY_SETS_SIGTERM``, ``RAY_CRASH_HANDLER_OFF``: this
    process's driver has no C++ crash handler until ``ray.shutdown``; Ray's workers keep theirs),
    and SIGINT's and SIGTERM's handlers only note the signal. After it, they are the ones it began
    with. Outside the main thread, where no handler can be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: object) -> None:
        if held:  # asked twice: at once, whatever has started by then
            raise KeyboardInterrupt
        held.append(signum)

    with signal_handlers_restored(), _ray_attributes_set({RAY_SETS_SIGTERM: lambda handler: None,
                                                          RAY_CRASH_HANDLER_OFF: True}):
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) is not None:  # else set outside Python: not ours to change
                signal.signal(signum, hold)
        yield
    if held:
        raise KeyboardInterrupt


@contextlib.contextmanager
def _ray_attributes_set(values: dict[tuple[str, str], object]) -> Iterator[None]:
    """Within the block, each ``(module, name)`` of Ray that exists has its value; after it, the
    one it had (a Ray without one is left as it is)."""
    import importlib

    before = []
    for (module_name, name), value in values.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, name):
            before.append((module, name, getattr(module, name)))
            setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in before:
            setattr(module, name, value)
