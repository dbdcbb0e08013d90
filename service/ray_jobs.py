"""All contact with Ray: the Jobs API client the dispatcher uses, and the embedded Ray head.

Ray is imported lazily here and nowhere else in the service, so Ray's API churn touches one
module and ``import service`` stays light.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from service.settings import Settings

log = logging.getLogger(__name__)

JobState = Literal["PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"]
FINISHED_JOB_STATES: frozenset[str] = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})
LIVE_JOB_STATES: frozenset[str] = frozenset({"PENDING", "RUNNING"})

# Forwarded from the service's environment to every job it submits (runs and sweep drivers),
# so a deployment (or a test) can tune Ray Train and reach object storage without code changes.
FORWARDED_ENV_PREFIXES = ("RAY_TRAIN_", "AWS_", "TESSERA_TEST_")

# The folder that holds `service/` and `workers/`: embedded Ray workers import from it.
REPO_ROOT = Path(__file__).resolve().parent.parent


class JobsClient(Protocol):
    """What the dispatcher and reconciler need from Ray's Jobs API."""

    def submit(self, submission_id: str, entrypoint: str, env_vars: dict[str, str]) -> None:
        """Start a job; if a job with this id already exists, do nothing (idempotent per attempt)."""

    def status(self, submission_id: str) -> str | None:
        """PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED; None if Ray has no such job.
        Raises when Ray cannot be asked: "unknown" must never read as "gone"."""

    def stop(self, submission_id: str) -> None:
        """Ask the job to stop; no error if it already finished or does not exist."""

    def logs_tail(self, submission_id: str, lines: int = 40) -> str:
        """The last ``lines`` lines of the job's driver log ("" if there is none)."""


def forwarded_env() -> dict[str, str]:
    """The service's ``FORWARDED_ENV_PREFIXES`` variables, as the base of a job's environment."""
    return {name: value for name, value in os.environ.items() if name.startswith(FORWARDED_ENV_PREFIXES)}


def stop_and_check(jobs: JobsClient, job_id: str | None) -> tuple[bool, str | None]:
    """Ask Ray to stop ``job_id`` (idempotent: callers repeat it every tick) and return
    (still live, its state or None if Ray has no such job)."""
    if job_id is None:
        return False, None
    jobs.stop(job_id)
    state = jobs.status(job_id)
    return state in LIVE_JOB_STATES, state


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

    def logs_tail(self, submission_id: str, lines: int = 40) -> str:
        try:
            text = self._call("get_job_logs", submission_id)
        except RuntimeError as exc:
            if _is_not_found(exc):
                return ""
            raise
        return "\n".join(text.splitlines()[-lines:])


def start_embedded_ray(settings: "Settings", *, timeout_s: float = 120.0) -> str:
    """Start a Ray head inside this process and return its Jobs API address (``http://...``).

    The head lives and dies with the service; jobs it ran are gone after a restart, which the
    reconciler handles by re-queuing their runs.
    """
    # Ray workers inherit this process's environment, which must be set before ray.init.
    os.environ.pop("RAY_ADDRESS", None)  # would make ray.init connect elsewhere
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local only: no cluster token to hand out
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in paths:  # job drivers must find `workers` whatever their cwd
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *paths])

    import ray

    # Ray puts unix sockets under its temp dir; their paths must stay short.
    temp_dir = tempfile.mkdtemp(prefix="tsr", dir="/tmp")
    with _free_dashboard_agent_port():
        context = ray.init(num_cpus=settings.ray_num_cpus, include_dashboard=True, dashboard_host="127.0.0.1",
                           _temp_dir=temp_dir, log_to_driver=False)
    address = f"http://{context.dashboard_url}"
    try:
        _wait_for_jobs_api(address, timeout_s, temp_dir)
    except BaseException:
        ray.shutdown()
        raise
    log.info("embedded Ray head started; Jobs API at %s", address)
    return address


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


def _wait_for_jobs_api(address: str, timeout_s: float, temp_dir: str) -> None:
    """Return once the head accepts jobs. The dashboard answers before its job agent is up,
    and an agent that could not bind its port (another Ray head on this machine) never is."""
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
        client.submit_job(entrypoint="true", submission_id=f"tessera-startup-probe-{secrets.token_hex(4)}")
    except RuntimeError as exc:
        raise RuntimeError(
            f"the embedded Ray head cannot run jobs ({exc}). Is another Ray head running on this machine? "
            f"See {temp_dir}/session_latest/logs/dashboard_agent.log, or set TESSERA_RAY_ADDRESS to use "
            "an existing Ray cluster instead.") from exc


def stop_embedded_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
