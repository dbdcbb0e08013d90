"""The Ray job entry point of one run attempt: ``python -m workers.launch --run-id ID``.

The service's dispatcher submits this as a Ray job with the environment:

- ``TESSERA_SERVICE_URL``: where to fetch the run and report to (required);
- ``TESSERA_RUN_TOKEN``: this attempt's bearer token (required; never printed);
- ``TESSERA_ATTEMPT``: the attempt number (default 1);
- ``TESSERA_STORAGE_URL``: ``file://`` or ``s3://`` root for checkpoints (in the run's folder,
  ``workers.paths``; every attempt resumes from the newest committed one) and Ray Train's
  storage (optional).

It fetches and validates the spec, trains with ``fit_with_ray``, and reports COMPLETED, or
FAILED with the root cause as ``"Type: message"`` and exit code 1; before that report it ends
FAILED the run's MLflow runs a SIGKILLed rank 0 left RUNNING (``workers.loggers.
end_failed_mlflow_runs``, 10 s at most). Reading the run and the final status report retry
through service and database outages for ``TESSERA_REPORT_PATIENCE_S`` (``workers.retry``);
rank 0's reports in between go through its spool (``workers.spool``).

Stopped by Ray (the service canceled the run), it reports nothing (the service ends the run
CANCELED), ends the run's MLflow runs that are still RUNNING as KILLED
(``workers.loggers.end_interrupted_mlflow_runs``: rank 0, which would have ended them, is killed
after this process exits), and exits as the stop has it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from api.client import Client
from api.process_logging import configure_logging
from api.specs import RunSpec
from workers.loggers import end_failed_mlflow_runs, end_interrupted_mlflow_runs, prepare_mlflow_end
from workers.outcome import RunOutcome, summary_of
from workers.paths import ray_storage_path
from workers.ray_job import job_attempt
from workers.retry import call_with_retries

log = logging.getLogger("workers.launch")

# How a canceled run's job stops (Ray 2.60). The service asks Ray to stop the job
# (service.ray_client.RayJobsClient.stop: POST /api/jobs/{id}/stop). Ray's job supervisor
# (ray/dashboard/modules/job/job_supervisor.py, JobSupervisor.run, lines 392-428) then sends
# RAY_JOB_STOP_SIGNAL (SIGTERM unless set to SIGINT) to the entrypoint's process and its child
# processes, waits up to RAY_JOB_STOP_WAIT_TIME_S for all of them to exit (default 3 s:
# DEFAULT_RAY_JOB_STOP_WAIT_TIME_S, line 66), and SIGKILLs those still alive. The supervisor
# reads the variable from its own environment, which the driver's copies (same file, line 367).
# A driver forked by workers.fork_exec gets the signal from its stand-in, the entrypoint process;
# when the stand-in is SIGKILLed, the fork server SIGKILLs the driver. ray.init sets SIGTERM to
# sys.exit(signum) in the driver (ray/_private/worker.py, init, lines 1675-1679; its docstring
# says so), so the stop reaches run_attempt as SystemExit, out of fit_with_ray's blocking
# ray.get (Ray checks for signals while it waits). When the driver exits, Ray kills the job's
# actors: the Ray Train controller and workers, rank 0 before it ends its MLflow run.
STOP_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
DEFAULT_STOP_WAIT_S = 3.0
STOP_EXIT_S = 1.0  # what the rest of a stopped driver's exit takes (ray.shutdown at exit)


def mlflow_end_budget_s() -> float:
    """How long a stopped driver (this one; a sweep's, ``workers.tune.reporting``) may spend
    ending its MLflow runs: Ray's grace (``STOP_WAIT_ENV``) less ``STOP_EXIT_S``, at least 0.5 s
    and at most 10 s."""
    try:
        grace = float(os.environ.get(STOP_WAIT_ENV, DEFAULT_STOP_WAIT_S))
    except ValueError:
        grace = DEFAULT_STOP_WAIT_S
    return min(10.0, max(0.5, grace - STOP_EXIT_S))


def run_attempt(run_id: str, *, service_url: str, token: str, attempt: int, storage_url: str | None,
                client: Client | None = None) -> int:
    """Train one attempt of ``run_id`` and report its outcome; returns the process exit code."""
    client = client or Client(service_url, api_key=token)  # the run token also reads the run
    outcome = RunOutcome(client, run_id, token)
    spec: RunSpec | None = None
    try:
        view = call_with_retries(lambda: client.get_run(run_id), what=f"fetching run {run_id}")
        spec = RunSpec.model_validate(view.spec)
        prepare_mlflow_end(spec)  # in the background: a stop has seconds (see above)
        from workers.ray_job import connect_driver
        from workers.ray_train import fit_with_ray

        connect_driver()  # inside a Ray job: the job's cluster
        metrics = fit_with_ray(spec, run_id=run_id, service_url=service_url, token=token,
                               storage_path=ray_storage_path(storage_url, attempt=attempt),
                               storage_url=storage_url, attempt=attempt, fork=view.fork)
    except Exception as exc:
        if spec is not None:  # before the report: the service may start the next attempt on it
            try:
                end_failed_mlflow_runs(spec, run_id)
            except Exception as mlflow_exc:  # it logs its own failures; nothing may keep the report from going
                log.warning("could not end run %s's MLflow runs: %s", run_id, mlflow_exc)
        log.error("run %s attempt %d failed: %s", run_id, attempt, outcome.failed(exc))
        return 1
    except BaseException:  # stopped: SystemExit from Ray's stop signal (see above), KeyboardInterrupt
        if spec is not None:
            log.info("run %s attempt %d stopped", run_id, attempt)
            end_interrupted_mlflow_runs(spec, run_id, timeout_s=mlflow_end_budget_s())
        raise
    if not outcome.completed(metrics):
        return 1
    log.info("run %s completed: %s", run_id, summary_of(metrics))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--run-id", required=True)
    args = parser.parse_args(argv)
    configure_logging()
    missing = [name for name in ("TESSERA_SERVICE_URL", "TESSERA_RUN_TOKEN") if not os.environ.get(name)]
    if missing:
        print(f"workers.launch: set {' and '.join(missing)} in the environment", file=sys.stderr)
        return 2
    try:
        attempt = job_attempt()
    except ValueError as exc:
        print(f"workers.launch: {exc}", file=sys.stderr)
        return 2
    return run_attempt(args.run_id, service_url=os.environ["TESSERA_SERVICE_URL"],
                       token=os.environ["TESSERA_RUN_TOKEN"], attempt=attempt,
                       storage_url=os.environ.get("TESSERA_STORAGE_URL"))


if __name__ == "__main__":
    sys.exit(main())
