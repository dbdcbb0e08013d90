"""The embedded Ray head: a Ray cluster inside the service process, for a service run without
``TESSERA_RAY_ADDRESS``; and the environment the service forwards to every job it submits.

Ray is imported lazily, here only (``service.ray_client`` speaks the Jobs REST API over httpx).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import inspect
import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.settings import Settings

log = logging.getLogger(__name__)

# Forwarded from the service's environment to every job it submits (runs and sweep drivers),
# so a deployment (or a test) can tune Ray Train and reach object storage without code changes.
# TESSERA_REPORT_ and TESSERA_SPOOL_: how long workers wait out an outage of the service and
# where they spool reports meanwhile (workers.service_reporter), set once on the service.
# TESSERA_DRIVER_FORKS and TESSERA_FORK_SERVER_: whether and how long job drivers are forked
# from a warm interpreter on the node (workers.fork_exec).
FORWARDED_ENV_PREFIXES = ("RAY_TRAIN_", "AWS_", "TESSERA_TEST_", "TESSERA_REPORT_", "TESSERA_SPOOL_",
                          "TESSERA_DRIVER_FORKS", "TESSERA_FORK_SERVER_")

# The embedded head's temp dirs, removed when it stops (``stop_embedded_ray``).
_temp_dirs: list[str] = []

# How long a process of the head may take to exit on SIGTERM before SIGKILL: Ray's own grace
# (Node._kill_process_impl, Ray 2.60), which ray.shutdown() gives each process in turn.
STOP_GRACE_S = 1.0
_exit_freeze_registered = False  # ``_freeze_heap_at_exit``: once a process

# The folder that holds `service/` and `workers/`: embedded Ray workers import from it.
REPO_ROOT = Path(__file__).resolve().parent.parent


def forwarded_env() -> dict[str, str]:
    """The service's ``FORWARDED_ENV_PREFIXES`` variables, as the base of a job's environment."""
    return {name: value for name, value in os.environ.items() if name.startswith(FORWARDED_ENV_PREFIXES)}


def common_job_env() -> dict[str, str]:
    """The environment every job the service submits starts from (``service.job_kinds`` adds each
    kind's own). The jobs that start a node's warm driver interpreter (the embedded head's start-up
    probe, ``service.driver_warmup``) have it too, so that interpreter is the one a run's driver
    asks for (``workers.fork_exec.server_key``: a variable that differs makes another)."""
    env = forwarded_env()
    # The job's log is read as text (tessera logs, the dashboard), not on a terminal: Ray
    # prefixes its workers' lines without colour codes then (ray/_private/worker.py).
    env.setdefault("RAY_COLOR_PREFIX", "0")
    # Every line of every worker, as printed: Ray's driver otherwise folds lines that several
    # workers print within 5 s into "[repeated 3x across cluster]", which cut two ranks'
    # tracebacks into fragments (ray/_private/ray_logging, RAY_DEDUP_LOGS).
    env.setdefault("RAY_DEDUP_LOGS", "0")
    return env


def warm_drivers_entrypoint(worker_python: str) -> str:
    """The job that starts the node's warm driver interpreter (``workers.fork_exec --warm``) and
    exits: an embedded head's start-up probe, and a cluster's warm-up (``service.driver_warmup``)."""
    return f"{shlex.quote(worker_python)} -m workers.fork_exec --warm"


def start_embedded_ray(settings: "Settings", *, timeout_s: float = 120.0) -> str:
    """Start a Ray head inside this process and return its Jobs API address (``http://...``).

    The head lives and dies with the service; jobs it ran are gone after a restart, which the
    dispatcher's startup reconcile handles by re-queuing their runs.
    """
    # Ray workers inherit this process's environment, which must be set before ray.init.
    os.environ.pop("RAY_ADDRESS", None)  # would make ray.init connect elsewhere
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local only: no cluster token to hand out
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # The node's warm driver interpreter (workers.fork_server) stops once its Ray has not answered
    # for this long. Its default (30 s) rides out a GCS restart of a cluster; an embedded head's
    # GCS ends only with this process, so the server goes a few seconds after it, not 30.
    os.environ.setdefault("TESSERA_FORK_SERVER_RAY_GONE_S", "3")
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in paths:  # job drivers must find `workers` whatever their cwd
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *paths])

    import ray

    _freeze_heap_at_exit()
    # Ray puts unix sockets under its temp dir; their paths must stay short.
    temp_dir = tempfile.mkdtemp(prefix="tsr", dir="/tmp")
    _temp_dirs.append(temp_dir)
    try:
        with _free_dashboard_agent_port(), _sigterm_handler_kept():
            context = ray.init(num_cpus=settings.ray_num_cpus, include_dashboard=True, dashboard_host="127.0.0.1",
                               _temp_dir=temp_dir, log_to_driver=False)
        address = f"http://{context.dashboard_url}"
        _record_cluster_address(context.address_info["gcs_address"], temp_dir)
        _wait_for_jobs_api(address, timeout_s, temp_dir, settings.worker_python)
    except BaseException:
        stop_embedded_ray()
        raise
    log.info("embedded Ray head started; Jobs API at %s", address)
    return address


def _record_cluster_address(gcs_address: str, temp_dir: str) -> None:
    """Tell this head's job supervisors which cluster is theirs.

    A supervisor gives its job driver ``RAY_ADDRESS`` from "auto": the address ``ray start``
    records in the node's temp dir, else, for a head started by ``ray.init`` as this one is,
    *any* Ray GCS running on the machine (``get_ray_address_from_environment``, Ray 2.60). With
    a second cluster on the machine (a test suite's, another service's) a run's driver could
    connect there. Record ours as ``ray start`` would (Ray's private ``write_ray_address``: a
    file in the temp dir); if that function moves, the old behaviour stays.
    """
    try:
        from ray._private.utils import write_ray_address
    except ImportError:
        log.warning("cannot record the embedded head's address; with another Ray cluster on this machine "
                    "its jobs may connect there")
        return
    write_ray_address(gcs_address, temp_dir)


@contextlib.contextmanager
def _sigterm_handler_kept() -> Iterator[None]:
    """Put this process's SIGTERM handler back after the block: ``ray.init`` replaces it with one
    that calls ``sys.exit`` (ray/_private/worker.py, 2.60). Started from the app's lifespan, the
    head would otherwise take SIGTERM from uvicorn, so ``kill``, systemd, Docker and Kubernetes
    stopped the service with a ``SystemExit`` traceback, skipping uvicorn's graceful shutdown and
    the app's own, where SIGINT shut it down cleanly."""
    if threading.current_thread() is not threading.main_thread():  # no handler to keep (or set)
        yield
        return
    handler = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if handler is not None:  # None: one set from C, which Python cannot put back
            signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def _free_dashboard_agent_port() -> Iterator[None]:
    """Give the embedded head's job agent a free HTTP port instead of Ray's fixed 52365.

    With the fixed port, a second Ray head on the machine (a `ray start` cluster, another
    service, a test fixture) leaves one of them without a job agent: "No available agent to
    submit job". ``ray.init`` has no parameter for the port, so for the duration of the call
    we default it in Ray's private ``RayParams``; if that class changes, Ray's default stays.
    """
    try:
        from ray._private import parameter

        original = parameter.RayParams.__init__
        if "dashboard_agent_listen_port" not in inspect.signature(original).parameters:
            raise AttributeError("RayParams has no dashboard_agent_listen_port")
    except (ImportError, AttributeError, TypeError, ValueError):
        log.debug("cannot choose the dashboard agent port; using Ray's default", exc_info=True)
        yield
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    def init_with_free_port(self, *args, **kwargs):
        kwargs.setdefault("dashboard_agent_listen_port", port)
        original(self, *args, **kwargs)

    parameter.RayParams.__init__ = init_with_free_port
    try:
        yield
    finally:
        parameter.RayParams.__init__ = original


def _wait_for_jobs_api(address: str, timeout_s: float, temp_dir: str, worker_python: str) -> None:
    """Return once the head accepts jobs. The dashboard answers before its job agent is up,
    and an agent that could not bind its port (another Ray head on this machine) never is.
    The probe job starts the node's warm driver interpreter (``workers.fork_exec --warm``), so
    the first run's driver is forked too."""
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client = JobSubmissionClient(address)
            break
        except ConnectionError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the embedded Ray head's Jobs API at {address} did not answer "
                                   f"within {timeout_s:.0f}s") from None
            time.sleep(0.5)
    try:
        # The head waits (10 s) for an agent before refusing, so one probe job is enough.
        client.submit_job(entrypoint=warm_drivers_entrypoint(worker_python),
                          runtime_env={"env_vars": common_job_env()},  # a run's: see common_job_env
                          submission_id=f"tessera-startup-probe-{secrets.token_hex(4)}")
    except RuntimeError as exc:
        raise RuntimeError(
            f"the embedded Ray head cannot run jobs ({exc}). Is another Ray head running on this machine? "
            f"See {temp_dir}/session_latest/logs/dashboard_agent.log, or set TESSERA_RAY_ADDRESS to use "
            "an existing Ray cluster instead.") from exc


def stop_embedded_ray() -> None:
    """Stop the embedded head, and remove its temp dir (Ray's session: its sockets, logs and
    spilled objects, 2-3 MB a start) once its processes are gone: each start left one under /tmp.
    A run's log is kept in the run's storage, not there."""
    import ray

    try:
        if ray.is_initialized():
            _stop_side_processes()
            ray.shutdown()
    finally:
        while _temp_dirs:
            shutil.rmtree(_temp_dirs.pop(), ignore_errors=True)


def _stop_side_processes() -> None:
    """Stop the head's processes other than the raylet and the GCS (the dashboard, the log
    monitor, the autoscaler's monitor) all at once, before ``ray.shutdown()`` would stop them.

    ``ray.shutdown()`` stops the raylet, then the GCS, then these, one at a time, each with a
    second between SIGTERM and SIGKILL (Node.kill_all_processes, Ray 2.60). The monitor's
    SIGTERM handler reports "the autoscaler failed" to the GCS, which is gone by then, so it
    waited out that second on every stop (1.0 s of ``ray.shutdown()``'s 1.3-1.6 s here). It gets
    SIGKILL here, as Ray gives it a second later: that report, to a driver that is leaving, is
    all its handler does, and a one-node head's autoscaler has no nodes to clean up. The others
    get SIGTERM, as from Ray, and one second between them all. ``ray.shutdown()`` then passes over
    the processes that have ended (``check_alive=False``) and stops the raylet and the GCS itself,
    in its order. Where Ray's private layout has changed, ``ray.shutdown()`` stops them all, slower.
    """
    try:
        from ray._private import ray_constants, worker

        kept_for_ray = {ray_constants.PROCESS_TYPE_RAYLET, ray_constants.PROCESS_TYPE_GCS_SERVER,
                        ray_constants.PROCESS_TYPE_REAPER}  # Ray stops the reaper last, on purpose
        monitor = ray_constants.PROCESS_TYPE_MONITOR
        side = [(kind, info.process) for kind, infos in worker._global_node.all_processes.items()
                if kind not in kept_for_ray for info in infos]
    except (ImportError, AttributeError, TypeError):
        log.debug("cannot reach the embedded head's processes; ray.shutdown() stops them", exc_info=True)
        return
    running = [(kind, process) for kind, process in side
               if isinstance(process, subprocess.Popen) and process.poll() is None]
    for kind, process in running:
        if kind == monitor:
            process.kill()
        else:
            process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for kind, process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("the embedded head's %s (pid %d) did not exit within %.0f s of SIGTERM; killing it",
                        kind, process.pid, STOP_GRACE_S)
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel: ray.shutdown() logs it
                process.wait(STOP_GRACE_S)


def _freeze_heap_at_exit() -> None:
    """Have this process skip Python's final garbage collections when it exits.

    A process that imported Ray and ran a head spends seconds of its exit in the collections
    the interpreter makes as it tears its modules down (Py_FinalizeEx): measured on 2 busy cores,
    3-4.6 s from the service's last atexit handler to its end, 0.2-0.5 s with this. (A service on
    an external Ray, which never imports Ray, stops in 1.3 s in all.) ``gc.freeze()`` puts what
    exists then beyond those collections; its memory goes back to the system with the process.
    atexit handlers run before those collections, the last registered first, so this one runs
    before Ray's own ``ray.shutdown()`` (registered when Ray is imported), and what that makes is
    collected as usual; the node's own handler (``Node._register_shutdown_hooks``, registered in
    ``ray.init``, after this one) runs before the freeze, which changes nothing for it. Python does not promise to finalize objects still alive at exit anyway;
    the files that matter are flushed and closed before (the lifespan's shutdown, logging's own
    atexit handler).
    """
    global _exit_freeze_registered
    if not _exit_freeze_registered:
        atexit.register(gc.freeze)
        _exit_freeze_registered = True
