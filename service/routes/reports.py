"""Worker → service reports: status changes and metric batches, authenticated per attempt.

Each attempt's Ray job gets a fresh token (``TESSERA_RUN_TOKEN``); only its hash is stored, and
re-queuing a run revokes it, so a worker left over from an earlier attempt cannot report.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from api.validation_errors import field_error
from api.views import CheckpointReport, CheckpointView, MetricsReport, NoteReport, RunStatus, RunView, StatusReport
from service.deps import RepoDep, RunTokenDep, SettingsDep
from service.errors import VALIDATION_RESPONSES, ErrorBody, validation_response
from service.json_body import ParsedBodyRoute
from service.metric_limits import MetricLimits
from service.metrics_export import count_metric_points

router = APIRouter(prefix="/api/v1/runs", tags=["reports"],
                   responses={**VALIDATION_RESPONSES, 401: {"model": ErrorBody}},
                   route_class=ParsedBodyRoute)

REPORTABLE = (RunStatus.RUNNING, RunStatus.RESTARTING, RunStatus.COMPLETED, RunStatus.FAILED)
MAX_STEP = 2**63 - 1  # BIGINT column


class MetricsStored(BaseModel):
    stored: int
    replayed: bool = False  # the batch (session, batch) was stored before: acknowledged, not stored again


@router.post("/{run_id}/report/status", response_model=RunView, operation_id="report_status",
             responses={409: {"model": ErrorBody}})
def report_status(run_id: RunTokenDep, report: StatusReport, repo: RepoDep):
    """A worker's word on its run, applied through the state machine (409 if illegal now).

    Idempotent: repeating the run's current status (terminal ones too) is a 200 that changes
    nothing; a COMPLETED after a lost RUNNING fills RUNNING in (``service.worker_reports``).
    While the run is CANCELING the report is acknowledged and changes nothing (the cancel
    wins); the worker sees that in the returned status. A RUNNING report's ``started_at`` is the
    attempt's start, and a terminal report's ``ended_at`` the run's ``finished_at`` (each kept
    between the attempt's start and now): a report that waited out an outage does not add the
    outage to the run's duration, nor take it off.
    """
    if report.status not in REPORTABLE:
        allowed = ", ".join(s.value for s in REPORTABLE[:-1]) + f" or {REPORTABLE[-1].value}"
        return validation_response([field_error("status", ["body", "status"],
                                                f"workers may report {allowed}", report.status.value)])
    error = report.error
    if report.status is RunStatus.FAILED and not error:
        error = "the worker reported FAILED without an error message"
    message = report.message or f"worker reported {report.status.value}"
    started_at = report.started_at if report.status is RunStatus.RUNNING else None
    ended_at = report.ended_at if report.status.is_terminal else None
    return repo.apply_worker_report(run_id, report.status, message=message, error=error, step=report.step,
                                    final_checkpoint=report.final_checkpoint, started_at=started_at, ended_at=ended_at,
                                    failure=report.failure if report.status is RunStatus.FAILED else None).to_view()


@router.post("/{run_id}/report/metrics", response_model=MetricsStored, operation_id="report_metrics",
             response_model_exclude_defaults=True,  # "replayed" only when true: answers stay as they were
             responses={413: {"model": ErrorBody}})
def report_metrics(run_id: RunTokenDep, report: MetricsReport, repo: RepoDep, settings: SettingsDep,
                   request: Request):
    """Store a batch of metric points (409 once the run has ended: its metrics are final).

    Refused whole, nothing stored: 413 past ``TESSERA_MAX_POINTS_PER_REPORT`` points, 422 past the
    run's ``TESSERA_MAX_METRIC_KEYS_PER_RUN`` keys or ``TESSERA_MAX_POINTS_PER_RUN`` points. NaN and
    infinite values are not stored; a run event names each such key and its first step.
    Idempotent with ``session`` and ``batch``: a batch stored before is acknowledged
    (``replayed: true``) and not stored twice."""
    limits = MetricLimits(max_keys=settings.max_metric_keys_per_run,
                          max_points_per_report=settings.max_points_per_report,
                          max_points=settings.max_points_per_run)
    limits.check_report_size(report.points)
    for index, point in enumerate(report.points):
        if point.step > MAX_STEP:
            return validation_response([field_error(f"points[{index}].step", ["body", "points", index, "step"],
                                                    f"step must be at most {MAX_STEP}", point.step)])
        if "\x00" in point.key:
            return validation_response([field_error(f"points[{index}].key", ["body", "points", index, "key"],
                                                    "metric keys must not contain NUL characters", point.key)])
    stored = repo.add_metrics(run_id, report.points, limits, session_id=report.session, batch=report.batch)
    if stored is None:  # replayed from the worker's spool: stored once already
        return MetricsStored(stored=0, replayed=True)
    count_metric_points(request, stored)
    return MetricsStored(stored=stored)


@router.post("/{run_id}/report/checkpoint", response_model=CheckpointView, operation_id="report_checkpoint")
def report_checkpoint(run_id: RunTokenDep, report: CheckpointReport, repo: RepoDep):
    """A committed checkpoint (listed by ``GET /runs/{id}/checkpoints``), or a save that failed
    (recorded as a run event saying why; training went on)."""
    return repo.add_checkpoint(run_id, report)


@router.post("/{run_id}/report/note", response_model=RunView, operation_id="report_note",
             responses={409: {"model": ErrorBody}})
def report_note(run_id: RunTokenDep, report: NoteReport, repo: RepoDep):
    """Something the run's owner must see that is not a status change (old checkpoints could not
    be deleted, for instance): a run event with the worker's message (409 once the run ended)."""
    return repo.add_note(run_id, report.message).to_view()
