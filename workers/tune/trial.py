"""One Tune trial: a Tessera run trained by a Tune *function* trainable.

Train v2 cannot be handed to ``tune.Tuner`` directly (``tune.Tuner(TorchTrainer(...))`` fails
with "Improper 'run' - not string nor trainable"), so each trial registers itself with the
service (when there is one), then trains with ``fit_with_ray(..., tune=True)``, whose
``TuneReportCallback`` forwards rank 0's evaluations to Tune's scheduler.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from ray import tune

from api.client import Client
from api.errors import ApiError
from api.sweeps import SweepSpec, trial_spec
from api.views import TrialRegistration
from workers.outcome import RunOutcome
from workers.paths import ray_storage_path
from workers.reporter import call_with_retries

log = logging.getLogger("workers.tune")

# Read by the Train controller a trial starts: a trainer that finds no free CPUs fails the
# trial (and Tune retries it) instead of waiting forever for workers.
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
FAILED_MARKER = ".tessera-failed"  # in the trial's folder: a failure not worth retrying


@dataclasses.dataclass(frozen=True)
class TrialContext:
    """What every trial of one driver attempt needs (pickled into the trainable)."""

    sweep_json: str
    key: str  # the sweep id, or a fresh id for a sweep without a service
    sweep_id: str | None
    service_url: str | None
    token: str | None = dataclasses.field(repr=False)  # this driver attempt's sweep token
    storage_url: str | None
    start_timeout_s: str


def train_trial(config: dict[str, Any], context: TrialContext) -> None:
    """One Tune trial: register it (with a service), train it, report COMPLETED or FAILED."""
    from workers.ray_train import fit_with_ray

    os.environ.setdefault(START_TIMEOUT_ENV, context.start_timeout_s)
    trial_id = tune.get_context().get_trial_id()
    # Tune retries every failed trial; only "no workers" is worth retrying, so a trial that
    # failed for another reason leaves a marker that makes its retries fail at once.
    failed_marker = Path(tune.get_context().get_trial_dir()) / FAILED_MARKER
    if failed_marker.is_file():
        raise RuntimeError(f"not retried: {failed_marker.read_text()}")
    sweep = SweepSpec.model_validate_json(context.sweep_json)
    params = dict(config.get("params") or {})
    spec = trial_spec(sweep.base, tuple(config["algorithms"]), params, name=f"{sweep.name}-{trial_id}"[:128])
    # The sweep token, never a user key found on this machine: trials run user code.
    client = Client(context.service_url, api_key=context.token) if context.service_url else None
    # Without a service the run id only names the trial's folders; keep it unique per sweep so
    # that a trial never resumes from another sweep's checkpoints.
    run_id, token, attempt = f"{context.key}-{trial_id}", None, 1
    if client is not None:
        ticket = _register(client, context, TrialRegistration(trial_id=trial_id, spec=spec.model_dump(mode="json"),
                                                              params=params))
        if ticket is None:
            return
        run_id, token, attempt = ticket.run_id, ticket.token, ticket.attempt
    outcome = RunOutcome(client, run_id, token)
    try:
        metrics = fit_with_ray(spec, run_id=run_id, service_url=context.service_url, token=token,
                               storage_path=ray_storage_path(context.storage_url, attempt=attempt),
                               storage_url=context.storage_url, attempt=attempt, tune=True)
    except Exception as exc:
        error = outcome.failed(exc)
        if "StartupTimeout" not in error:
            failed_marker.write_text(error)
        raise  # Tune marks the trial errored; the sweep goes on
    outcome.completed(metrics)


def _register(client: Client, context: TrialContext, registration: TrialRegistration) -> Any:
    """The service's ticket (run id, token, attempt) for this trial; None when the trial
    already ended before the driver restarted (nothing to train)."""
    try:
        return call_with_retries(lambda: client.register_trial(context.sweep_id, context.token, registration),
                                 what=f"registering trial {registration.trial_id}")
    except ApiError as exc:
        if exc.status_code == 409:
            log.info("trial %s already ended: %s", registration.trial_id, exc)
            return None
        raise
