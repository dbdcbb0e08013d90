"""Runs: create, list, read, cancel, and read a run's events and metrics."""

from __future__ import annotations

import hashlib
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from pydantic import BaseModel, ValidationError

from api.data_roots import data_root_problems
from api.specs import RunSpec
from api.views import CheckpointsPage, MetricsPage, ResumeRequest, RunEventsPage, RunsPage, RunStatus, RunView
from service.code_store import project_code_store
from service.access import KEY_PREFIX, Caller, Role
from service.deps import AccessDep, CallerDep, RepoDep, SettingsDep, project_for_create, require_caller
from service.tokens import bearer_token
from service.repository import Repository, RunNotFound, RunRecord
from service.errors import VALIDATION_RESPONSES, ErrorBody, field_error, validation_response
from service.settings import Settings

router = APIRouter(prefix="/api/v1/runs", tags=["runs"], responses=VALIDATION_RESPONSES)

NOT_FOUND = {404: {"model": ErrorBody}}
NOT_MODIFIED = {304: {"description": "unchanged since the ETag sent in If-None-Match"}}
PROJECT_QUERY = Query(max_length=64, description="the project (default: the API key's only project, "
                                                     "else `default`)")
MAX_SEQ = 2**63 - 1  # BIGINT: a larger `after` would be a database error, not an answer


def scoped_run(repo: Repository, caller: Caller, run_id: str, needed: Role) -> RunRecord:
    """The run if the key has ``needed`` in its project; another project's run is a 404, as
    if it did not exist; a role below ``needed`` is a 403."""
    run = repo.get_run(run_id)
    caller.require(run.project, needed, RunNotFound(run_id))
    return run


def queued_view(request: Request, run: RunRecord) -> RunView:
    """The run's view with, while it is QUEUED, its place in the queue and why it waits (as of
    the dispatcher's last tick)."""
    view = run.to_view()
    if run.status is RunStatus.QUEUED:
        dispatcher = getattr(request.app.state, "dispatcher", None)
        info = dispatcher.admission.waiting.get(run.id) if dispatcher is not None else None
        if info is not None:
            view = view.model_copy(update={"queue": info})
    return view


def conditional_json(request: Request, view: BaseModel) -> Response:
    """``view`` as JSON with an ETag of its bytes; 304 without a body when ``If-None-Match`` has it.

    Pollers (the dashboard) send the last ETag back and skip parsing and re-rendering when
    nothing changed. ``no-cache`` makes browsers revalidate rather than reuse a stale copy.
    """
    body = view.model_dump_json().encode()
    etag = '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"'
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    sent = {tag.strip().removeprefix("W/") for tag in request.headers.get("if-none-match", "").split(",")}
    if etag in sent or "*" in sent:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


@router.post("", status_code=201, response_model=RunView, operation_id="create_run")
def create_run(spec: RunSpec, request: Request, repo: RepoDep, caller: CallerDep, access: AccessDep,
               settings: SettingsDep, project: Annotated[str | None, PROJECT_QUERY] = None) -> RunView:
    """Validate a run spec and queue it in ``project`` (a ``member`` role there is needed); the
    dispatcher admits it to Ray when the cluster and the project's quota have room. Local data
    roots must lie under ``TESSERA_DATA_DIRS``, and a ``code.digest`` must name a package stored
    in the project (``POST /api/v1/code``): 422 otherwise."""
    name = project_for_create(caller, access, project)
    refused = data_root_errors(spec, settings)
    if refused:
        return validation_response(refused)
    if spec.code is not None and not project_code_store(request, name).exists(spec.code.digest):
        return validation_response([field_error(
            "code.digest", ["body", "code", "digest"], f"no code package with this digest in project {name}; upload "
            "it first (POST /api/v1/code, or `tessera submit --code DIR`)", spec.code.digest)])
    never = request.app.state.dispatcher.admission.never_fits(spec.model_dump(mode="json"))
    if never is not None:
        return validation_response([field_error(
            "parallelism.num_workers", ["body", "parallelism", "num_workers"],
            f"this run can never start: it {never}, and no autoscaler is configured (TESSERA_AUTOSCALER)",
            spec.parallelism.num_workers)])
    too_long = wall_time_problem(request.app.state.settings, access.get_project(name), spec)
    if too_long is not None:
        return validation_response([field_error("max_wall_time", ["body", "max_wall_time"], too_long,
                                                spec.max_wall_time)])
    return queued_view(request, repo.create_run(spec, project=name))


def wall_time_problem(settings, project, spec: RunSpec) -> str | None:
    """Why ``spec.max_wall_time`` is more than the project may ask for, or None."""
    from api.specs import wall_time_seconds
    from service.wall_clock import wall_time_cap

    cap = wall_time_cap(settings, project)
    if spec.max_wall_time is None or cap is None or wall_time_seconds(spec.max_wall_time) <= cap:
        return None
    return (f"max_wall_time {spec.max_wall_time} is more than project {project.name} may ask for: at most {cap}s "
            f"(an admin of every project can raise the project's max_wall_time_cap_s)")


