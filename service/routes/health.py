"""Health probes, for deployers (README "Probes", docs/outages-service.md):

* ``/healthz/live`` (alias ``/livez``): the process serves requests and the dispatcher thread
  has finished a tick within ``settings.liveness_max_tick_age_s``. It touches no dependency,
  so an outage elsewhere never gets the service restarted; a wedged dispatcher does.
* ``/healthz/ready`` (alias ``/readyz``): the service can do its job: the database and Ray's
  Jobs API both answer; 503 naming which one is down.
* ``/healthz``: what is up; 200 while the database answers (Ray may be away: runs wait), as it
  always has. Only this one is in the published API.

A service whose Ray head is restarting stays alive (it keeps its runs and submits them once
Ray is back) but is not ready.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.api_docs import OPEN
from service.deps import JobsDep, RepoDep, SettingsDep
from service.json_body import ParsedBodyRoute

router = APIRouter(tags=["health"], route_class=ParsedBodyRoute)
log = logging.getLogger(__name__)

RAY_PROBE_TIMEOUT_S = 3.0
PROBE_JOB_ID = "tessera-healthz-probe"  # never submitted: Ray answers "no such job" when it is up

# The probe waits at most RAY_PROBE_TIMEOUT_S even for a Jobs client with a longer own timeout
# (or none, as tests' fakes); the Ray client bounds each call, so these threads always return.
_probe_pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="tessera-healthz")


def _dependencies(repo, jobs) -> dict[str, str]:
    """``{"database": "ok"|"unreachable", "ray": "ok"|"unreachable"}``."""
    try:
        repo.ping()
        database = "ok"
    except Exception:
        log.warning("health check: database unreachable", exc_info=True)
        database = "unreachable"
    try:
        _probe_pool.submit(jobs.status, PROBE_JOB_ID).result(timeout=RAY_PROBE_TIMEOUT_S)
        ray = "ok"
    except Exception:
        ray = "unreachable"
    return {"database": database, "ray": ray}


@router.get("/healthz", operation_id="healthz", openapi_extra=OPEN)
def healthz(repo: RepoDep, jobs: JobsDep) -> JSONResponse:
    """200 ``{"status": "ok", "database": "ok", "ray": "ok"|"unreachable"}``; 503 if the database is down."""
    parts = _dependencies(repo, jobs)
    healthy = parts["database"] == "ok"
    return JSONResponse(status_code=200 if healthy else 503,
                        content={"status": "ok" if healthy else "unavailable", **parts})


@router.get("/healthz/live", include_in_schema=False)
@router.get("/livez", include_in_schema=False)
def live(request: Request, settings: SettingsDep) -> JSONResponse:
    """200 while the process serves requests and its dispatcher ticks; 503 naming a dispatcher
    that has not finished a tick for ``liveness_max_tick_age_s`` (a restart is the cure)."""
    dispatcher = getattr(request.app.state, "dispatcher", None)
    if dispatcher is None or not dispatcher.running:  # no thread (tests tick by hand): nothing can wedge
        return JSONResponse({"status": "ok"})
    age = time.monotonic() - dispatcher.last_tick_at
    if age > settings.liveness_max_tick_age_s:
        return JSONResponse(status_code=503, content={
            "status": "dispatcher stalled",
            "detail": f"the dispatcher thread last finished a tick {age:.0f}s ago, more than "
                      f"liveness_max_tick_age_s={settings.liveness_max_tick_age_s:g}"})
    return JSONResponse({"status": "ok"})


@router.get("/healthz/ready", include_in_schema=False)
@router.get("/readyz", include_in_schema=False)
def ready(repo: RepoDep, jobs: JobsDep) -> JSONResponse:
    """200 when the database and Ray both answer; 503 naming what is unreachable otherwise."""
    parts = _dependencies(repo, jobs)
    is_ready = all(state == "ok" for state in parts.values())
    return JSONResponse(status_code=200 if is_ready else 503,
                        content={"status": "ready" if is_ready else "not ready", **parts})
