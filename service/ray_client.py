"""Ray's Jobs API as the service uses it: submit, status, stop and log tails of one job.

Ray is imported lazily, here and in ``service.ray_head`` only, so Ray's API churn touches two
modules and ``import service`` stays light.
"""

from __future__ import annotations

import logging
import threading
from typing import Literal, Protocol

log = logging.getLogger(__name__)

JobState = Literal["PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"]
FINISHED_JOB_STATES: frozenset[str] = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})
LIVE_JOB_STATES: frozenset[str] = frozenset({"PENDING", "RUNNING"})


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
    return f"Ray job {job_id} failed; last lines of its log:\n{tail}" if tail else f"Ray job {job_id} failed"


def _is_not_found(exc: Exception) -> bool:
    # The SDK wraps HTTP errors as RuntimeError("Request failed with status code 404: Job x does not exist.")
    return isinstance(exc, RuntimeError) and "status code 404" in str(exc)


def _is_already_exists(exc: Exception) -> bool:
    return isinstance(exc, RuntimeError) and "already exists" in str(exc)


class RayJobsClient:
    """``JobsClient`` over ``ray.job_submission.JobSubmissionClient``.

    The SDK client checks the cluster when it is built, so it is built on first use (and again
    after a connection error): the service can start, and report Ray as unreachable, before the
    Ray head is up.
    """

    def __init__(self, address: str):
        self.address = address
        self._client = None
        self._lock = threading.Lock()

    def _sdk(self):
        with self._lock:
            if self._client is None:
                from ray.job_submission import JobSubmissionClient

                self._client = JobSubmissionClient(self.address)
            return self._client

    def _call(self, method: str, *args, **kwargs):
        try:
            return getattr(self._sdk(), method)(*args, **kwargs)
        except OSError:  # builtin and requests' ConnectionError both land here
            with self._lock:
                self._client = None  # rebuild (and re-check the cluster) next time
            raise

    def submit(self, submission_id: str, entrypoint: str, env_vars: dict[str, str]) -> None:
        try:
            self._call("submit_job", entrypoint=entrypoint, submission_id=submission_id,
                       runtime_env={"env_vars": dict(env_vars)})
        except RuntimeError as exc:
            if not _is_already_exists(exc):
                raise
            log.info("Ray job %s already exists; not submitting it again", submission_id)

    def status(self, submission_id: str) -> str | None:
        try:
            return str(self._call("get_job_info", submission_id).status.value)
        except RuntimeError as exc:
            if _is_not_found(exc):
                return None
            raise

    def stop(self, submission_id: str) -> None:
        try:
            self._call("stop_job", submission_id)
        except RuntimeError as exc:
            if not _is_not_found(exc):
                raise

    def states(self) -> dict[str, str]:
        """Every job's state by submission id, in one call (``list_jobs``): the follower reads
        this once per tick instead of asking about each active run."""
        return {job.submission_id: str(job.status.value) for job in self._call("list_jobs") if job.submission_id}

    def cluster_capacity(self) -> tuple[float, float]:
        """The cluster's total logical (CPUs, GPUs) over its alive nodes, in one HTTP call.

        The Jobs API has no resources call, and ``/api/cluster_status`` stays empty until the
        autoscaler's monitor first reports; in Ray 2.60 the dashboard's ``GET
        /nodes?view=summary`` answers at once, with ``data.summary[i].raylet.resourcesTotal``
        and ``.state`` per node (cached by the dashboard for a few seconds)."""
        import httpx

        response = httpx.get(f"{self.address.rstrip('/')}/nodes", params={"view": "summary"}, timeout=10)
        response.raise_for_status()
        cpus = gpus = 0.0
        for node in response.json()["data"]["summary"]:
            raylet = node.get("raylet", {})
            if raylet.get("state") == "ALIVE":
                total = raylet.get("resourcesTotal", {})
                cpus += float(total.get("CPU", 0))
                gpus += float(total.get("GPU", 0))
        return cpus, gpus

    def logs_tail(self, submission_id: str, lines: int = 40) -> str:
        try:
            text = self._call("get_job_logs", submission_id)
        except RuntimeError as exc:
            if _is_not_found(exc):
                return ""
            raise
        return "\n".join(text.splitlines()[-lines:])

    def job_logs(self, submission_id: str) -> str | None:
        try:
            return self._call("get_job_logs", submission_id)
        except RuntimeError as exc:
            if _is_not_found(exc):
                return None
            raise