def data_root_errors(spec: RunSpec, settings: Settings, *, prefix: str = "") -> list[dict]:
    """422 items for each data set root of ``spec`` outside the configured data directories."""
    return [field_error(field, ["body", *field.split(".")], why, root)
            for field, root, why in data_root_problems(spec, settings.data_dirs, prefix=prefix)]


@router.get("", response_model=RunsPage, operation_id="list_runs", responses=NOT_MODIFIED)
def list_runs(request: Request, repo: RepoDep, caller: CallerDep, status: RunStatus | None = None,
              sweep_id: Annotated[str | None, Query(max_length=64, description="only this sweep's trials")] = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50,
              cursor: Annotated[str | None, Query(max_length=512)] = None,
              project: Annotated[str | None, Query(max_length=64, description="only this project's runs")] = None
              ) -> RunsPage:
    """Runs of the API key's projects, newest first; pass ``next_cursor`` back as ``cursor`` for
    the next page. ETag / If-None-Match → 304."""
    projects = caller.visible()
    if project is not None:
        projects = [project] if caller.role_in(project) is not None else []
    runs, next_cursor = repo.list_runs(status=status, sweep_id=sweep_id, limit=limit, cursor=cursor,
                                       projects=projects)
    return conditional_json(request, RunsPage(data=[queued_view(request, run) for run in runs],
                                              next_cursor=next_cursor))


@router.get("/{run_id}", response_model=RunView, operation_id="get_run", responses={**NOT_FOUND, **NOT_MODIFIED})
def get_run(run_id: str, request: Request, repo: RepoDep, access: AccessDep) -> RunView:
    """One run, for an API key of its project or its current attempt's run token (the worker
    reads its spec here). ETag / If-None-Match → 304."""
    token = bearer_token(request.headers.get("authorization", ""))
    if token is not None and not token.startswith(KEY_PREFIX) and repo.check_token(run_id, token):
        return conditional_json(request, repo.get_run(run_id).to_view())
    caller = require_caller(request, access)
    return conditional_json(request, queued_view(request, scoped_run(repo, caller, run_id, Role.VIEWER)))


@router.post("/{run_id}/cancel", response_model=RunView, operation_id="cancel_run",
             responses={**NOT_FOUND, 409: {"model": ErrorBody}})
def cancel_run(run_id: str, repo: RepoDep, caller: CallerDep) -> RunView:
    """Ask for a run to stop. It becomes CANCELING; the dispatcher stops its Ray job, then CANCELED.

    409 if the run has already ended, or if it is an active trial of a sweep (cancel the sweep).
    """
    scoped_run(repo, caller, run_id, Role.MEMBER)
    return repo.cancel_run(run_id).to_view()


@router.get("/{run_id}/events", response_model=RunEventsPage, operation_id="list_run_events", responses=NOT_FOUND)
def list_run_events(run_id: str, repo: RepoDep, caller: CallerDep) -> RunEventsPage:
    """Every status change of the run, oldest first, with the attempt and the reason."""
    scoped_run(repo, caller, run_id, Role.VIEWER)
    return RunEventsPage(data=repo.events(run_id))


@router.get("/{run_id}/metrics", response_model=MetricsPage, operation_id="list_run_metrics", responses=NOT_FOUND)
def list_run_metrics(run_id: str, repo: RepoDep, caller: CallerDep,
                     after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
                     limit: Annotated[int, Query(ge=1, le=100_000)] = 5000,
                     all_attempts: bool = False) -> MetricsPage:
    """Metric points with ``seq > after``; poll again with ``after=last_seq`` for new ones.
    Points a resumed attempt superseded (it reported their steps again) only with
    ``all_attempts=true``: by default the series has one value per step, the surviving one."""
    scoped_run(repo, caller, run_id, Role.VIEWER)
    points, last_seq = repo.metrics_after(run_id, after=after, limit=limit, all_attempts=all_attempts)
    return MetricsPage(data=points, last_seq=last_seq)


@router.post("/{run_id}/resume", response_model=RunView, operation_id="resume_run",
             responses={**NOT_FOUND, 409: {"model": ErrorBody}})
def resume_run(run_id: str, repo: RepoDep, caller: CallerDep,
               request: Annotated[ResumeRequest | None, Body()] = None) -> RunView:
    """Restart a FAILED or CANCELED run as a new attempt that resumes from its newest committed
    checkpoint, optionally on ``num_workers`` workers (the checkpoint reshards). 409 otherwise."""
    scoped_run(repo, caller, run_id, Role.MEMBER)
    num_workers = request.num_workers if request is not None else None
    try:
        return repo.resume_run(run_id, num_workers=num_workers).to_view()
    except ValidationError as exc:
        message = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        return validation_response([field_error("num_workers", ["body", "num_workers"], message, num_workers)])


@router.get("/{run_id}/checkpoints", response_model=CheckpointsPage, operation_id="list_run_checkpoints",
            responses=NOT_FOUND)
def list_run_checkpoints(run_id: str, repo: RepoDep, caller: CallerDep) -> CheckpointsPage:
    """The run's checkpoints, oldest first: step, time, bytes, committed, and ``url``, the
    fsspec URL of the folder (loadable with ``torch.distributed.checkpoint``)."""
    scoped_run(repo, caller, run_id, Role.VIEWER)
    return CheckpointsPage(data=repo.checkpoints(run_id))
