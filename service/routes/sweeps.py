"""Sweeps: create, list, read, cancel; and the reports of a sweep's driver (docs/sweeps.md).

Driver endpoints take the driver attempt's bearer token (``TESSERA_SWEEP_TOKEN``, or the
``driver_token`` of an external sweep); trial runs then report with their own run tokens.
"""

from __future__ import annotations

import functools
import secrets
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from api.specs import RunSpec, ignored_field_problems, unrunnable_problems
from api.sweeps import SweepSpec, metric_problems, searched_imports, trial_count_problem, trial_spec
from api.validation_errors import body_error, field_error, format_validation_errors
from api.views import (RunView, SweepsPage, SweepStatus, SweepStatusReport, SweepView, TrialEnd, TrialRegistration,
                       TrialTicket)
from service.access import KEY_PREFIX, Caller, Role
from service.deps import AccessDep, CallerDep, SettingsDep, SweepsDep, SweepTokenDep, project_for_create, require_caller
from service.json_body import ParsedBodyRoute
from service.tokens import bearer_token
from service.db.session import clean_text
from service.list_filters import Archived
from service.sweep_listing import SweepFilter
from service.sweep_repository import SweepNotFound, SweepRecord, SweepRepository
from service.errors import VALIDATION_RESPONSES, ErrorBody, validation_response
from service.spec_caps import searched_duration_problems
from service import idempotency
from service.routes.runs import (IDEMPOTENCY_HEADER, MADE, NOT_MODIFIED, REPLAYED, PROJECT_QUERY, conditional_json,
                                 ignored_field_errors, submit_problems, view_json)

router = APIRouter(prefix="/api/v1/sweeps", tags=["sweeps"], responses=VALIDATION_RESPONSES,
                   route_class=ParsedBodyRoute)

NOT_FOUND = {404: {"model": ErrorBody}}
CONFLICT = {409: {"model": ErrorBody}}
DRIVER = {401: {"model": ErrorBody}, **NOT_FOUND}
REPORTABLE = (SweepStatus.RUNNING, SweepStatus.COMPLETED, SweepStatus.FAILED)


def queued_sweep(request: Request, view: SweepView) -> SweepView:
    """``view`` with, while it is QUEUED, its place in the queue and why it waits (runs and
    sweeps share one queue; as of the dispatcher's last tick)."""
    if view.status is not SweepStatus.QUEUED:
        return view
    dispatcher = getattr(request.app.state, "dispatcher", None)
    info = dispatcher.queue_of(view.id) if dispatcher is not None else None
    return view.model_copy(update={"queue": info}) if info is not None else view


@router.post("", status_code=201, response_model=SweepView, operation_id="create_sweep",
             responses={200: {"model": SweepView,
                              "description": "the sweep an earlier request with this Idempotency-Key made"},
                        **CONFLICT})
def create_sweep(spec: SweepSpec, request: Request, sweeps: SweepsDep, caller: CallerDep, access: AccessDep,
                 settings: SettingsDep,
                 driver: Literal["service", "external"] = "service",
                 project: Annotated[str | None, PROJECT_QUERY] = None,
                 idempotency_key: Annotated[str | None, IDEMPOTENCY_HEADER] = None) -> Response:
    """Validate a sweep and store it: ``service`` queues it for the dispatcher, which runs its
    Ray Tune driver as a Ray job; ``external`` stores it RUNNING for a driver the caller runs,
    and the answer carries that driver's ``driver_token`` (shown only here). Needs a ``member``
    role in ``project``, so only a member is ever given a driver token. With an
    ``Idempotency-Key``, a retry returns the first request's sweep (``_replayed``)."""
    name = project_for_create(caller, access, project)
    if idempotency_key is not None:
        problem = idempotency.key_problem(idempotency_key)
        if problem is not None:
            return validation_response([problem])
        earlier = sweeps.sweep_by_idempotency_key(name, idempotency_key)
        if earlier is not None:
            return _replayed(request, sweeps, earlier, spec, driver, idempotency_key)
    too_many = trial_count_problem(spec.search, spec.num_samples, settings.max_sweep_trials)
    if too_many:
        return validation_response([field_error("search", ["body", "search"], too_many, None)])
    refused = ([body_error(field, why, value) for field, value, why in metric_problems(spec)]
               + unsearched(ignored_field_errors(spec.base, prefix="base."), spec)
               + submit_problems(request, spec.base, project=access.get_project(name), prefix="base.",
                                 searched_imports=searched_imports(spec)))
    searched = spec.search.params.get("max_duration")
    if searched is not None and searched.kind in ("grid", "choice"):
        refused += searched_duration_problems(settings, access.get_project(name), searched.extremes(),
                                              field=f"search.params.max_duration.{searched.kind}")
    if refused:
        return validation_response(refused)
    token = secrets.token_urlsafe(32) if driver == "external" else None
    if idempotency_key is None:
        record = sweeps.create_sweep(spec, driver=driver, token=token, project=name)
    else:
        record, created = sweeps.create_sweep_once(spec, driver=driver, token=token, project=name,
                                                   idempotency_key=idempotency_key)
        if not created:  # a concurrent request with the key won the race
            return _replayed(request, sweeps, record, spec, driver, idempotency_key)
    return view_json(sweeps.sweep_view(record.id).model_copy(update={"driver_token": token, **MADE}), 201)


