"""The Ray Tune sweep driver: a ``SweepSpec`` → a Tune experiment whose trials are Tessera runs.

    from workers.tune import run_sweep
    outcome = run_sweep(spec)                  # just Tune (benchmarks, notebooks)
    outcome = run_sweep(spec, client=client)   # an ``external`` sweep the service shows
    outcome.best, outcome.pareto, outcome.trials

The service runs ``python -m workers.tune --sweep-id ID`` as a Ray job (``drive_sweep``). How it
fits together is in ``docs/sweeps.md``; the hazards, in short:

- Each trial is a Tune *function* trainable (``_train_trial``) that registers the trial with the
  service, then trains with ``fit_with_ray(..., tune=True)``: Train v2 cannot be handed to
  ``tune.Tuner`` directly. The trial actor asks Tune for ``TRIAL_ACTOR_CPUS``; its trainer's
  workers are scheduled by Ray Train, outside Tune's accounting, so the driver caps concurrency
  at what the cluster's CPUs hold (``max_concurrent_trials``) and a trainer that still cannot get
  workers fails fast and is retried by Tune (``TRIAL_RETRIES``).
- Tune pickles its callbacks and stopper into the experiment (``tuner.pkl``) and a restored
  driver gets the pickled ones back. They therefore carry only a key into ``_SESSIONS``, this
  process's reporting state (client, this attempt's sweep token), never the token itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from ray import tune

from api.client import Client
from api.errors import ApiError
from api.sweeps import SweepSpec, algorithm_sets, grace_fraction, pareto_front, trial_spec
from api.views import (
    TERMINAL_STATUSES,
    RunStatus,
    StatusReport,
    SweepStatus,
    SweepStatusReport,
    SweepView,
    TrialEnd,
    TrialRegistration,
)
from workers.errors import describe
from workers.launch import storage_path_for
from workers.ray_train import default_storage_path
from workers.reporter import call_with_retries

log = logging.getLogger("workers.tune")

PROGRESS = "time/progress"  # Tune's time attribute: the fraction of max_duration trained, 0..1
TRIAL_ACTOR_CPUS = 0.25     # the trial actor only waits on its trainer; its workers ask for their own
TRIAL_RETRIES = 2           # Tune re-runs a trial whose trainer found no workers this often
POLL_INTERVAL_S = 2.0       # how often the driver asks the service whether the sweep was canceled
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
EXPERIMENT_NAME = "tune"


# --- the search ---------------------------------------------------------------------------

def build_param_space(spec: SweepSpec) -> dict[str, Any]:
    """Tune's ``param_space``: ``{"algorithms": grid over the valid sets, "params": {path: domain}}``."""
    sets, _ = algorithm_sets(spec)
    params: dict[str, Any] = {}
    for path, domain in spec.search.params.items():
        if domain.grid is not None:
            params[path] = tune.grid_search(list(domain.grid))
        elif domain.choice is not None:
            params[path] = tune.choice(list(domain.choice))
        elif domain.uniform is not None:
            params[path] = tune.uniform(*domain.uniform)
        else:
            params[path] = tune.loguniform(*domain.loguniform)
    return {"algorithms": tune.grid_search([list(s) for s in sets]), "params": params}


