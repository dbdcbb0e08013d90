"""How a worker's status report changes its run, when reports can be lost, delayed or repeated.

A worker spools what it cannot deliver and replays it in order once the service answers again
(``workers.spool``), so the service sees every report, maybe late, maybe twice:

- a repeat of the status the run already has is acknowledged and changes nothing, terminal
  statuses included (a COMPLETED whose answer was lost is sent again);
- COMPLETED while the run is still STARTING or RESTARTING, or RESTARTING while it is STARTING,
  means the RUNNING report before it was lost for good (refused while the service was half
  up, or spooled on a machine that died): the service records the missing RUNNING, saying so,
  then the report — the legal sequence the run went through;
- RUNNING with ``started_at`` (when the attempt began training, by the worker's clock) sets the
  run's ``attempt_started_at`` (and on its first start ``started_at``) to it, within the attempt's
  start as known so far (its submission; after a RESTARTING, the previous group's start) and now: a RUNNING spooled through an outage arrives late, maybe with the end, and
  the outage is not taken off the run's duration. A RUNNING the service fills in has no such
  word: the attempt's start stays its submission, the nearest time the service knows before it;
- RUNNING with ``step`` (where the attempt resumes from) supersedes earlier attempts' points
  after that step (``service.metric_writes``);
- COMPLETED with ``final_checkpoint`` records whether the final weights were saved; a missing
  one is a run event, not a silent COMPLETED;
- COMPLETED or FAILED with ``ended_at`` (when the attempt ended, by the worker's clock) sets the
  run's ``finished_at`` to it, within the attempt's start and now: a report retried through an
  outage arrives late, and the outage is not the run's duration (``service.run_writes.worker_time``);
- FAILED with ``failure`` (``machine`` or ``code``: what the worker knew of the exception) records
  why, for whoever decides whether to resume it.

While the run is CANCELING a report changes nothing: stopping the job is what makes its worker
fail or stop, and the dispatcher ends the run as CANCELED once Ray confirms.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from api.views import RunStatus
from service.db.models import Run, utcnow
from service.metric_writes import supersede_after
from service.run_writes import add_run_event, apply_run_status

# (status now, report) pairs that went through a RUNNING whose report was lost.
LOST_RUNNING = {(RunStatus.STARTING, RunStatus.COMPLETED), (RunStatus.RESTARTING, RunStatus.COMPLETED),
                (RunStatus.STARTING, RunStatus.RESTARTING)}


def apply_report(session: Session, run: Run, status: RunStatus, *, message: str | None, error: str | None,
                 step: int | None = None, final_checkpoint: str | None = None, started_at: datetime | None = None,
                 ended_at: datetime | None = None, failure: str | None = None) -> None:
    """Apply one worker report to the locked ``run`` (raises ``IllegalTransition`` if illegal)."""
    current = RunStatus(run.status)
    if current is RunStatus.CANCELING or (current is status and current.is_terminal):
        return
    if (current, status) in LOST_RUNNING:
        # When training began is not known: the attempt's start stays its submission (or, after a
        # restart, the previous attempt's start), not this report's arrival, which reads as no time at all.
        apply_run_status(session, run, RunStatus.RUNNING, error=None, started_at=run.attempt_started_at,
                         message=f"RUNNING report lost (the service was unreachable); filled in when {status.value} "
                                 f"arrived")
    apply_run_status(session, run, status, message=message, error=error, started_at=started_at, ended_at=ended_at,
                     failure=failure)
    if status is RunStatus.RUNNING and step is not None:
        superseded = supersede_after(session, run, step)
        if superseded:
            add_run_event(session, run, status, status,
                          f"attempt {run.attempt} resumed from step {step}: {superseded} point(s) earlier attempts "
                          f"reported after it are superseded (GET /metrics?all_attempts=true lists them)", utcnow())
    if status is RunStatus.COMPLETED and final_checkpoint is not None:
        run.final_checkpoint = final_checkpoint
        if final_checkpoint == "missing":
            add_run_event(session, run, status, status,
                          "final checkpoint missing: saving the final weights failed after its retries; the "
                          "newest committed checkpoint is older than the end of training", utcnow())
