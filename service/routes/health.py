"""``GET /healthz``: is the database answering, and can Ray's Jobs API be reached?"""

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


@router.get("/healthz", operation_id="healthz")
def healthz(repo: RepoDep, jobs: JobsDep) -> JSONResponse:
    """200 ``{"status": "ok", "database": "ok", "ray": "ok"|"unreachable"}``; 503 if the database is down."""
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
    healthy = database == "ok"
    return JSONResponse(status_code=200 if healthy else 503,
                        content={"status": "ok" if healthy else "unavailable", "database": database, "ray": ray})
