"""One Tune trial: a Tessera run trained by a Tune *function* trainable.

Each trial registers itself with the service (when there is one), then trains one of two ways:

- **In its trial actor** (``TrialContext.in_actor``, ``space.trains_in_trial_actor``): a
  one-worker trial, or a DDP/FSDP trial on CPUs with the actor as rank 0 and peer actors as
  the other ranks, calls ``train_rank`` right there and reports each evaluation with
  ``tune.report``. Tune reuses the actor for the next trial (``reuse_actors``), so after the
  first trial nothing is started, imported or joined again (``workers.tune.actor_ranks``).
- **On a Ray Train worker group** (GPU DDP/FSDP, or a sweep over ``parallelism``):
  ``fit_with_ray(..., tune=True)``, whose ``TuneReportCallback`` forwards rank 0's evaluations
  to Tune's scheduler. (Train v2 cannot be handed to ``tune.Tuner`` directly:
  ``tune.Tuner(TorchTrainer(...))`` fails with "Improper 'run' - not string nor trainable".)

A trial Tune stops (ASHA) stays blocked in ``tune.report`` until Tune resets the actor for the
next trial (or stops it), which raises ``SystemExit`` there: not an ``Exception``, so nothing
here reports it as failed; the driver's ``_ReportTrialEnds`` ends it in the service, and ends
its MLflow run (rank 0 leaves it RUNNING on a stop: ``workers.loggers.MLflowSink``). The reset
waits ``TUNE_FUNCTION_THREAD_TIMEOUT_S`` for that thread to unwind (closing its sink delivers
its last reports, its peer ranks leave), after which Tune would fail the next trial: set here
to two minutes, not 2 s.

A reused actor frees the last trial's model and optimizer (``gc.collect``; they are held in
reference cycles) before the next trial builds its own, so memory does not pile up.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from ray import tune

from api.client import Client
from api.process_logging import configure_logging
from api.errors import ApiError
from api.specs import RunSpec
from api.sweeps import SweepSpec, trial_spec
from api.views import TrialRegistration
from workers.checkpoint import storage_for
from workers.errors import describe
from workers.outcome import RunOutcome
from workers.paths import ray_storage_path
from workers.reporter import call_with_retries
from workers.tune.actor_ranks import train_in_actor

log = logging.getLogger("workers.tune")

# Read by the Train controller a trial starts: a trainer that finds no free CPUs fails the
# trial (and Tune retries it) instead of waiting forever for workers.
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
THREAD_TIMEOUT_ENV = "TUNE_FUNCTION_THREAD_TIMEOUT_S"  # FunctionTrainable.reset_config, Ray 2.60
# How long a reset waits for the stopped trial's thread: its sink delivers the last reports, its
# checkpoint write in flight ends, and its peer ranks leave (actor_ranks.PEERS_END_S).
THREAD_TIMEOUT_S = "120"


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
    failed_trials: str  # workers.paths.failed_trials_url, absolute (worked out in the driver)
    in_actor: bool = False  # train in the trial actor (and its peers): space.trains_in_trial_actor
    # The driver's TESSERA_TEST_/REPORT_/SPOOL_ variables (``ray_train.forwarded_env``),
    # for trials whose actor started before the driver's environment was known.
    worker_env: dict[str, str] = dataclasses.field(default_factory=dict)


def train_trial(config: dict[str, Any], context: TrialContext) -> None:
    """One Tune trial: register it (with a service), train it, report COMPLETED or FAILED."""
    from workers.ray_train import fit_with_ray, worker_config

    # A Tune actor logs warnings only (Ray configures INFO in Ray Train's workers, not here):
    # rank 0's progress and evaluation lines, which train here, reach the driver's log too.
    configure_logging()

    os.environ.setdefault(START_TIMEOUT_ENV, context.start_timeout_s)
    os.environ.setdefault(THREAD_TIMEOUT_ENV, THREAD_TIMEOUT_S)  # read by this actor's next reset
    os.environ.update(context.worker_env)
    trial_id = tune.get_context().get_trial_id()
    # Tune retries every failed trial; only "no workers" (or a lost actor) is worth retrying, so a
    # trial that failed for another reason leaves a marker that makes its retries fail at once.
    # It lives on the sweep's storage, not in ``tune.get_context().get_trial_dir()``: Ray 2.60
    # gives a trial in a fresh actor its driver staging folder and one in a reused actor its
    # working folder (``FunctionTrainable.setup`` vs ``reset_config``), so a retry could miss it.
    marker = f"{context.failed_trials}/{trial_id}"
    storage = storage_for(marker)
    if storage.isfile(marker):
        raise RuntimeError(f"not retried: {storage.read_bytes(marker).decode()}")
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
    # Rank 0's MLflow run is tagged with these; a stopped trial's is ended by the driver
    # (workers.tune.reporting), which finds it by them.
    trial = {"sweep_id": context.key, "trial_id": trial_id}
    try:
        if context.in_actor:
            metrics = train_in_actor(spec, worker_config(spec, run_id=run_id, service_url=context.service_url,
                                                         token=token, storage_url=context.storage_url,
                                                         attempt=attempt, tune=True, trial=trial,
                                                         tune_metric=sweep.metric), _report_to_tune)
        else:
            metrics = fit_with_ray(spec, run_id=run_id, service_url=context.service_url, token=token,
                                   storage_path=ray_storage_path(context.storage_url, attempt=attempt),
                                   storage_url=context.storage_url, attempt=attempt, tune=True, trial=trial,
                                   tune_metric=sweep.metric)
    except Exception as exc:
        error = outcome.failed(exc)
        if "StartupTimeout" not in error:
            try:
                storage.write_bytes(marker, error.encode())
            except Exception as marker_exc:  # the training error matters more; Tune may retry once
                log.warning("could not write %s: %s", marker, describe(marker_exc))
        raise  # Tune marks the trial errored; the sweep goes on
    outcome.completed(metrics)


def _report_to_tune(results: dict[str, float]) -> None:
    tune.report(dict(results))


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
