"""The sweep driver's reporting to the service: trial ends, the sweep's status, cancel polling.

Tune pickles its callbacks and stopper into the experiment (``tuner.pkl``) and a restored
driver gets the pickled ones back. They therefore carry only a key into ``_SESSIONS``, this
process's reporting state (client, this attempt's sweep token), never the token itself.
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
from api.views import SweepStatus, SweepStatusReport, TrialEnd
from workers.errors import describe
from workers.outcome import MAX_ERROR_CHARS
from workers.reporter import call_with_retries

log = logging.getLogger("workers.tune")

POLL_INTERVAL_S = 2.0  # how often the driver asks the service whether the sweep was canceled


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
        return Path(error_file).read_text()[-MAX_ERROR_CHARS:]
    return None