def _sizes_the_data(path: str) -> bool:
    """Whether ``path`` takes part in a batch's fit to the data (``api.specs.data_size_problems``)."""
    return path in ("data.batch_size", "data.drop_last", "parallelism.num_workers") or path.startswith(
        ("data.train.", "data.eval."))


def unsearched(items: list[dict[str, Any]], spec: SweepSpec) -> list[dict[str, Any]]:
    """The base's problems (``ignored_field_errors``) that its search cannot cure: every trial
    takes a searched value in the base's place, so a base ``data.batch_size`` too large for the
    data is no problem when ``data.batch_size`` (or another field the fit depends on) is searched,
    unless every value of that grid or choice has the problem too (a range: given the benefit)."""
    kept = []
    for item in items:
        field = item["field"].removeprefix("base.")
        paths = [path for path, domain in spec.search.params.items()
                 if path == field or (_sizes_the_data(path) and _sizes_the_data(field))]
        if all(_every_value_keeps(spec, path, field) for path in paths):
            kept.append(item)
    return kept


def _every_value_keeps(spec: SweepSpec, path: str, field: str) -> bool:
    """Whether every value of the searched ``path`` leaves the trial with a problem at ``field``."""
    domain = spec.search.params[path]
    if domain.kind not in ("grid", "choice"):
        return False
    base_set = [algorithm.name for algorithm in spec.base.algorithms]
    for value in domain.grid if domain.kind == "grid" else domain.choice:
        try:
            trial = trial_spec(spec.base, base_set, {path: value})
            problems = ignored_field_problems(trial) + unrunnable_problems(trial)
        except ValidationError:  # this value breaks another rule: the sweep's own checks say so
            continue
        if all(problem_field != field for problem_field, _, _ in problems):
            return False
    return True


def _replayed(request: Request, sweeps: SweepRepository, sweep: SweepRecord, spec: SweepSpec,
              driver: str, key: str) -> Response:
    """The answer to a request whose key made ``sweep`` earlier: its view (200), or a 422 when
    the request asks for another spec or driver. A client repeats a key because it lost the
    first answer, the only one that carried an external sweep's driver token: a replay of a
    running external sweep that nobody drives yet (no report, no trial) carries a new token, and
    the earlier one stops working; once it is driven, a replay is a 409."""
    differs = None if sweep.driver == driver else f"driver ({sweep.driver})"
    problem = idempotency.replay_problem(key, sweep.spec, spec, what="sweep", differs=differs)
    if problem is not None:
        return validation_response([problem])
    token = secrets.token_urlsafe(32) if sweep.driver == "external" else None
    if token is not None:
        replaced = sweeps.replace_driver_token(sweep, token)
        if replaced == "driven":  # its driver holds the token: a replay must not take the sweep over
            return JSONResponse(status_code=409, content={"detail": (
                f"sweep {sweep.id}, which this Idempotency-Key made, is being driven already (its driver has "
                "reported or registered a trial, or another request with this key was answered meanwhile); its "
                "driver token is not given again: use a new key for a new sweep")})
        if replaced == "ended":
            token = None  # there is nothing left to drive
    view = queued_sweep(request, sweeps.sweep_view(sweep.id)).model_copy(update={"driver_token": token, **REPLAYED})
    return view_json(view, 200)


@router.get("", response_model=SweepsPage, operation_id="list_sweeps", responses=NOT_MODIFIED)
def list_sweeps(request: Request, sweeps: SweepsDep, caller: CallerDep, status: SweepStatus | None = None,
                limit: Annotated[int, Query(ge=1, le=500)] = 50,
                cursor: Annotated[str | None, Query(max_length=512)] = None,
                name: Annotated[str | None, Query(max_length=128, description="only sweeps whose name contains "
                                                                               "this (case-insensitive)")] = None,
                archived: Annotated[Archived, Query(description="archived sweeps: hidden (false), only (true) or "
                                                                "both (all)")] = "false",
                project: Annotated[str | None, Query(max_length=64, description="only this project's sweeps")] = None,
                ) -> SweepsPage:
    """Sweeps of the key's projects (or of ``project`` alone), newest first, with their trials,
    filtered by status, name and archive state; pass ``next_cursor`` back as ``cursor`` for the
    next page (with the same filters). A project the key has no role in lists nothing, as
    ``GET /runs`` does. ETag / If-None-Match → 304."""
    where = SweepFilter(projects=caller.visible(project), status=status, name=clean_text(name), archived=archived)
    views, next_cursor = sweeps.list_sweep_views(where, limit=limit, cursor=cursor)
    return conditional_json(request, SweepsPage(data=[queued_sweep(request, view) for view in views],
                                                next_cursor=next_cursor))


