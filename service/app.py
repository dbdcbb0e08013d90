"""The FastAPI application: routes under ``/api/v1``, and a lifespan that owns the moving parts.

Startup, in order: migrate the database, connect to Ray (or start an embedded head),
reconcile every active run and sweep with Ray, then start the dispatcher thread. Shutdown reverses it.
Served by several processes (``service.processes``), each runs this lifespan; only the process
that holds the dispatch lease (``service.dispatch_lease``) reconciles and dispatches.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy import Engine

from api.process_logging import quiet_http_clients
from service.api_docs import mount_api_docs
from service.dashboard import mount_dashboard
from service.db.engine import make_engine, migrate
from service.dispatch_lease import lease_for
from service.dispatch_wake import WakeDispatcher
from service.dispatcher import Dispatcher
from service.errors import install_error_handlers
from service.heap import startup_heap_frozen
from service.limits import RequestLimits
from service.metrics_export import install_metrics
from service.ray_client import JobsClient, RayJobsClient
from service.ray_head import start_embedded_ray, stop_embedded_ray
from service.repository import Repository
from service.bootstrap import ensure_admin_key
from service.routes import access, catalog, code, export, health, housekeeping, lineage, logs, reports, runs, sweeps
from service.settings import Settings, load_settings

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"


def create_app(settings: Settings | None = None, *, jobs: JobsClient | None = None,
               run_dispatcher: bool = True) -> FastAPI:
    """Build the Tessera API.

    ``settings``: defaults to ``TESSERA_*`` from the environment. ``jobs``: the Ray Jobs client;
    None means a ``RayJobsClient`` on ``settings.ray_address``, or on an embedded Ray head that
    the app starts and stops. ``run_dispatcher=False`` keeps the background dispatcher thread
    off (tests call ``app.state.dispatcher.tick()`` themselves).
    """
    settings = settings or load_settings()
    quiet_http_clients()  # the dispatcher's calls to Ray: a line each on the console otherwise
    catalog.pages()  # build the catalog now: a name without a spec fails startup, not a request

    app = FastAPI(
        title="Tessera",
        summary="Experiment service for PyTorch training with Composer-style speedup algorithms",
        version="0.1.0",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=None,  # FastAPI's loads Swagger UI from a CDN: served from the vendored copy (mount_api_docs)
        redoc_url=None,
        lifespan=_lifespan(settings, jobs, run_dispatcher),
    )
    app.state.settings = settings
    install_error_handlers(app)
    app.add_middleware(RequestLimits, max_body_bytes=settings.max_body_bytes,
                       code_max_body_bytes=settings.code_max_body_bytes, code_prefix=f"{API_PREFIX}/code")
    app.add_middleware(WakeDispatcher, prefix=API_PREFIX)
    install_metrics(app)
    for module in (runs, lineage, reports, sweeps, access, catalog, health, code, logs, export, housekeeping):
        app.include_router(module.router)
    app.include_router(logs.sweep_router)
    mount_dashboard(app)
    mount_api_docs(app, f"{API_PREFIX}/docs")
    return app


def _lifespan(settings: Settings, jobs: JobsClient | None, run_dispatcher: bool):
    """The app's lifespan: open the database and Ray, reconcile, run the dispatcher; then close
    them in reverse order."""
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log.info("starting Tessera with settings %s", settings.redacted())
        engine = _open_database(settings)
        try:
            with _jobs_client(settings, jobs) as client:
                dispatcher = Dispatcher(Repository(engine), client, settings, lease_for(engine, settings.workers))
                app.state.repo, app.state.sweeps = dispatcher.repo, dispatcher.sweeps
                app.state.jobs, app.state.dispatcher = client, dispatcher
                app.state.access = dispatcher.access
                ensure_admin_key(app.state.access, settings)
                dispatcher.tick_listeners.append(app.state.prometheus.tick_seconds.observe)
                try:
                    dispatcher.take_lead()  # reconciles, in the process that dispatches
                    if run_dispatcher:
                        dispatcher.start()
                    with startup_heap_frozen():
                        yield
                finally:
                    dispatcher.stop()  # and gives the dispatch lease up
        finally:
            engine.dispose()

    return lifespan


def _open_database(settings: Settings) -> Engine:
    """The migrated database, and the local storage folder when storage is a ``file://`` URL."""
    engine = make_engine(settings.database_url)
    migrate(engine)
    if settings.storage_url.startswith("file://"):
        Path(settings.storage_url.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    return engine


@contextmanager
def _jobs_client(settings: Settings, jobs: JobsClient | None) -> Iterator[JobsClient]:
    """``jobs`` as given; else a client on ``settings.ray_address``, or on an embedded Ray head
    that lives until the block ends."""
    if jobs is not None:
        yield jobs
        return
    if settings.ray_address is not None:
        yield RayJobsClient(settings.ray_address, timeout_s=settings.ray_timeout_s)
        return
    address = start_embedded_ray(settings)
    try:
        yield RayJobsClient(address, timeout_s=settings.ray_timeout_s)
    finally:
        stop_embedded_ray()
