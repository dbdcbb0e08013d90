"""The sweep driver's reporting to the service: trial ends, the sweep's status, cancel polling;
and ending the trials' MLflow runs that their rank 0 left RUNNING.

Tune pickles its callbacks and stopper into the experiment (``tuner.pkl``) and a restored
driver gets the pickled ones back. They therefore carry only a key into ``_SESSIONS``, this
process's reporting state (client, this attempt's sweep token), never the token itself.

A trial's MLflow run (the base spec's ``mlflow`` logger) is ended by its rank 0 when the trial
trains to its end or fails; when Tune stops the trial, rank 0 cannot tell why and leaves it
RUNNING, and often never gets to run again (Tune ends a trial actor it does not reuse, a Ray
Train worker group dies with its trial actor, a canceled sweep's job takes every actor with it).
The driver knows why, and ends the trial's runs still RUNNING with
``workers.loggers.end_running_mlflow_runs`` (by the tags ``tessera.sweep_id`` and
``tessera.trial_id``), the function a canceled run's job driver uses:

* the scheduler (ASHA) stopped the trial (``_ReportTrialEnds.on_trial_complete`` before it trained
  to its end): STOPPED, which MLflow shows FINISHED (why: ``workers.loggers.MLFLOW_STATUS``);
* the trial failed, or Tune retries it (its actor died): FAILED (``on_trial_error``,
  ``on_trial_recover``);
* after Tune (``end_left_mlflow_runs``): the sweep was canceled (the driver saw it, or Ray's
  stop signal, which the service sends on a cancel, ended Tune): every trial's, KILLED; Tune
  stopped the trials itself (the sweep's time budget): those trials', STOPPED; the driver
  failed, or the service ended the sweep otherwise: every trial's, FAILED.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any, Literal

from ray import tune

from api.client import Client
from api.errors import ApiError
from api.specs import RunSpec
from api.views import RunStatus, SweepStatus, SweepStatusReport, TrialEnd
from workers.errors import describe
from workers.launch import mlflow_end_budget_s
from workers.loggers import SWEEP_ID_TAG, TRIAL_ID_TAG, end_running_mlflow_runs
from workers.outcome import MAX_ERROR_CHARS
from workers.reporter import call_with_retries
from workers.tune.space import PROGRESS, trained_to_end

log = logging.getLogger("workers.tune")

POLL_INTERVAL_S = 2.0  # how often the driver asks the service whether the sweep was canceled
# How long the driver (Tune's loop, in a trial's end) waits for a tracking server to end a trial's
# MLflow runs; one that does not answer leaves them RUNNING (it is logged). A stopped driver has
# less: ``workers.launch.mlflow_end_budget_s``.
MLFLOW_END_S = 10.0


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
    base: RunSpec | None = None  # the sweep's base spec: its MLflow loggers are every trial's
    _last_poll: float = 0.0

    def end_mlflow_runs(self, status: RunStatus, *, trial_id: str | None = None,
                        timeout_s: float = MLFLOW_END_S) -> None:
        """End the MLflow runs of this sweep's trials (of ``trial_id`` only, if given) that are
        still RUNNING, as ``status`` (``end_running_mlflow_runs``: bounded, never raises)."""
        if self.base is None:
            return
        tags = {SWEEP_ID_TAG: self.key} | ({TRIAL_ID_TAG: trial_id} if trial_id is not None else {})
        end_running_mlflow_runs(self.base, tags, status, timeout_s=timeout_s)

    def end_trial(self, trial_id: str, outcome: Literal["stopped", "failed"], error: str | None = None) -> None:
        """Tell the service (if any); never raises: ``finalize`` makes sure later."""
        if self.client is None:
            return
        end = TrialEnd(outcome=outcome, error=error[:MAX_ERROR_CHARS] if error else None)
        try:
            call_with_retries(lambda: self.client.end_trial(self.sweep_id, self.token, trial_id, end),
                              what=f"ending trial {trial_id}", budget_s=30.0)
        except Exception as exc:
            log.warning("could not report trial %s as %s: %s", trial_id, outcome, describe(exc))

    def report_sweep(self, status: SweepStatus, **fields: str | None) -> None:
        """Report the sweep's own status (with retries). A 409 (the sweep already is, or is past,
        that status) is logged; other errors are raised."""
        body = SweepStatusReport(status=status, **fields)
        try:
            call_with_retries(lambda: self.client.report_sweep_status(self.sweep_id, self.token, body),
                              what=f"reporting sweep {status.value}")
        except ApiError as exc:
            if exc.status_code != 409:
                raise
            log.warning("sweep %s: %s refused: %s", self.sweep_id, status.value, exc)

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
    ``on_trial_error`` → ``failed``; and the trial's MLflow runs that rank 0 left RUNNING (see
    the module docstring). Its state (trial start/end times) survives a restore."""

    def __init__(self, key: str):
        self.key = key

    def on_trial_start(self, iteration, trials, trial, **info):
        _SESSIONS[self.key].started.setdefault(trial.trial_id, time.time())

    def on_trial_complete(self, iteration, trials, trial, **info):
        session = _SESSIONS[self.key]
        session.ended[trial.trial_id] = time.time()
        session.end_trial(trial.trial_id, "stopped")
        # A trial that trained to its end ended its MLflow run itself (its last report came after).
        if not trained_to_end((trial.last_result or {}).get(PROGRESS)):
            session.end_mlflow_runs(RunStatus.STOPPED, trial_id=trial.trial_id)

    def on_trial_error(self, iteration, trials, trial, **info):
        session = _SESSIONS[self.key]
        session.ended[trial.trial_id] = time.time()
        session.end_trial(trial.trial_id, "failed", _trial_error(trial))
        session.end_mlflow_runs(RunStatus.FAILED, trial_id=trial.trial_id)

    def on_trial_recover(self, iteration, trials, trial, **info):
        # Tune trains the trial again (its actor died, its trainer found no workers): the failed
        # try's rank 0 is gone. Called before the retry starts, so its new MLflow run is not hit.
        _SESSIONS[self.key].end_mlflow_runs(RunStatus.FAILED, trial_id=trial.trial_id)

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


def end_left_mlflow_runs(session: _DriverSession, stopped_by: BaseException | None) -> None:
    """After Tune returned (``stopped_by`` None) or raised it: end the trials' MLflow runs that
    are still RUNNING and that no trial end did (see the module docstring)."""
    if stopped_by is not None and not isinstance(stopped_by, Exception):
        # Ray's stop signal (the service stopping the job of a canceled sweep), Ctrl-C: the trial
        # actors die with this process, within Ray's grace for the stop.
        session.end_mlflow_runs(RunStatus.CANCELED, timeout_s=mlflow_end_budget_s())
    elif stopped_by is not None:
        session.end_mlflow_runs(RunStatus.FAILED)  # the sweep fails, and its active trials with it
    elif session.sweep_status in (SweepStatus.CANCELING, SweepStatus.CANCELED):
        session.end_mlflow_runs(RunStatus.CANCELED)
    elif session.sweep_status is not None:  # the service ended it otherwise, and its trials FAILED
        session.end_mlflow_runs(RunStatus.FAILED)
    else:  # Tune stopped these itself (the time budget) without a trial end
        for trial_id in sorted(set(session.started) - set(session.ended)):
            session.end_mlflow_runs(RunStatus.STOPPED, trial_id=trial_id)


def _trial_error(trial: Any) -> str | None:
    error_file = getattr(trial, "error_file", None)
    if error_file and os.path.isfile(error_file):
        return Path(error_file).read_text()[-MAX_ERROR_CHARS:]
    return None