@router.get("/{sweep_id}", response_model=SweepView, operation_id="get_sweep", responses={**NOT_FOUND, **NOT_MODIFIED})
def get_sweep(sweep_id: str, request: Request, sweeps: SweepsDep, access: AccessDep) -> SweepView:
    """One sweep: status, trials, skipped sets, Pareto front and best trial, for an API key of
    its project or its driver's sweep token. ETag / If-None-Match → 304."""
    token = bearer_token(request.headers.get("authorization", ""))
    if token is None or token.startswith(KEY_PREFIX) or not sweeps.check_token(sweep_id, token):
        scoped_sweep(sweeps, require_caller(request, access), sweep_id, Role.VIEWER)
    return conditional_json(request, queued_sweep(request, sweeps.sweep_view(sweep_id)))


@router.post("/{sweep_id}/cancel", response_model=SweepView, operation_id="cancel_sweep",
             responses={**NOT_FOUND, **CONFLICT})
def cancel_sweep(sweep_id: str, sweeps: SweepsDep, caller: CallerDep) -> SweepView:
    """Stop a sweep and its trials: CANCELING until the dispatcher has stopped the driver job
    (an external sweep is CANCELED at once; its driver stops Tune). 409 if it already ended."""
    scoped_sweep(sweeps, caller, sweep_id, Role.MEMBER)
    sweeps.cancel(sweep_id, by=caller.who)
    return sweeps.sweep_view(sweep_id)


def scoped_sweep(sweeps: SweepRepository, caller: Caller, sweep_id: str, needed: Role) -> SweepRecord:
    """The sweep if the key has ``needed`` in its project; another project's sweep is a 404."""
    sweep = sweeps.get_sweep(sweep_id)
    caller.require(sweep.project, needed, SweepNotFound(sweep_id))
    return sweep


# --- driver reports ------------------------------------------------------------------------

@router.post("/{sweep_id}/report/status", response_model=SweepView, operation_id="report_sweep_status",
             responses={**DRIVER, **CONFLICT})
def report_sweep_status(sweep_id: SweepTokenDep, report: SweepStatusReport, sweeps: SweepsDep):
    """The driver's word: RUNNING once Tune starts, COMPLETED or FAILED at the end. During a
    cancel it is acknowledged and changes nothing."""
    if report.status not in REPORTABLE:
        return validation_response([field_error("status", ["body", "status"], "drivers may report RUNNING, "
                                                "COMPLETED or FAILED", report.status.value)])
    error = report.error
    if report.status is SweepStatus.FAILED and not error:
        error = "the sweep driver reported FAILED without an error message"
    message = report.message or f"driver reported {report.status.value}"
    sweeps.apply_driver_report(sweep_id, report.status, message=message, error=error)
    return sweeps.sweep_view(sweep_id)


@router.post("/{sweep_id}/trials", response_model=TrialTicket, operation_id="register_trial",
             responses={**DRIVER, **CONFLICT})
def register_trial(sweep_id: SweepTokenDep, registration: TrialRegistration, request: Request, sweeps: SweepsDep,
                   access: AccessDep):
    """Start a trial: creates its run the first time, else a new attempt of the same run (which
    resumes from its newest committed checkpoint). Returns the run id and the attempt's run
    token. 409 for a COMPLETED trial; 422 if ``spec`` is not a valid RunSpec."""
    try:
        spec = RunSpec.model_validate(registration.spec)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", "spec", *e["loc"])} for e in exc.errors()]
        return validation_response(format_validation_errors(errors, registration.model_dump(mode="json"),
                                                            _registration_schema()))
    # An external driver is a user's code: its trials are checked as any submitted run is.
    project = access.get_project(sweeps.get_sweep(sweep_id).project)
    refused = submit_problems(request, spec, project=project, prefix="spec.")
    if refused:
        return validation_response(refused)
    token = secrets.token_urlsafe(32)
    run = sweeps.register_trial(sweep_id, trial_id=registration.trial_id, spec=spec,
                                params=registration.params, token=token)
    return TrialTicket(run_id=run.id, token=token, attempt=run.attempt)


@router.post("/{sweep_id}/trials/{trial_id}/end", response_model=RunView, operation_id="end_trial",
             responses=DRIVER)
def end_trial(sweep_id: SweepTokenDep, trial_id: str, end: TrialEnd, sweeps: SweepsDep):
    """Tune is done with a trial: ``stopped`` (its scheduler ended it early) → STOPPED,
    ``failed`` → FAILED. A trial that already ended (it completed) is left as it is."""
    return sweeps.end_trial(sweep_id, trial_id, outcome=end.outcome, message=end.message,
                            error=end.error).to_view()


@functools.lru_cache(maxsize=1)
def _registration_schema() -> dict[str, Any]:
    # A registration's spec is a free-form dict on the wire; name its fields as a RunSpec's.
    run_spec = RunSpec.model_json_schema()
    return {"type": "object", "properties": {"spec": {k: v for k, v in run_spec.items() if k != "$defs"}},
            "$defs": run_spec.get("$defs", {})}
