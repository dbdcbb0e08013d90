"""Wall-clock limits: a run that has trained longer than its ``max_wall_time`` is stopped.

The limit is the spec's ``max_wall_time``, else its project's ``default_max_wall_time_s``;
it counts from the moment the current attempt was submitted (its latest STARTING event), so a
resumed run gets its full time again. A run past it has its Ray job stopped and ends FAILED
with the reason; its committed checkpoints stay, so it can be resumed (with a longer limit).

How long a run may ask for is capped at submit (``service.spec_caps``).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy import func, select

from api.specs import wall_time_seconds
from api.views import RunStatus
from service.db.models import RunEvent, utcnow
from service.lifecycle import IllegalTransition

log = logging.getLogger(__name__)

LIMITED = (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.RESTARTING)


def limit_of(spec: dict[str, Any], project: Any) -> int | None:
    """A run's wall-clock limit in seconds: its spec's, else its project's default; None: none."""
    text = spec.get("max_wall_time")
    return wall_time_seconds(text) if text else (project.default_max_wall_time_s if project else None)


def attempts_started(repo: Any, run_ids: list[str]) -> dict[tuple[str, int], datetime]:
    """When each attempt of ``run_ids`` was submitted (its latest STARTING event), in one query."""
    if not run_ids:
        return {}
    query = (select(RunEvent.run_id, RunEvent.attempt, func.max(RunEvent.time))
             .where(RunEvent.run_id.in_(run_ids), RunEvent.to_status == "STARTING")
             .group_by(RunEvent.run_id, RunEvent.attempt))
    with repo.db.read() as session:
        return {(run_id, attempt): time for run_id, attempt, time in session.execute(query)}


def enforce(repo: Any, jobs: Any, projects: dict[str, Any], now: datetime | None = None,
            active: list[Any] | None = None) -> list[str]:
    """Stop every active run past its limit; return the ids stopped. ``active``: the runs the
    caller read at the start of its tick, among them every run in a ``LIMITED`` status that is
    not a sweep's trial (None: read them here); a run past its limit is read again before its
    job is stopped."""
    now = now or utcnow()
    stopped = []
    runs = repo.snapshots(LIMITED) if active is None else [run for run in active if run.status in LIMITED]
    limited = [(run, limit) for run in runs
               if not run.driven_by_sweep  # a trial's time belongs to its sweep's driver
               and (limit := limit_of(run.spec, projects.get(run.project))) is not None]
    started_at = attempts_started(repo, [run.id for run, _ in limited])
    for run, limit in limited:
        started = started_at.get((run.id, run.attempt))
        if started is None or (now - started).total_seconds() <= limit:
            continue
        try:
            now_stored = repo.get(run.id)  # ``active`` was read at the tick's start: has the run moved on?
            if (now_stored.status, now_stored.attempt) != (run.status, run.attempt):
                continue
            if run.ray_job_id:
                jobs.stop(run.ray_job_id)
            repo.transition(run.id, RunStatus.FAILED, only_from=[run.status], attempt=run.attempt,
                            error=f"max_wall_time {limit}s exceeded: stopped after "
                                  f"{(now - started).total_seconds():.0f}s; its checkpoints are kept, resume it "
                                  f"to continue")
            stopped.append(run.id)
        except IllegalTransition:  # it changed meanwhile (completed, canceled): theirs stands
            continue
        except Exception:
            log.exception("could not stop run %s at its wall-clock limit; will retry", run.id)
    return stopped