def build_scheduler(spec: SweepSpec):
    """FIFO, or ASHA on ``time/progress`` (``max_t=1.0``) with the grace period as a fraction."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if spec.scheduler.name == "fifo":
        return FIFOScheduler()
    scheduler = ASHAScheduler(
        time_attr=PROGRESS, metric=spec.metric, mode=spec.mode, max_t=1.0,
        # progress is batches / max_batches: a float that can land a hair under the rung.
        grace_period=grace_fraction(spec) * (1 - 1e-6),
        reduction_factor=spec.scheduler.reduction_factor,
        # A trial that reached max_t has trained fully: let its trainable finish and report
        # COMPLETED instead of being stopped at its last evaluation.
        stop_last_trials=False)
    # ASHA places a rung at max_t when grace * rf^k lands on it (0.25 × 2²); a decision there
    # would only kill a finished trial before it reports COMPLETED. (Private: Ray 2.60's _Bracket.)
    # If a later Ray renames these, the rung stays: harmless but for that one late decision.
    for bracket in getattr(scheduler, "_brackets", ()):
        if hasattr(bracket, "_rungs"):
            bracket._rungs = [rung for rung in bracket._rungs if rung[0] < 1.0 - 1e-3]
    return scheduler


def max_concurrent_trials(spec: SweepSpec, cluster_resources: dict[str, float]) -> int:
    """At most ``spec.max_concurrent_trials``, and no more trials than the cluster's CPUs (and
    GPUs) hold with every trial's actor and workers running; at least 1."""
    base = spec.base.parallelism
    workers = max([base.num_workers, *_searched_values(spec, "parallelism.num_workers")])
    cpus = max([base.cpus_per_worker, *_searched_values(spec, "parallelism.cpus_per_worker")])
    fits = int(cluster_resources.get("CPU", 0) // (TRIAL_ACTOR_CPUS + workers * cpus))
    if base.use_gpu:
        fits = min(fits, int(cluster_resources.get("GPU", 0) // workers))
    if fits < 1:
        log.warning("a trial needs %.2f CPUs but the cluster has %s: trials will fail to get workers",
                    TRIAL_ACTOR_CPUS + workers * cpus, cluster_resources.get("CPU", 0))
    return max(1, min(spec.max_concurrent_trials, fits))


def _searched_values(spec: SweepSpec, path: str) -> list[int]:
    domain = spec.search.params.get(path)
    return [int(v) for v in domain.extremes()] if domain is not None else []


def experiment_path(storage_url: str | None, sweep_id: str) -> str:
    """``{storage}/sweeps/{sweep_id}/tune`` (a local path for ``file://``); without a storage
    URL, under ``$TESSERA_HOME/ray``."""
    if not storage_url:
        root = default_storage_path()
    else:
        parsed = urlparse(storage_url)
        root = parsed.path if parsed.scheme in ("", "file") else storage_url
    return f"{root.rstrip('/')}/sweeps/{sweep_id}/{EXPERIMENT_NAME}"


# --- outcomes -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TrialOutcome:
    """One trial as Tune ended it. ``status``: COMPLETED (trained its full duration), STOPPED
    (the scheduler, time budget or a cancel ended it early) or FAILED. ``metric``: the best
    value of the sweep's metric by its mode. ``wall_time_s``: the service's (first RUNNING →
    end) when there is a service, else the driver's (trial start → end). ``train_time_s``:
    Tune's ``time_total_s`` (trial start → last report)."""

    trial_id: str
    run_id: str | None
    algorithms: list[str]
    params: dict[str, Any]
    status: Literal["COMPLETED", "STOPPED", "FAILED"]
    metric: float | None
    wall_time_s: float | None
    train_time_s: float | None
    progress: float | None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class SweepOutcome:
    """What a sweep found. ``pareto``: trial ids of COMPLETED trials not dominated on (metric,
    wall time), fastest first; ``best``: the COMPLETED trial with the best metric; ``skipped``:
    algorithm sets never run, with why."""

    sweep_id: str | None
    metric: str
    mode: Literal["max", "min"]
    trials: list[TrialOutcome]
    pareto: list[str]
    best: TrialOutcome | None
    skipped: list[tuple[list[str], str]]

    def trial(self, trial_id: str) -> TrialOutcome:
        return next(t for t in self.trials if t.trial_id == trial_id)


# --- the driver's process-local state (Tune's pickled callbacks find it by key) -------------------------------------------------------

@dataclasses.dataclass
class _DriverSession:
    """Reporting state of one driver process; looked up by key from Tune's pickled callbacks."""

    key: str
    client: Client | None = None
    token: str | None = dataclasses.field(default=None, repr=False)
    sweep_id: str | None = None
    started: dict[str, float] = dataclasses.field(default_factory=dict)  # trial id → time.time()
    ended: dict[str, float] = dataclasses.field(default_factory=dict)
    sweep_status: SweepStatus | None = None  # set once the service says the sweep ended
    _last_poll: float = 0.0

    def end_trial(self, trial_id: str, outcome: Literal["stopped", "failed"], error: str | None = None) -> None:
        """Tell the service (if any); never raises: ``finalize`` makes sure later."""
        if self.client is None:
            return
        end = TrialEnd(outcome=outcome, error=error[:20_000] if error else None)
        try:
            call_with_retries(lambda: self.client.end_trial(self.sweep_id, self.token, trial_id, end),
                              what=f"ending trial {trial_id}", budget_s=30.0)
        except Exception as exc:
            log.warning("could not report trial %s as %s: %s", trial_id, outcome, describe(exc))

    def sweep_ended(self) -> bool:
        """Whether the service canceled (or otherwise ended) the sweep; polls every POLL_INTERVAL_S."""
        if self.client is None or self.sweep_status is not None:
            return self.sweep_status is not None
        now = time.monotonic()
        if now - self._last_poll < POLL_INTERVAL_S:
            return False
        self._last_poll = now
        try:
            status = self.client.get_sweep(self.sweep_id).status
        except Exception as exc:  # a service restart must not stop the sweep
            log.warning("could not poll sweep %s: %s", self.sweep_id, describe(exc))
            return False
        if status.is_terminal or status is SweepStatus.CANCELING:
            log.info("sweep %s is %s: stopping Tune", self.sweep_id, status.value)
            self.sweep_status = status
        return self.sweep_status is not None


_SESSIONS: dict[str, _DriverSession] = {}


class _ReportTrialEnds(tune.Callback):
    """``on_trial_complete`` → ``stopped`` (the service ignores it for a COMPLETED run),
    ``on_trial_error`` → ``failed``. Its state (trial start/end times) survives a restore."""

    def __init__(self, key: str):
        self.key = key

    def on_trial_start(self, iteration, trials, trial, **info):
        _SESSIONS[self.key].started.setdefault(trial.trial_id, time.time())

    def on_trial_complete(self, iteration, trials, trial, **info):
        session = _SESSIONS[self.key]
        session.ended[trial.trial_id] = time.time()
        session.end_trial(trial.trial_id, "stopped")

    def on_trial_error(self, iteration, trials, trial, **info):
        session = _SESSIONS[self.key]
        session.ended[trial.trial_id] = time.time()
        session.end_trial(trial.trial_id, "failed", _trial_error(trial))

    def get_state(self):
        session = _SESSIONS[self.key]
        return {"started": dict(session.started), "ended": dict(session.ended)}

    def set_state(self, state):
        session = _SESSIONS[self.key]
        session.started.update(state.get("started", {}))
        session.ended.update(state.get("ended", {}))


class _StopWhenSweepEnds(tune.Stopper):
    """Stops the whole experiment once the service says the sweep was canceled (or ended)."""

    def __init__(self, key: str):
        self.key = key

    def __call__(self, trial_id, result):
        return False

    def stop_all(self):
        session = _SESSIONS.get(self.key)
        return session is not None and session.sweep_ended()


def _trial_error(trial: Any) -> str | None:
    error_file = getattr(trial, "error_file", None)
    if error_file and os.path.isfile(error_file):
        return Path(error_file).read_text()[-20_000:]
    return None


def _trial_dirname(trial: Any) -> str:
    return trial.trial_id  # so a result's folder names its trial


# --- the trial ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _TrialContext:
    sweep_json: str
    key: str  # the sweep id, or a fresh id for a sweep without a service
    sweep_id: str | None
    service_url: str | None
    token: str | None = dataclasses.field(repr=False)  # this driver attempt's sweep token
    storage_url: str | None
    start_timeout_s: str


def _train_trial(config: dict[str, Any], context: _TrialContext) -> None:
    """One Tune trial: register it (with a service), train it, report COMPLETED or FAILED."""
    from workers.ray_train import fit_with_ray

    # Read by the Train controller this process starts: a trainer that finds no free CPUs
    # fails the trial (Tune retries it) instead of waiting forever.
    os.environ.setdefault(START_TIMEOUT_ENV, context.start_timeout_s)
    trial_id = tune.get_context().get_trial_id()
    # Tune retries every failed trial; only "no workers" is worth retrying, so a trial that
    # failed for another reason leaves a marker that makes its retries fail at once.
    failed_marker = Path(tune.get_context().get_trial_dir()) / ".tessera-failed"
    if failed_marker.is_file():
        raise RuntimeError(f"not retried: {failed_marker.read_text()}")
    sweep = SweepSpec.model_validate_json(context.sweep_json)
    params = dict(config.get("params") or {})
    spec = trial_spec(sweep.base, tuple(config["algorithms"]), params, name=f"{sweep.name}-{trial_id}"[:128])
    client = Client(context.service_url) if context.service_url else None
    # Without a service the run id only names the trial's folders; keep it unique per sweep so
    # that a trial never resumes from another sweep's checkpoints.
    run_id, token, attempt = f"{context.key}-{trial_id}", None, 1
    if client is not None:
        registration = TrialRegistration(trial_id=trial_id, spec=spec.model_dump(mode="json"), params=params)
        try:
            ticket = call_with_retries(lambda: client.register_trial(context.sweep_id, context.token, registration),
                                       what=f"registering trial {trial_id}")
        except ApiError as exc:
            if exc.status_code == 409:  # completed before the driver restarted: nothing to train
                log.info("trial %s already ended: %s", trial_id, exc)
                return
            raise
        run_id, token, attempt = ticket.run_id, ticket.token, ticket.attempt

    def report(status: RunStatus, **fields: str) -> None:
        if client is None:
            return
        body = StatusReport(status=status, **fields)
        try:
            call_with_retries(lambda: client.report_status(run_id, token, body), what=f"reporting {status.value}")
        except Exception as exc:  # e.g. the sweep was canceled meanwhile: the run has ended
            log.error("could not report %s for trial %s: %s", status.value, trial_id, describe(exc))

    try:
        metrics = fit_with_ray(spec, run_id=run_id, service_url=context.service_url, token=token,
                               storage_path=storage_path_for(context.storage_url, attempt=attempt),
                               storage_url=context.storage_url, attempt=attempt, tune=True)
    except Exception as exc:
        error = describe(exc)
        report(RunStatus.FAILED, error=error[:20_000])
        if "StartupTimeout" not in error:
            failed_marker.write_text(error)
        raise  # Tune marks the trial errored; the sweep goes on
    summary = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k.startswith("eval/"))
    report(RunStatus.COMPLETED, message=summary[:2000] or "completed")


# --- running Tune ---------------------------------------------------------------------------

def _run_tune(spec: SweepSpec, session: _DriverSession, *, storage_url: str | None, verbose: int):
    import ray

    if not ray.is_initialized():
        ray.init()  # inside a Ray job this connects to the job's cluster
    context = _TrialContext(
        sweep_json=spec.model_dump_json(), key=session.key, sweep_id=session.sweep_id,
        service_url=session.client.base_url if session.client else None, token=session.token,
        storage_url=storage_url, start_timeout_s=os.environ.get(START_TIMEOUT_ENV, "30"))
    trainable = tune.with_resources(tune.with_parameters(_train_trial, context=context), {"CPU": TRIAL_ACTOR_CPUS})
    path = experiment_path(storage_url, session.key)
    if tune.Tuner.can_restore(path):
        log.info("restoring the Tune experiment at %s", path)
        tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=False)
    else:
        concurrency = max_concurrent_trials(spec, ray.cluster_resources())
        log.info("starting Tune at %s, up to %d trial(s) at a time", path, concurrency)
        tuner = tune.Tuner(
            trainable, param_space=build_param_space(spec),
            tune_config=tune.TuneConfig(num_samples=spec.num_samples, scheduler=build_scheduler(spec),
                                        max_concurrent_trials=concurrency, time_budget_s=spec.time_budget_s,
                                        trial_dirname_creator=_trial_dirname, reuse_actors=False),
            run_config=tune.RunConfig(name=EXPERIMENT_NAME, storage_path=path.rsplit("/", 1)[0],
                                      failure_config=tune.FailureConfig(max_failures=TRIAL_RETRIES),
                                      callbacks=[_ReportTrialEnds(session.key)],
                                      stop=_StopWhenSweepEnds(session.key), verbose=verbose))
    return tuner.fit()


def _outcome(spec: SweepSpec, results: Any, session: _DriverSession, view: SweepView | None) -> SweepOutcome:
    by_trial = {t.trial_id: t for t in (view.trials if view else [])}
    trials = []
    for result in results:
        trial_id = Path(result.path).name
        last = result.metrics or {}
        progress = last.get(PROGRESS)
        status = ("FAILED" if result.error is not None else
                  "COMPLETED" if progress is not None and progress >= 1.0 - 1e-9 else "STOPPED")
        seen = by_trial.get(trial_id)
        wall = seen.wall_time_s if seen is not None and seen.wall_time_s is not None else (
            session.ended[trial_id] - session.started[trial_id]
            if trial_id in session.ended and trial_id in session.started else None)
        config = result.config or {}
        trials.append(TrialOutcome(
            trial_id=trial_id, run_id=seen.run_id if seen else None, algorithms=list(config.get("algorithms", [])),
            params=dict(config.get("params") or {}), status=status, metric=_best(result, spec),
            wall_time_s=wall, train_time_s=last.get("time_total_s"), progress=progress,
            error=describe(result.error) if result.error is not None else None))
    trials.sort(key=lambda t: t.trial_id)
    done = {t.trial_id: t for t in trials if t.status == "COMPLETED" and t.metric is not None}
    pareto = pareto_front({k: (t.metric, t.wall_time_s) for k, t in done.items() if t.wall_time_s is not None},
                          spec.mode)
    pick = max if spec.mode == "max" else min
    best = pick(done.values(), key=lambda t: t.metric) if done else None
    return SweepOutcome(sweep_id=session.sweep_id, metric=spec.metric, mode=spec.mode, trials=trials, pareto=pareto,
                        best=best, skipped=[(list(s), why) for s, why in algorithm_sets(spec)[1]])


def _best(result: Any, spec: SweepSpec) -> float | None:
    frame = result.metrics_dataframe
    if frame is None or spec.metric not in frame:
        value = (result.metrics or {}).get(spec.metric)
        return float(value) if value is not None else None
    values = [float(v) for v in frame[spec.metric] if v is not None and not math.isnan(float(v))]
    if not values:
        return None
    return max(values) if spec.mode == "max" else min(values)


def _finalize(spec: SweepSpec, results: Any, session: _DriverSession) -> SweepOutcome:
    """Make sure the service heard every trial's end (a callback report may have been lost),
    then build the outcome from Tune's results and the service's view."""
    outcome = _outcome(spec, results, session, None)
    if session.client is None:
        return outcome
    view = call_with_retries(lambda: session.client.get_sweep(session.sweep_id), what="fetching the sweep")
    ended_in_tune = {t.trial_id: t for t in outcome.trials}
    for trial in view.trials:
        tuned = ended_in_tune.get(trial.trial_id)
        if trial.status not in TERMINAL_STATUSES and tuned is not None:
            session.end_trial(trial.trial_id, "failed" if tuned.status == "FAILED" else "stopped", tuned.error)
    view = call_with_retries(lambda: session.client.get_sweep(session.sweep_id), what="fetching the sweep")
    return _outcome(spec, results, session, view)


def _summary(outcome: SweepOutcome) -> str:
    counts: dict[str, int] = {}
    for trial in outcome.trials:
        counts[trial.status] = counts.get(trial.status, 0) + 1
    text = f"{len(outcome.trials)} trial(s): " + ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
    if outcome.best is not None:
        text += f"; best {outcome.best.run_id or outcome.best.trial_id} {outcome.metric}={outcome.best.metric:.4g}"
    return text


# --- entry points ---------------------------------------------------------------------------

def drive_sweep(sweep_id: str, *, client: Client, token: str, storage_url: str | None = None, attempt: int = 1,
                verbose: int = 1) -> SweepOutcome:
    """Drive one attempt of a sweep the service stores: report RUNNING, run (or restore) its Tune
    experiment at ``{storage}/sweeps/{sweep_id}/tune``, end every trial in the service, report
    COMPLETED, or FAILED with the error (and re-raise). If the sweep is canceled meanwhile,
    Tune stops and nothing more is reported."""
    view = call_with_retries(lambda: client.get_sweep(sweep_id), what=f"fetching sweep {sweep_id}")
    spec = SweepSpec.model_validate(view.spec)
    session = _DriverSession(key=sweep_id, client=client, token=token, sweep_id=sweep_id)
    _SESSIONS[sweep_id] = session

    def report(status: SweepStatus, **fields: str | None) -> None:
        body = SweepStatusReport(status=status, **fields)
        try:
            call_with_retries(lambda: client.report_sweep_status(sweep_id, token, body),
                              what=f"reporting sweep {status.value}")
        except ApiError as exc:
            if exc.status_code != 409:  # 409: the sweep already is (or is past) that status
                raise
            log.warning("sweep %s: %s refused: %s", sweep_id, status.value, exc)

    try:
        report(SweepStatus.RUNNING, message=f"driver attempt {attempt}")
        results = _run_tune(spec, session, storage_url=storage_url, verbose=verbose)
        outcome = _finalize(spec, results, session)
    except Exception as exc:
        log.error("sweep %s attempt %d failed: %s", sweep_id, attempt, describe(exc))
        if session.sweep_status is None:
            try:
                report(SweepStatus.FAILED, error=describe(exc)[:20_000])
            except Exception as report_exc:
                log.error("could not report FAILED for sweep %s: %s", sweep_id, describe(report_exc))
        raise
    finally:
        _SESSIONS.pop(sweep_id, None)
    if session.sweep_status is None:
        report(SweepStatus.COMPLETED, message=_summary(outcome)[:2000])
    log.info("sweep %s: %s", sweep_id, _summary(outcome))
    return outcome


def run_sweep(spec: SweepSpec | dict[str, Any], *, client: Client | None = None, storage_url: str | None = None,
              verbose: int = 1) -> SweepOutcome:
    """Run a sweep in this process (connects to Ray with ``ray.init()`` unless already connected).

    With ``client``: creates an ``external`` sweep in the service and drives it, so its trials
    show up as runs there (``outcome.sweep_id``, ``trial.run_id``). Without: just Tune.
    ``storage_url`` (``file://``/``s3://``): where checkpoints and the Tune experiment go.
    ``verbose``: Tune's progress output (0 silent, 1 status tables)."""
    spec = spec if isinstance(spec, SweepSpec) else SweepSpec.model_validate(spec)
    if client is not None:
        view = client.create_sweep(spec, driver="external")
        return drive_sweep(view.id, client=client, token=view.driver_token, storage_url=storage_url,
                           verbose=verbose)
    session = _DriverSession(key=f"local-{spec.name}-{uuid.uuid4().hex[:8]}")
    _SESSIONS[session.key] = session
    try:
        results = _run_tune(spec, session, storage_url=storage_url, verbose=verbose)
        return _finalize(spec, results, session)
    finally:
        _SESSIONS.pop(session.key, None)


def main(argv: list[str] | None = None) -> int:
    """``python -m workers.tune --sweep-id ID`` with TESSERA_SERVICE_URL, TESSERA_SWEEP_TOKEN,
    TESSERA_STORAGE_URL (optional) and TESSERA_ATTEMPT (default 1) in the environment."""
    parser = argparse.ArgumentParser(prog="python -m workers.tune", description=__doc__.splitlines()[0])
    parser.add_argument("--sweep-id", default=os.environ.get("TESSERA_SWEEP_ID"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    missing = [name for name in ("TESSERA_SERVICE_URL", "TESSERA_SWEEP_TOKEN") if not os.environ.get(name)]
    if missing or not args.sweep_id:
        print(f"workers.tune: set {' and '.join(missing) or 'TESSERA_SWEEP_ID'} (or pass --sweep-id)",
              file=sys.stderr)
        return 2
    try:
        drive_sweep(args.sweep_id, client=Client(os.environ["TESSERA_SERVICE_URL"], api_key=os.environ["TESSERA_SWEEP_TOKEN"]),
                    token=os.environ["TESSERA_SWEEP_TOKEN"], storage_url=os.environ.get("TESSERA_STORAGE_URL"),
                    attempt=int(os.environ.get("TESSERA_ATTEMPT", "1")), verbose=1)
    except Exception:
        return 1
    return 0


if __name__ == "__main__":
    # Run as the importable module, not as __main__: cloudpickle would copy __main__'s trainable,
    # callbacks and their globals (the driver's client) by value into Tune's trial actors.
    from workers.tune import main as _main

    sys.exit(_main())
