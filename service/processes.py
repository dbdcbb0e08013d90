"""Serve the API from several processes (``TESSERA_WORKERS`` > 1, PostgreSQL only).

One Python process answers requests on one core at a time (the GIL): on PostgreSQL a submit
costs the service about 2.5 ms of CPU, so one process tops out near 300-400 submits/s whatever
the machine. ``serve_processes`` starts ``workers`` uvicorn servers, each in a process of its
own with its own ``SO_REUSEPORT`` socket on the service's port, and starts another in place of
one that dies. Separate sockets, because on one shared socket a connection goes to whichever
process accepts first: measured here, 16 keep-alive clients left one of two processes with
2.98 s of CPU and the other with 0.32 s (uvicorn's own ``--workers`` shares one socket).
The kernel spreads connections over ``SO_REUSEPORT`` sockets by a hash of their addresses.

Before the workers start, this module does what they must not each do at once:

- the database is migrated and the first admin key made here (``prepare_database``), before any
  worker starts; each worker's own start-up then finds both done;
- the embedded Ray head (when ``TESSERA_RAY_ADDRESS`` is unset) is started here, in the
  supervisor, and its address handed to the workers, which then talk to it as to any cluster;
- Prometheus counters are kept in files under a fresh ``PROMETHEUS_MULTIPROC_DIR``, so that
  ``GET /metrics``, answered by any one worker, counts every worker's requests.

Each worker builds the app from the environment (``service.main:app``), so command-line
overrides go into the environment first. A worker joins the port's ``SO_REUSEPORT`` group only
once its app has started (uvicorn calls ``listen`` then), and exits when the supervisor does.
Which worker dispatches is ``service.dispatch_lease``'s business.
"""

from __future__ import annotations

import collections
import copy
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Any

from service.settings import Settings

log = logging.getLogger(__name__)

STARTUP_FAILURE = 3  # uvicorn's exit status for an app whose startup failed (uvicorn.config.STARTUP_FAILURE)
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def serve_processes(settings: Settings, overrides: dict[str, Any], *, log_level: str = "info") -> None:
    """Serve ``service.main:app`` from ``settings.workers`` processes until SIGINT or SIGTERM (blocking)."""
    import uvicorn

    port_is_free(settings.host, settings.port)
    for name, value in overrides.items():  # the workers read their settings from the environment
        os.environ[f"TESSERA_{name.upper()}"] = str(value)
    prepare_database(settings)
    metrics_dir = tempfile.mkdtemp(prefix="tessera-metrics-")
    os.environ[MULTIPROC_DIR_ENV] = metrics_dir
    embedded = settings.embedded_ray
    try:
        if embedded:
            from service.ray_head import start_embedded_ray

            os.environ["TESSERA_RAY_ADDRESS"] = start_embedded_ray(settings)
        config = uvicorn.Config("service.main:app", host=settings.host, port=settings.port, log_level=log_level,
                                log_config=logging_config(log_level))
        supervise(config, settings.workers)
    finally:
        if embedded:
            from service.ray_head import stop_embedded_ray

            stop_embedded_ray()
        shutil.rmtree(metrics_dir, ignore_errors=True)


def prepare_database(settings: Settings) -> None:
    """Migrate the database and make the first admin key, once, before the workers start (N
    workers doing it at once would race on the schema and on the key's unique hash)."""
    from service.access import AccessStore
    from service.bootstrap import ensure_admin_key
    from service.db.engine import make_engine, migrate
    from service.db.session import Database

    engine = make_engine(settings.database_url)
    try:
        migrate(engine)
        ensure_admin_key(AccessStore(Database(engine)), settings)
    finally:
        engine.dispose()


def port_is_free(host: str, port: int) -> None:
    """Fail now if anything listens on ``host:port``: the workers' ``SO_REUSEPORT`` sockets would
    otherwise join another server's group (another ``tessera serve --workers``) without an error."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT left by a stopped server is fine
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise SystemExit(f"cannot serve on {host}:{port}: {exc.strerror} (is another server running there?)")


def supervise(config: Any, count: int) -> None:
    """Keep ``count`` processes serving ``config`` until SIGINT or SIGTERM, then stop them.

    A process that exits is replaced. The service stops instead (``SystemExit(3)``) when one of
    the first ``count`` exits with uvicorn's start-up failure (3: a broken app, which every
    replacement would repeat), or when processes keep exiting (more than ``3 * count`` in a
    minute). A replacement that fails to start is only counted: its cause (the database or Ray
    away for a moment) may pass.
    """
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads or connections inherited
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    def start() -> Any:
        process = context.Process(target=_serve_one, args=(config,), name="tessera-api")
        process.start()
        return process

    processes: list[Any] = []
    failed = False
    try:
        processes = [start() for _ in range(count)]
        first = set(processes)  # the objects, not their pids: a replacement may reuse a pid
        log.info("serving on %s:%d from %d processes: %s", config.host, config.port, count,
                 ", ".join(str(p.pid) for p in processes))
        exits: collections.deque[float] = collections.deque()
        while not failed and not stop.wait(0.5):
            for index, process in enumerate(processes):
                if process.is_alive():
                    continue
                exits.append(time.monotonic())
                while exits and exits[0] < time.monotonic() - 60:
                    exits.popleft()
                broken = process.exitcode == STARTUP_FAILURE and process in first
                if broken or len(exits) > 3 * count:
                    log.error("API process %d exited with %s %s; stopping", process.pid, process.exitcode,
                              "(its app could not start)" if broken else f"({len(exits)} exits within a minute)")
                    failed = True
                    break
                processes[index] = start()
                log.warning("API process %d exited with %s; started %d in its place", process.pid,
                            process.exitcode, processes[index].pid)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()  # uvicorn shuts down gracefully on SIGTERM
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()
    if failed:
        raise SystemExit(STARTUP_FAILURE)


def _serve_one(config: Any) -> None:
    """One API process: uvicorn on a ``SO_REUSEPORT`` socket of its own, until the supervisor goes."""
    import uvicorn

    config.configure_logging()
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets whose proto says
    # TCP (base_events._set_nodelay), and accepted sockets inherit it. Without it a response's
    # body, written after its headers, waits for the client's delayed ACK: measured here, 52 ms
    # per submit on two processes that were two-thirds idle.
    sock = socket.socket(_family(config.host), socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", config.host, config.port, exc)
        sys.exit(STARTUP_FAILURE)
    # No listen() here: uvicorn's create_server listens once the app has started, so no connection
    # is queued on a process that is still starting (or failing to).
    server = uvicorn.Server(config)
    parent = multiprocessing.parent_process()
    if parent is not None:  # a supervisor killed outright must not leave its workers serving
        threading.Thread(target=_exit_with, args=(parent.sentinel, server), name="tessera-parent-watch",
                         daemon=True).start()
    server.run(sockets=[sock])


def _exit_with(sentinel: int, server: Any) -> None:
    multiprocessing.connection.wait([sentinel])
    log.warning("the supervising process is gone; stopping")
    server.should_exit = True


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def logging_config(log_level: str) -> dict[str, Any]:
    """uvicorn's logging, plus the root logger, so the service's own lines reach stderr in every
    worker (a worker is a fresh interpreter: the supervisor's ``basicConfig`` is not inherited)."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["plain"] = {"format": "%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s"}
    config["handlers"]["plain"] = {"formatter": "plain", "class": "logging.StreamHandler",
                                   "stream": "ext://sys.stderr"}
    config["root"] = {"handlers": ["plain"], "level": log_level.upper()}
    return config
