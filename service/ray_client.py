"""Ray's Jobs API as the service uses it: submit, status, stop, logs and deletion of one job,
and the states of all jobs.

The client speaks the Jobs REST API (``/api/jobs/``) over httpx rather than through Ray's SDK,
because the SDK sets no timeout on its requests: a Ray head that accepts connections and then
hangs would block the dispatcher's thread forever. Every call here is bounded by
``timeout_s``, and every failure is one of three kinds, which the callers decide on:

* ``RayUnavailable``: Ray could not be asked (connection refused, connect timeout, a 5xx on a
  read). What Ray holds is unknown, and "unknown" never reads as "gone".
* ``RayAmbiguous`` (a ``RayUnavailable``): the request may have reached Ray (read timeout,
  connection reset after sending, a 5xx): a submit may or may not have created the job, so
  the caller asks Ray for the job by its id before deciding.
* ``RayRefused``: a 4xx, a definite "no" to a bad request.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Literal, Protocol

import httpx

log = logging.getLogger(__name__)

JobState = Literal["PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"]
FINISHED_JOB_STATES: frozenset[str] = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})
LIVE_JOB_STATES: frozenset[str] = frozenset({"PENDING", "RUNNING"})
DEFAULT_RAY_TIMEOUT_S = 10.0


class RayUnavailable(OSError):
    """Ray could not be asked or did not answer in time; what it holds is unknown."""


class RayAmbiguous(RayUnavailable):
    """The request may have reached Ray, but its answer is unknown (timeout, reset, 5xx)."""


class RayRefused(RuntimeError):
    """Ray answered a definite refusal (a 4xx): repeating the same request will not help."""


class JobsClient(Protocol):
    """What the job follower needs from Ray's Jobs API."""

    def submit(self, submission_id: str, entrypoint: str, env_vars: dict[str, str]) -> None:
        """Start a job; if a job with this id already exists, do nothing (idempotent per attempt)."""

    def status(self, submission_id: str) -> str | None:
        """PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED; None if Ray has no such job.
        Raises when Ray cannot be asked: "unknown" must never read as "gone"."""

    def stop(self, submission_id: str) -> None:
        """Ask the job to stop; no error if it already finished or does not exist."""

    def logs_tail(self, submission_id: str, lines: int = 40) -> str:
        """The last ``lines`` lines of the job's driver log ("" if there is none)."""

    def job_logs(self, submission_id: str) -> str | None:
        """The job's whole driver log (its workers' stdout/stderr); None if Ray has no such job."""

    def delete(self, submission_id: str) -> None:
        """Have Ray forget a finished job: its status and metadata go (its log files stay on
        the node, but the Jobs API no longer reads them). No error if Ray has no such job; Ray
        refuses a job that has not finished."""


def job_ended_at(jobs: JobsClient, submission_id: str) -> datetime | None:
    """When Ray says the finished job ended, if the Jobs client can tell (``ended_at``) and Ray
    answers; None otherwise (the caller takes the time it learned of the end). Best effort: an
    unanswered question here must not keep a record from ending."""
    reader = getattr(jobs, "ended_at", None)
    if reader is None:
        return None
    try:
        return reader(submission_id)
    except (RayUnavailable, RayRefused) as exc:
        log.info("cannot read when Ray job %s ended: %s", submission_id, exc)
        return None


def job_states(jobs: JobsClient) -> dict[str, str] | None:
    """Every job's state in one call, if the Jobs client can list them (``states``); None: it
    cannot, ask per job."""
    lister = getattr(jobs, "states", None)
    return lister() if lister is not None else None


def stop_and_check(jobs: JobsClient, job_id: str | None) -> str | None:
    """Ask Ray to stop ``job_id`` (idempotent: callers repeat it every tick) and return its
    state now: still PENDING or RUNNING while Ray is stopping it; None if Ray has no such job
    (or there is no job)."""
    if job_id is None:
        return None
    jobs.stop(job_id)
    return jobs.status(job_id)


def failure_from_logs(jobs: JobsClient, job_id: str) -> str:
    """"Ray job X failed" with the last lines of its log (or why they could not be read)."""
    try:
        tail = jobs.logs_tail(job_id)
    except Exception as exc:  # the failure matters more than its logs
        tail = f"(could not read the job's logs: {exc})"
    return failure_text(job_id, tail)


def failure_text(job_id: str, tail: str) -> str:
    """"Ray job X failed", with ``tail`` (the last lines of its log) when there are any."""
    return f"Ray job {job_id} failed; last lines of its log:\n{tail}" if tail else f"Ray job {job_id} failed"


def ray_auth_headers() -> dict[str, str]:
    """The header Ray's own clients send to a cluster with token auth (``RAY_AUTH_MODE=token``):
    the token from ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``, found by
    Ray's own loader so the rules stay Ray's. Empty when token auth is off. (Ray's SDK, which
    this client replaced, added it by itself; without it every call is a 401.)"""
    from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled

    return dict(get_auth_headers_if_auth_enabled({}))


