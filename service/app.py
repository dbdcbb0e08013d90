"""The FastAPI application: routes under ``/api/v1``, and a lifespan that owns the moving parts.

Startup, in order: migrate the database, connect to Ray (or start an embedded head),
reconcile every active run and sweep with Ray, then start the dispatcher thread. Shutdown reverses it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from service.dashboard import mount_dashboard
from service.db.engine import make_engine, migrate
from service.dispatcher import Dispatcher
from service.errors import install_error_handlers
from service.ray_jobs import JobsClient, RayJobsClient, start_embedded_ray, stop_embedded_ray
from service.reconciler import reconcile
from service.repository import Repository
from service.routes import catalog, code, health, reports, runs, sweeps
from service.settings import Settings, load_settings
from service.sweep_dispatch import reconcile_sweeps

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
    catalog.pages()  # build the catalog now: a name without a spec fails startup, not a request

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log.info("starting Tessera with settings %s", settings.redacted())
        engine = make_engine(settings.database_url)
        migrate(engine)
        if settings.storage_url.startswith("file://"):
            Path(settings.storage_url.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        repo = Repository(engine)
        client, embedded = jobs, False
        if client is None:
            address = settings.ray_address
            if address is None:
                address, embedded = start_embedded_ray(settings), True
            client = RayJobsClient(address)
        dispatcher = Dispatcher(repo, client, settings)
        app.state.repo, app.state.jobs, app.state.dispatcher = repo, client, dispatcher
        app.state.sweeps = dispatcher.sweeps
        for fix in [*reconcile(repo, client), *reconcile_sweeps(dispatcher.sweeps, client, settings)]:
            log.info("reconciled %s", fix)
        if run_dispatcher:
            dispatcher.start()
        try:
            yield
        finally:
            dispatcher.stop()
            if embedded:
                stop_embedded_ray()
            engine.dispose()

    app = FastAPI(
        title="Tessera",
        summary="Experiment service for PyTorch training with Composer-style speedup algorithms",
        version="0.1.0",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.settings = settings
    install_error_handlers(app)
    for module in (runs, reports, sweeps, catalog, health, code):
        app.include_router(module.router)
    mount_dashboard(app)
    return app
