"""Health probes: ``/healthz`` (what is up), ``/livez`` (the process answers) and ``/readyz``
(the service can do its job: the database and Ray's Jobs API both answer).

Kubernetes and compose use ``/livez`` to restart a wedged process and ``/readyz`` to stop
sending traffic while a dependency is away; a service whose Ray head is restarting stays alive
(it keeps its runs and re-queues them once Ray is back) but is not ready.
"""

from __future__ import annotations

import concurrent.futures
import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.deps import JobsDep, RepoDep

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)

RAY_PROBE_TIMEOUT_S = 3.0
PROBE_JOB_ID = "tessera-healthz-probe"  # never submitted: Ray answers "no such job" when it is up

# Ray's SDK has no request timeout, so the probe runs on a thread we can stop waiting for.
_probe_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="tessera-healthz")


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


@router.get("/healthz", operation_id="healthz")
def healthz(repo: RepoDep, jobs: JobsDep) -> JSONResponse:
    """200 ``{"status": "ok", "database": "ok", "ray": "ok"|"unreachable"}``; 503 if the database is down."""
    parts = _dependencies(repo, jobs)
    healthy = parts["database"] == "ok"
    return JSONResponse(status_code=200 if healthy else 503,
                        content={"status": "ok" if healthy else "unavailable", **parts})


@router.get("/livez", include_in_schema=False)
def livez() -> dict[str, str]:
    """200 while the process serves requests; touches no dependency, so an outage elsewhere
    never gets the service restarted."""
    return {"status": "ok"}


@router.get("/readyz", include_in_schema=False)
def readyz(repo: RepoDep, jobs: JobsDep) -> JSONResponse:
    """200 when the database and Ray both answer; 503 naming what is unreachable otherwise."""
    parts = _dependencies(repo, jobs)
    ready = all(state == "ok" for state in parts.values())
    return JSONResponse(status_code=200 if ready else 503,
                        content={"status": "ready" if ready else "not ready", **parts})
