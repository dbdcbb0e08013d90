"""What a sweep found, from Tune's results and (with a service) the service's view of its trials."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Literal

from api.sweeps import SweepSpec, algorithm_sets, pareto_front
from api.views import TERMINAL_STATUSES, SweepView
from workers.errors import describe
from workers.reporter import call_with_retries
from workers.tune.reporting import _DriverSession
from workers.tune.space import PROGRESS, trained_to_end


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


def sweep_outcome(spec: SweepSpec, results: Any, session: _DriverSession, view: SweepView | None) -> SweepOutcome:
    by_trial = {t.trial_id: t for t in (view.trials if view else [])}
    trials = []
    for result in results:
        trial_id = Path(result.path).name
        last = result.metrics or {}
        progress = last.get(PROGRESS)
        status = "FAILED" if result.error is not None else "COMPLETED" if trained_to_end(progress) else "STOPPED"
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


def finalize(spec: SweepSpec, results: Any, session: _DriverSession) -> SweepOutcome:
    """Make sure the service heard every trial's end (a callback report may have been lost),
    then build the outcome from Tune's results and the service's view."""
    outcome = sweep_outcome(spec, results, session, None)
    if session.client is None:
        return outcome
    view = call_with_retries(lambda: session.client.get_sweep(session.sweep_id), what="fetching the sweep")
    ended_in_tune = {t.trial_id: t for t in outcome.trials}
    for trial in view.trials:
        tuned = ended_in_tune.get(trial.trial_id)
        if trial.status not in TERMINAL_STATUSES and tuned is not None:
            session.end_trial(trial.trial_id, "failed" if tuned.status == "FAILED" else "stopped", tuned.error)
    view = call_with_retries(lambda: session.client.get_sweep(session.sweep_id), what="fetching the sweep")
    return sweep_outcome(spec, results, session, view)


def summary(outcome: SweepOutcome) -> str:
    counts: dict[str, int] = {}
    for trial in outcome.trials:
        counts[trial.status] = counts.get(trial.status, 0) + 1
    text = f"{len(outcome.trials)} trial(s): " + ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
    if outcome.best is not None:
        text += f"; best {outcome.best.run_id or outcome.best.trial_id} {outcome.metric}={outcome.best.metric:.4g}"
    elif counts.get("COMPLETED"):  # a metric of your own that no trial returned, or one that was never a number
        text += f"; no trial reported {outcome.metric}, so none is best"
    return text
