"""``SweepView``: a sweep row and its trial runs as the API shows them, with the Pareto front
of metric against wall time (the time each trial trained) and the best trial."""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from api.sweeps import pareto_front
from api.views import ACTIVE_STATUSES, RunStatus, SkippedSet, SweepStatus, SweepView, TrialView, trained_up_to
from service.db.models import Run, Sweep


def build_sweep_view(sweep: Sweep, trials: list[Run], now: datetime) -> SweepView:
    """``SweepView`` of a sweep row and its trial runs (oldest first), as of ``now``."""
    metric, mode = sweep.spec.get("metric", "eval/accuracy"), sweep.spec.get("mode", "max")
    views = [_trial_view(run, metric, mode, now) for run in trials if run.trial_id is not None]
    finished = {t.run_id: t for t in views if t.status is RunStatus.COMPLETED and t.metric is not None}
    points = {run_id: (t.metric, t.wall_time_s) for run_id, t in finished.items() if t.wall_time_s is not None}
    pick = max if mode == "max" else min
    best = pick(finished.values(), key=lambda t: t.metric, default=None)
    return SweepView(
        id=sweep.id, name=sweep.name, status=SweepStatus(sweep.status), attempt=sweep.attempt, driver=sweep.driver,
        spec=sweep.spec, project=sweep.project, metric=metric, mode=mode, created_at=sweep.created_at, started_at=sweep.started_at,
        finished_at=sweep.finished_at, error=sweep.error, message=sweep.message, trials=views,
        skipped=[SkippedSet(**s) for s in sweep.skipped or []], pareto=pareto_front(points, mode),
        best_run_id=best.run_id if best is not None else None,
        counts=dict(Counter(t.status.value for t in views)), archived_at=sweep.archived_at)


def _trial_view(run: Run, metric: str, mode: str, now: datetime) -> TrialView:
    status = RunStatus(run.status)
    bounds = (run.extrema or {}).get(metric)
    wall_time_s = None
    if run.started_at is not None:  # the time it trained: its waits between attempts are not the trial's cost
        wall_time_s = trained_up_to(run.trained_seconds or 0.0,
                                    run.training_since if status in ACTIVE_STATUSES else None, now)
    return TrialView(run_id=run.id, trial_id=run.trial_id, name=run.name, status=status, attempt=run.attempt,
                     algorithms=[a["name"] for a in run.spec.get("algorithms", [])],
                     params=dict(run.trial_params or {}),
                     metric=(bounds[0] if mode == "min" else bounds[1]) if bounds else None,
                     last_metric=(run.summary or {}).get(metric), wall_time_s=wall_time_s,
                     progress=(run.summary or {}).get("time/progress"))
