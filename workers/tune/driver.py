"""The sweep driver: runs (or restores) a sweep's Tune experiment and reports how it went.

The service runs ``python -m workers.tune --sweep-id ID`` as a Ray job (``drive_sweep``);
``run_sweep`` runs a sweep in this process. How it fits together is in ``docs/sweeps.md``.

A one-worker trial, and a DDP/FSDP trial on CPUs, trains in its Tune actor (with peer actors as
its other ranks), which Tune schedules with the workers' resources and reuses for the next
trial (``workers.tune.actor_ranks``). Any other trial's trainer workers are
scheduled by Ray Train, outside Tune's accounting, so the driver caps concurrency at what the
cluster's CPUs hold (``max_concurrent_trials``), and a trainer that still cannot get workers
fails fast and is retried by Tune (``TRIAL_RETRIES``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import uuid
from typing import Any

from ray import tune

from api.client import Client
from api.process_logging import configure_logging
from workers.ray_job import connect_driver, job_attempt
from api.sweeps import SweepSpec
from api.views import SweepStatus
from workers.errors import describe
from workers.loggers import prepare_mlflow_end
from workers.outcome import MAX_ERROR_CHARS, MAX_MESSAGE_CHARS
from workers.paths import TUNE_EXPERIMENT, failed_trials_url, sweep_experiment_path
from workers.ray_train import forwarded_env
from workers.reporter import call_with_retries
from workers.tune.outcome import SweepOutcome, finalize, summary
from workers.tune.reporting import (_SESSIONS, _DriverSession, _ReportTrialEnds, _StopWhenSweepEnds,
                                    end_left_mlflow_runs)
from workers.tune.space import (build_param_space, build_scheduler, max_concurrent_trials, trains_in_trial_actor,
                                trial_resources)
from workers.tune.trial import START_TIMEOUT_ENV, TrialContext, train_trial

log = logging.getLogger("workers.tune")

TRIAL_RETRIES = 2  # Tune re-runs a trial whose trainer found no workers, or whose actor died, this often


def _trial_dirname(trial: Any) -> str:
    return trial.trial_id  # so a result's folder names its trial


def _run_tune(spec: SweepSpec, session: _DriverSession, *, storage_url: str | None, verbose: int,
              in_actor: bool | None = None):
    import ray

    if in_actor is None:
        in_actor = trains_in_trial_actor(spec)
    elif in_actor and not trains_in_trial_actor(spec):
        raise ValueError("in_actor=True needs trials of one shape (nothing under 'parallelism' searched) "
                         "that are one worker or CPU DDP/FSDP; this sweep's trials need a Ray Train worker group")
    connect_driver()  # inside a Ray job: the job's cluster
    session.base = spec.base  # its MLflow loggers: the driver ends what trials leave RUNNING
    prepare_mlflow_end(spec.base)  # in the background: a stop has seconds (workers.launch)
    context = TrialContext(
        sweep_json=spec.model_dump_json(), key=session.key, sweep_id=session.sweep_id,
        service_url=session.client.base_url if session.client else None, token=session.token,
        storage_url=storage_url, start_timeout_s=os.environ.get(START_TIMEOUT_ENV, "30"), in_actor=in_actor,
        failed_trials=failed_trials_url(storage_url, session.key),
        worker_env=forwarded_env())
    trainable = tune.with_resources(tune.with_parameters(train_trial, context=context),
                                    trial_resources(spec, in_actor=in_actor))
    path = sweep_experiment_path(storage_url, session.key)
    if tune.Tuner.can_restore(path):
        log.info("restoring the Tune experiment at %s", path)
        tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=False)
    else:
        concurrency = max_concurrent_trials(spec, ray.cluster_resources(), in_actor=in_actor)
        log.info("starting Tune at %s, up to %d trial(s) at a time, %s", path, concurrency,
                 "each in its (reused) trial actor and peers" if in_actor else "each on a Ray Train worker group")
        tuner = tune.Tuner(
            trainable, param_space=build_param_space(spec),
            tune_config=tune.TuneConfig(num_samples=spec.num_samples, scheduler=build_scheduler(spec),
                                        max_concurrent_trials=concurrency, time_budget_s=spec.time_budget_s,
                                        trial_dirname_creator=_trial_dirname, reuse_actors=in_actor),
            run_config=tune.RunConfig(name=TUNE_EXPERIMENT, storage_path=path.rsplit("/", 1)[0],
                                      failure_config=tune.FailureConfig(max_failures=TRIAL_RETRIES),
                                      callbacks=[_ReportTrialEnds(session.key)],
                                      stop=_StopWhenSweepEnds(session.key), verbose=verbose))
    try:
        results = tuner.fit()
    except BaseException as exc:  # Ray's stop signal (a canceled sweep) is a SystemExit from here
        end_left_mlflow_runs(session, exc)
        raise
    end_left_mlflow_runs(session, None)
    return results


def drive_sweep(sweep_id: str, *, client: Client, token: str, storage_url: str | None = None, attempt: int = 1,
                verbose: int = 1, in_actor: bool | None = None) -> SweepOutcome:
    """Drive one attempt of a sweep the service stores: report RUNNING, run (or restore) its Tune
    experiment at ``workers.paths.sweep_experiment_path``, end every trial in the service, report
    COMPLETED, or FAILED with the error (and re-raise). If the sweep is canceled meanwhile,
    Tune stops and nothing more is reported."""
    try:
        view = call_with_retries(lambda: client.get_sweep(sweep_id), what=f"fetching sweep {sweep_id}")
        spec = SweepSpec.model_validate(view.spec)  # a driver older than the service may not read it
    except Exception as exc:  # said here: nothing else would, and the job would end without a word
        log.error("sweep %s attempt %d failed: could not fetch or read the sweep: %s", sweep_id, attempt,
                  describe(exc))
        raise
    session = _DriverSession(key=sweep_id, client=client, token=token, sweep_id=sweep_id)
    _SESSIONS[sweep_id] = session

    try:
        session.report_sweep(SweepStatus.RUNNING, message=f"driver attempt {attempt}")
        results = _run_tune(spec, session, storage_url=storage_url, verbose=verbose, in_actor=in_actor)
        outcome = finalize(spec, results, session)
    except Exception as exc:
        log.error("sweep %s attempt %d failed: %s", sweep_id, attempt, describe(exc))
        if session.sweep_status is None:
            try:
                session.report_sweep(SweepStatus.FAILED, error=describe(exc)[:MAX_ERROR_CHARS])
            except Exception as report_exc:
                log.error("could not report FAILED for sweep %s: %s", sweep_id, describe(report_exc))
        raise
    finally:
        _SESSIONS.pop(sweep_id, None)
    if session.sweep_status is None:
        session.report_sweep(SweepStatus.COMPLETED, message=summary(outcome)[:MAX_MESSAGE_CHARS])
    log.info("sweep %s: %s", sweep_id, summary(outcome))
    return outcome


def run_sweep(spec: SweepSpec | dict[str, Any], *, client: Client | None = None, project: str | None = None,
              storage_url: str | None = None, verbose: int = 1, in_actor: bool | None = None) -> SweepOutcome:
    """Run a sweep in this process (connects to Ray with ``ray.init()`` unless already connected).

    With ``client``: creates an ``external`` sweep in the service (in ``project``; default: the
    key's only project, else ``default``) and drives it, so its trials show up as runs there
    (``outcome.sweep_id``, ``trial.run_id``). Without: just Tune.
    ``storage_url`` (``file://``/``s3://``): where checkpoints and the Tune experiment go.
    ``verbose``: Tune's progress output (0 silent, 1 status tables). ``in_actor``: whether
    trials train in their (reused) Tune actors; by default when they can
    (``trains_in_trial_actor``); ``False`` starts a Ray Train worker group per trial."""
    spec = spec if isinstance(spec, SweepSpec) else SweepSpec.model_validate(spec)
    if project is not None and client is None:
        raise ValueError("run_sweep: project names where the service keeps the sweep; pass client= as well")
    if client is not None:
        view = client.create_sweep(spec, driver="external", project=project)
        return drive_sweep(view.id, client=client, token=view.driver_token, storage_url=storage_url,
                           verbose=verbose, in_actor=in_actor)
    session = _DriverSession(key=f"local-{spec.name}-{uuid.uuid4().hex[:8]}")
    _SESSIONS[session.key] = session
    try:
        results = _run_tune(spec, session, storage_url=storage_url, verbose=verbose, in_actor=in_actor)
        return finalize(spec, results, session)
    finally:
        _SESSIONS.pop(session.key, None)


def main(argv: list[str] | None = None) -> int:
    """``python -m workers.tune --sweep-id ID`` with TESSERA_SERVICE_URL, TESSERA_SWEEP_TOKEN,
    TESSERA_STORAGE_URL (optional) and TESSERA_ATTEMPT (default 1) in the environment."""
    parser = argparse.ArgumentParser(prog="python -m workers.tune", description=__doc__.splitlines()[0])
    parser.add_argument("--sweep-id", default=os.environ.get("TESSERA_SWEEP_ID"))
    args = parser.parse_args(argv)
    configure_logging()
    missing = [name for name in ("TESSERA_SERVICE_URL", "TESSERA_SWEEP_TOKEN") if not os.environ.get(name)]
    if missing or not args.sweep_id:
        print(f"workers.tune: set {' and '.join(missing) or 'TESSERA_SWEEP_ID'} (or pass --sweep-id)",
              file=sys.stderr)
        return 2
    try:
        attempt = job_attempt()
    except ValueError as exc:
        print(f"workers.tune: {exc}", file=sys.stderr)
        return 2
    token = os.environ["TESSERA_SWEEP_TOKEN"]
    try:
        drive_sweep(args.sweep_id, client=Client(os.environ["TESSERA_SERVICE_URL"], api_key=token), token=token,
                    storage_url=os.environ.get("TESSERA_STORAGE_URL"), attempt=attempt, verbose=1)
    except SystemExit as stop:
        # Ray's stop signal: a job stop (a cancel) SIGTERMs the driver, which Ray turns into a SystemExit
        # (code 1 in a live cancel) that unwinds Tune without a word; say so, and keep the exit it gave.
        log.warning("sweep %s attempt %d stopped by Ray's stop signal (a cancel, or its job was stopped); exit %s",
                    args.sweep_id, attempt, stop.code)
        raise
    except Exception:  # drive_sweep logged why
        return 1
    return 0
