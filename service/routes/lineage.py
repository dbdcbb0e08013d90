"""Lineage: fork a run into a new one, continue a COMPLETED run, list a run's children.

The writes live in ``service.lineage``; this module checks access and what ``POST /runs``
checks of a new spec (data roots, code package, capacity, wall time), and turns refusals
into 422s that name the field.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse

from api.lineage import ContinueRequest, ForkRequest
from api.specs import RunSpec
from api.time import Time
from api.validation_errors import field_error
from api.views import RunsPage, RunView
from service.access import Role
from service.deps import AccessDep, CallerDep, RepoDep, SettingsDep
from service.errors import VALIDATION_RESPONSES, ErrorBody, validation_response
from service.json_body import ParsedBodyRoute
from service.lineage import (LineageRefused, children, chosen_checkpoint, continue_run, fork_info, forked_spec,
                             insert_fork)
from service.repository import RunRecord
from service.routes.runs import queued_view, scoped_run, submit_problems
from service.spec_caps import duration_problem

router = APIRouter(prefix="/api/v1/runs", tags=["runs"], responses=VALIDATION_RESPONSES, route_class=ParsedBodyRoute)

REFUSALS = {404: {"model": ErrorBody}, 409: {"model": ErrorBody}}


@router.post("/{run_id}/fork", status_code=201, response_model=RunView, operation_id="fork_run",
             responses={404: {"model": ErrorBody}})
def fork_run(run_id: str, request: Request, repo: RepoDep, caller: CallerDep, access: AccessDep, body: Annotated[ForkRequest | None, Body()] = None) -> RunView | JSONResponse:
    """A new run in the parent's project (``member`` needed there) whose spec is the parent's
    with ``patch`` merged in (JSON Merge Patch; an object whose ``name`` changes is replaced),
    starting from the parent's ``latest`` committed checkpoint, the one at ``{"step": N}``, or
    ``scratch``. 422 naming the field for a patch that does not validate or (unless from
    scratch) changes the model, the surgery algorithms or the data's shapes. No body: the same
    spec from the latest checkpoint."""
    parent = scoped_run(repo, caller, run_id, Role.MEMBER)
    body = body if body is not None else ForkRequest()
    try:
        spec = forked_spec(parent, body)
        checkpoint = None if body.from_ == "scratch" else chosen_checkpoint(parent, repo.checkpoints(run_id),
                                                                            body.from_)
    except LineageRefused as refused:
        return validation_response(refused.errors)
    problem = submit_problem(request, access, parent, spec)
    if problem is not None:
        return problem
    child = insert_fork(repo, parent, spec, fork_info(parent, spec, body, checkpoint), by=caller.who)
    return queued_view(request, child)


def submit_problem(request: Request, access: AccessDep, parent: RunRecord, spec: RunSpec) -> JSONResponse | None:
    """What ``POST /runs`` would refuse in ``spec`` (``submit_problems``: data roots, code
    package, a size the cluster can never hold, the project's caps), as a 422 whose locations
    lie under ``patch``."""
    errors = submit_problems(request, spec, project=access.get_project(parent.project))
    if not errors:
        return None
    return validation_response([{**e, "loc": ["body", "patch", *e["loc"][1:]]} for e in errors])


@router.post("/{run_id}/continue", response_model=RunView, operation_id="continue_run", responses=REFUSALS)
def continue_completed_run(run_id: str, body: ContinueRequest, request: Request, repo: RepoDep,
                           caller: CallerDep, access: AccessDep, settings: SettingsDep) -> RunView | JSONResponse:
    """Train a COMPLETED run on to a longer ``max_duration`` (same unit): it goes back to QUEUED
    as its next attempt and resumes from its newest committed checkpoint, its step counter
    going on from there. 409 unless COMPLETED; 422 for a duration that is not longer, or past
    the project's cap."""
    run = scoped_run(repo, caller, run_id, Role.MEMBER)
    too_long = duration_problem(settings, access.get_project(run.project), Time.parse(body.max_duration))
    if too_long is not None:
        return validation_response([field_error("max_duration", ["body", "max_duration"], too_long,
                                                str(body.max_duration))])
    try:
        return queued_view(request, continue_run(repo, run_id, body.max_duration, by=caller.who))
    except LineageRefused as refused:
        return validation_response(refused.errors)


@router.get("/{run_id}/children", response_model=RunsPage, operation_id="list_run_children",
            responses={404: {"model": ErrorBody}})
def list_run_children(run_id: str, request: Request, repo: RepoDep, caller: CallerDep,
                      limit: Annotated[int, Query(ge=1, le=500)] = 100) -> RunsPage:
    """The runs forked from this one, oldest first (their ``parent_id`` is ``run_id``)."""
    scoped_run(repo, caller, run_id, Role.VIEWER)
    return RunsPage(data=[queued_view(request, child) for child in children(repo, run_id, limit=limit)])
