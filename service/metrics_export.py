"""``GET /metrics``: the service in Prometheus text format (``prometheus_client``).

Each app has its own ``CollectorRegistry`` (tests build many apps in one process). Exported:

* ``tessera_http_requests_total{method,route,status}`` and
  ``tessera_http_request_duration_seconds{method,route}``: by route *template*
  (``/api/v1/runs/{run_id}``), so run ids never become label values;
* ``tessera_runs{status}`` and ``tessera_queue_depth`` (QUEUED runs): counted at scrape time;
* ``tessera_dispatcher_tick_seconds``: how long each dispatcher pass took;
* ``tessera_metric_points_total``: metric points workers reported (``rate()`` is the ingest rate);
* ``tessera_ray_up``: 1 if Ray's Jobs API answered the scrape's probe, else 0.

Served by several processes (``service.processes``), the counters and histograms live in
files under ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess mode, chosen when
the variable is set as it is imported), and a scrape, which one process answers, sums them all.
"""

from __future__ import annotations

import logging
import os
import time

from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from sqlalchemy import func, select
from starlette.types import ASGIApp, Receive, Scope, Send

from api.views import RunStatus
from service.db.models import Run
from service.json_body import ParsedBodyRoute
from service.response_start import ResponseStart

log = logging.getLogger(__name__)
router = APIRouter(tags=["monitoring"], route_class=ParsedBodyRoute)


class ServiceMetrics:
    """The app's registry and the instruments the service updates as it works."""

    def __init__(self, app: FastAPI):
        self.registry = CollectorRegistry()
        self.requests = Counter("tessera_http_requests", "HTTP requests by route template and status",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("tessera_http_request_duration_seconds", "HTTP request latency by route template",
                                 ["method", "route"], registry=self.registry)
        self.tick_seconds = Histogram("tessera_dispatcher_tick_seconds", "Duration of one dispatcher pass",
                                      registry=self.registry)
        self.metric_points = Counter("tessera_metric_points", "Metric points reported by workers",
                                     registry=self.registry)
        self.registry.register(_StateCollector(app))
        self.exposed = self.registry
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # every process's instruments, and this one's state
            self.exposed = CollectorRegistry()
            MultiProcessCollector(self.exposed)
            self.exposed.register(_StateCollector(app))


class _StateCollector:
    """Runs by status, queue depth and Ray reachability, read when Prometheus scrapes."""

    def __init__(self, app: FastAPI):
        self.app = app

    def describe(self):
        return []  # collected lazily: the database and Ray may not be up when the registry is built

    def collect(self):
        repo, jobs = getattr(self.app.state, "repo", None), getattr(self.app.state, "jobs", None)
        if repo is None:
            return
        runs = GaugeMetricFamily("tessera_runs", "Runs by status", labels=["status"])
        counts = {status.value: 0 for status in RunStatus}
        try:
            with repo.db.read() as session:
                counts.update(dict(session.execute(select(Run.status, func.count()).group_by(Run.status)).all()))
        except Exception:
            log.warning("metrics: could not count runs", exc_info=True)
            return
        for status, count in sorted(counts.items()):
            runs.add_metric([status], count)
        yield runs
        yield GaugeMetricFamily("tessera_queue_depth", "Runs waiting to be submitted (QUEUED)",
                                value=counts[RunStatus.QUEUED.value])
        yield GaugeMetricFamily("tessera_ray_up", "1 if Ray's Jobs API answered", value=_ray_up(jobs))


def _ray_up(jobs) -> int:
    from service.routes.health import PROBE_JOB_ID, RAY_PROBE_TIMEOUT_S, _probe_pool

    if jobs is None:
        return 0
    try:
        _probe_pool.submit(jobs.status, PROBE_JOB_ID).result(timeout=RAY_PROBE_TIMEOUT_S)
        return 1
    except Exception:
        return 0


def install_metrics(app: FastAPI) -> ServiceMetrics:
    """Add the request-counting middleware and ``GET /metrics`` to ``app``."""
    metrics = app.state.prometheus = ServiceMetrics(app)
    app.add_middleware(CountRequests, metrics=metrics)
    app.include_router(router)
    return metrics


class CountRequests:
    """ASGI middleware: count each HTTP request and time it, by method, route template and status.

    A plain ASGI middleware rather than ``@app.middleware("http")``: Starlette's
    ``BaseHTTPMiddleware`` runs the rest of the app in a task of its own and streams the response
    through a memory channel, work that showed in a profile of every submit."""

    def __init__(self, app: ASGIApp, *, metrics: ServiceMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, response = time.perf_counter(), ResponseStart(send)
        try:
            await self.app(scope, receive, response)
        finally:
            # The router put the matched route in the scope; 404s get one label, not one per path.
            template = getattr(scope.get("route"), "path", None) or "unmatched"
            status = response.status or 500  # an exception escaped the app before it answered
            self.metrics.requests.labels(scope["method"], template, str(status)).inc()
            # Latency is time to the response's start: a streamed download's body is not counted.
            took = (response.at or time.perf_counter()) - started
            self.metrics.latency.labels(scope["method"], template).observe(took)


def count_metric_points(request: Request, stored: int) -> None:
    """Count ``stored`` reported metric points (no-op on an app without metrics)."""
    metrics = getattr(request.app.state, "prometheus", None)
    if metrics is not None:
        metrics.metric_points.inc(stored)


@router.get("/metrics", include_in_schema=False)
def prometheus_metrics(request: Request) -> Response:
    """The service's metrics in Prometheus text format."""
    return Response(generate_latest(request.app.state.prometheus.exposed), media_type=CONTENT_TYPE_LATEST)
