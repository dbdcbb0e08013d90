"""The Ray job entry point of one run attempt: ``python -m workers.launch --run-id ID``.

The service's dispatcher submits this as a Ray job with the environment:

- ``TESSERA_SERVICE_URL``: where to fetch the run and report to (required);
- ``TESSERA_RUN_TOKEN``: this attempt's bearer token (required; never printed);
- ``TESSERA_ATTEMPT``: the attempt number (default 1);
- ``TESSERA_STORAGE_URL``: ``file://`` or ``s3://`` root for checkpoints (in the run's folder,
  ``workers.paths``; every attempt resumes from the newest committed one) and Ray Train's
  storage (optional).

It fetches and validates the spec, trains with ``fit_with_ray``, and reports COMPLETED, or
FAILED with the root cause as ``"Type: message"`` and exit code 1. Reading the run and the final
status report retry through service and database outages for ``TESSERA_REPORT_PATIENCE_S``
(``workers.retry``); rank 0's reports in between go through its spool (``workers.spool``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from api.client import Client
from api.specs import RunSpec
from workers.outcome import RunOutcome, summary_of
from workers.paths import ray_storage_path
from workers.retry import call_with_retries

log = logging.getLogger("workers.launch")


def run_attempt(run_id: str, *, service_url: str, token: str, attempt: int, storage_url: str | None,
                client: Client | None = None) -> int:
    """Train one attempt of ``run_id`` and report its outcome; returns the process exit code."""
    client = client or Client(service_url, api_key=token)  # the run token also reads the run
    outcome = RunOutcome(client, run_id, token)
    try:
        view = call_with_retries(lambda: client.get_run(run_id), what=f"fetching run {run_id}")
        spec = RunSpec.model_validate(view.spec)
        import ray

        from workers.ray_train import fit_with_ray

        if not ray.is_initialized():
            ray.init()  # inside a Ray job this connects to the job's cluster
        metrics = fit_with_ray(spec, run_id=run_id, service_url=service_url, token=token,
                               storage_path=ray_storage_path(storage_url, attempt=attempt),
                               storage_url=storage_url, attempt=attempt, fork=view.fork)
    except Exception as exc:
        log.error("run %s attempt %d failed: %s", run_id, attempt, outcome.failed(exc))
        return 1
    if not outcome.completed(metrics):
        return 1
    log.info("run %s completed: %s", run_id, summary_of(metrics))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--run-id", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    missing = [name for name in ("TESSERA_SERVICE_URL", "TESSERA_RUN_TOKEN") if not os.environ.get(name)]
    if missing:
        print(f"workers.launch: set {' and '.join(missing)} in the environment", file=sys.stderr)
        return 2
    return run_attempt(args.run_id, service_url=os.environ["TESSERA_SERVICE_URL"],
                       token=os.environ["TESSERA_RUN_TOKEN"], attempt=int(os.environ.get("TESSERA_ATTEMPT", "1")),
                       storage_url=os.environ.get("TESSERA_STORAGE_URL"))


if __name__ == "__main__":
    sys.exit(main())