class RayJobsClient:
    """``JobsClient`` over the Jobs REST API of the Ray dashboard at ``address``, every call
    bounded by ``timeout_s`` (connect, read and write each)."""

    def __init__(self, address: str, *, timeout_s: float = DEFAULT_RAY_TIMEOUT_S,
                 transport: httpx.BaseTransport | None = None):
        self.address = address.rstrip("/")
        self.timeout_s = timeout_s
        self._http = httpx.Client(base_url=self.address, timeout=timeout_s, transport=transport,
                                  headers=ray_auth_headers())

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        """The response of a 2xx or 404 (the callers read 404 as "no such job"); raise
        ``RayUnavailable``, ``RayAmbiguous`` or ``RayRefused`` otherwise."""
        try:
            response = self._http.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise RayUnavailable(f"Ray's Jobs API at {self.address} is unreachable: {exc!r}") from exc
        except (httpx.TimeoutException, httpx.TransportError) as exc:  # sent, answer lost
            raise RayAmbiguous(f"Ray's Jobs API at {self.address} did not answer {method} {path} "
                               f"within {self.timeout_s:g}s: {exc!r}") from exc
        if response.status_code >= 500:
            raise RayAmbiguous(f"Ray answered {method} {path} with {response.status_code}: "
                               f"{response.text[-500:]}")
        if response.status_code >= 400 and response.status_code != 404:
            raise RayRefused(f"Ray refused {method} {path} with {response.status_code}: {response.text[-500:]}")
        return response

    def submit(self, submission_id: str, entrypoint: str, env_vars: dict[str, str]) -> None:
        body = {"entrypoint": entrypoint, "submission_id": submission_id,
                "runtime_env": {"env_vars": dict(env_vars)}}
        try:
            response = self._request("POST", "/api/jobs/", json=body)
        except (RayAmbiguous, RayRefused) as exc:
            # Ray 2.60 answers a second submit of one id with a 500 whose traceback says so.
            if "already exists" not in str(exc):
                raise
            log.info("Ray job %s already exists; not submitting it again", submission_id)
            return
        if response.status_code == 404:
            raise RayRefused(f"Ray at {self.address} has no Jobs API (404 on POST /api/jobs/)")

    def status(self, submission_id: str) -> str | None:
        response = self._request("GET", f"/api/jobs/{submission_id}")
        return None if response.status_code == 404 else str(response.json()["status"])

    def ended_at(self, submission_id: str) -> datetime | None:
        """When the job ended (Ray's ``end_time``, milliseconds since the epoch, stamped by the
        job's supervisor as it saw the driver exit); None while it runs or if Ray has no such job."""
        response = self._request("GET", f"/api/jobs/{submission_id}")
        end_ms = None if response.status_code == 404 else response.json().get("end_time")
        return datetime.fromtimestamp(end_ms / 1000, timezone.utc) if isinstance(end_ms, (int, float)) else None

    def stop(self, submission_id: str) -> None:
        self._request("POST", f"/api/jobs/{submission_id}/stop")

    def delete(self, submission_id: str) -> None:
        self._request("DELETE", f"/api/jobs/{submission_id}")

    def states(self) -> dict[str, str]:
        """Every job's state by submission id, in one call: the follower reads this once per
        tick instead of asking about each active run. Ray lists every job it has not been told
        to forget, finished ones too: the log archiver has a run attempt's or sweep driver's
        job forgotten once its final log is stored (``service.log_archive``), or this list, and
        each tick with it, would grow with every run the cluster ever ran (``bench/ray_job_list.py``)."""
        jobs = self._request("GET", "/api/jobs/").json()
        return {job["submission_id"]: str(job["status"]) for job in jobs if job.get("submission_id")}

    def cluster_capacity(self) -> tuple[float, float]:
        """The cluster's total logical (CPUs, GPUs) over its alive nodes, in one HTTP call.

        The Jobs API has no resources call, and ``/api/cluster_status`` stays empty until the
        autoscaler's monitor first reports; in Ray 2.60 the dashboard's ``GET
        /nodes?view=summary`` answers at once, with ``data.summary[i].raylet.resourcesTotal``
        and ``.state`` per node (cached by the dashboard for a few seconds)."""
        response = self._request("GET", "/nodes", params={"view": "summary"})
        cpus = gpus = 0.0
        for node in response.json()["data"]["summary"]:
            raylet = node.get("raylet", {})
            if raylet.get("state") == "ALIVE":
                total = raylet.get("resourcesTotal", {})
                cpus += float(total.get("CPU", 0))
                gpus += float(total.get("GPU", 0))
        return cpus, gpus

    def logs_tail(self, submission_id: str, lines: int = 40) -> str:
        text = self.job_logs(submission_id)
        return "\n".join((text or "").splitlines()[-lines:])

    def job_logs(self, submission_id: str) -> str | None:
        response = self._request("GET", f"/api/jobs/{submission_id}/logs")
        return None if response.status_code == 404 else str(response.json().get("logs", ""))
