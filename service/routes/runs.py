"""Runs: create, list, read, cancel, and read a run's events and metrics."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Annotated, Mapping, Sequence

import pydantic_core
from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response
from pydantic import BaseModel, ValidationError

from api.code_modules import missing_module
from api.module_names import missing_name
from api.data_roots import data_root_problems
from api.data_specs import ImportedDataSpec
from api.eval_metric_specs import ImportedMetricSpec
from api.run_edits import order_by_key
from api.model_specs import ImportedModelSpec, module_name
from api.specs import RunSpec, ignored_field_problems, unrunnable_problems
from api.validation_errors import body_error, field_error, one_line
from api.views import CheckpointsPage, MetricsPage, ResumeRequest, RunEventsPage, RunsPage, RunStatus, RunView
from service.code_store import project_code_store
from service.access import KEY_PREFIX, Caller, Role
from service.deps import AccessDep, CallerDep, RepoDep, project_for_create, require_caller
from service.json_body import ParsedBodyRoute
from service.tokens import bearer_token
from service.db.session import clean_text
from service.repository import Repository, RunNotFound, RunRecord
from service.list_filters import Archived
from service.run_listing import RunFilter
from service.errors import VALIDATION_RESPONSES, ErrorBody, validation_response
from service import idempotency
from service.settings import Settings
from service.spec_caps import spec_cap_problems

router = APIRouter(prefix="/api/v1/runs", tags=["runs"], responses=VALIDATION_RESPONSES, route_class=ParsedBodyRoute)

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
        info = dispatcher.queue_of(run.id) if dispatcher is not None else None
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


def view_json(view: BaseModel, status_code: int) -> Response:
    """``view`` as JSON, encoded here as ``conditional_json`` encodes it. A plain ``def`` route
    that returns the model has FastAPI validate it once more on the thread pool before encoding
    it: one more hop between threads for every submit."""
    return Response(view.model_dump_json(), status_code=status_code, media_type="application/json")


IDEMPOTENCY_HEADER = Header(alias=idempotency.HEADER, description=(
    "a key (1-128 printable ASCII characters) that makes retries of this submit safe: a request "
    "with a key already used in the project returns what that request made (200), or 422 if it "
    "asked for something else"))


@router.post("", status_code=201, response_model=RunView, operation_id="create_run",
             responses={200: {"model": RunView, "description": "the run an earlier request with this Idempotency-Key made"}})
def create_run(spec: RunSpec, request: Request, repo: RepoDep, caller: CallerDep,
               access: AccessDep, project: Annotated[str | None, PROJECT_QUERY] = None,
               idempotency_key: Annotated[str | None, IDEMPOTENCY_HEADER] = None) -> Response:
    """Validate a run spec and queue it in ``project`` (a ``member`` role there is needed); the
    dispatcher admits it to Ray when the cluster and the project's quota have room. Local data
    roots must lie under ``TESSERA_DATA_DIRS``, and a ``code.digest`` must name a package stored
    in the project (``POST /api/v1/code``): 422 otherwise. With an ``Idempotency-Key``, a retry
    returns the first request's run."""
    name = project_for_create(caller, access, project)
    if idempotency_key is not None:
        earlier = replayed_run(repo, name, idempotency_key, spec)
        if earlier is not None:
            return earlier if isinstance(earlier, Response) else _replayed(request, earlier)
    refused = ignored_field_errors(spec) + submit_problems(request, spec, project=access.get_project(name))
    if refused:
        return validation_response(refused)
    # A run made just now is in no plan of the queue yet: its view has no ``queue``.
    if idempotency_key is None:
        return view_json(repo.create_run(spec, project=name, by=caller.who).to_view().model_copy(update=MADE), 201)
    run, created = repo.create_run_once(spec, project=name, idempotency_key=idempotency_key, by=caller.who)
    if created:
        return view_json(run.to_view().model_copy(update=MADE), 201)
    problem = idempotency.replay_problem(idempotency_key, run.spec, spec)  # a concurrent request won the race
    return validation_response([problem]) if problem is not None else _replayed(request, run)


def replayed_run(repo: Repository, project: str, key: str, spec: RunSpec) -> RunRecord | Response | None:
    """The run an earlier request with ``key`` made in ``project``; a 422 response for a bad key or
    a different spec; None when the key is new."""
    problem = idempotency.key_problem(key)
    if problem is not None:
        return validation_response([problem])
    run = repo.run_by_idempotency_key(project, key)
    if run is None:
        return None
    problem = idempotency.replay_problem(key, run.spec, spec)
    return validation_response([problem]) if problem is not None else run


MADE = {"replayed": False}  # a create's answer says whether it made what it shows (201) ...
REPLAYED = {"replayed": True}  # ... or an earlier request with its Idempotency-Key did (200)


def _replayed(request: Request, run: RunRecord) -> Response:
    return view_json(queued_view(request, run).model_copy(update=REPLAYED), 200)


def submit_problems(request: Request, spec: RunSpec, *, project, prefix: str = "",
                    searched_imports: Mapping[str, Sequence[tuple[str, str]]] | None = None) -> list[dict]:
    """422 items for what only the service can check about a run about to be queued in
    ``project`` (a run, a sweep's base with ``prefix="base."``): data roots outside the data
    directories, a code package the project does not hold (or an import it does not hold: the
    spec's own and a sweep's ``searched_imports``), a size the cluster can never hold, and the
    project's caps."""
    settings = request.app.state.settings
    refused = data_root_errors(spec, settings, prefix=prefix)
    if spec.code is not None:
        refused.extend(code_package_errors(request, spec, project=project, prefix=prefix,
                                           searched_imports=searched_imports))
    never = request.app.state.dispatcher.admission.never_fits(spec.model_dump(mode="json"))
    if never is not None:
        refused.append(body_error(prefix + "parallelism.num_workers", f"this run can never start: it {never}, and no "
                             "autoscaler is configured (TESSERA_AUTOSCALER)", spec.parallelism.num_workers))
    return refused + spec_cap_problems(settings, project, spec, prefix=prefix)


def code_package_errors(request: Request, spec: RunSpec, *, project, prefix: str = "",
                        searched_imports: Mapping[str, Sequence[tuple[str, str]]] | None = None) -> list[dict]:
    """422 items for a ``code.digest`` the project does not hold, and for each import
    (``model.import``, ``data.train.import``, ``data.eval.import``, ``eval_metrics[i].import``)
    whose top-level package the held package lacks, or whose module below that top level it lacks
    (``api.code_modules.missing_module``: ``my_project.textz`` without ``my_project/textz.py``,
    ``my_project/textz/__init__.py`` or a folder ``my_project/textz/``); the worker's import
    would fail: ModuleNotFoundError. Only the zip's file names are read for that; then the
    module's source is parsed (never run) for the callable after the colon
    (``api.module_names``: ``my_project.nets:buidl`` when nets.py binds no ``buidl``). A sweep's
    ``searched_imports`` (``api.sweeps.searched_imports``) replace the base's own: each of their
    ``(field, import path)`` values is checked instead."""
    searched_imports = searched_imports or {}
    store = project_code_store(request, project.name)
    digest = spec.code.digest
    if not store.exists(digest):
        return [body_error(prefix + "code.digest", f"no code package with this digest in project {project.name}; "
                           "upload it first (POST /api/v1/code, or `tessera submit --code DIR`)", digest)]
    imports = [(prefix + field + ".import", target.import_path)
               for field, target in (("model", spec.model), ("data.train", spec.data.train), ("data.eval", spec.data.eval))
               if isinstance(target, (ImportedModelSpec, ImportedDataSpec)) and field + ".import" not in searched_imports]
    imports += [(f"{prefix}eval_metrics[{index}].import", metric.import_path)
                for index, metric in enumerate(spec.eval_metrics) if isinstance(metric, ImportedMetricSpec)]
    imports += [pair for values in searched_imports.values() for pair in values]
    names = store.importable_names(digest) if imports else None
    tree = store.module_tree(digest) if names is not None else None
    if names is None or tree is None:
        return []
    held = sorted(names)
    example = f" (e.g. '{held[0]}.module:callable' for a package, '{held[0]}:callable' for a module)" if held else ""
    refused = []
    for field, import_path in imports:
        top = module_name(import_path).split(".")[0]
        if top not in names:
            refused.append(body_error(
                field, f"the code package {digest[:12]} (code.digest) holds no top-level package "
                f"or module {top!r}; it holds: {', '.join(held) or 'none'}. Import from one of those{example}, or "
                f"pack the folder that holds {top} (tessera submit --code DIR)", import_path))
        elif (why := missing_module(tree, import_path) or missing_callable(store, digest, tree, import_path)):
            # Its top level is the package's: the module below it must be there too, and the
            # callable after the colon in its source, when the parse can tell.
            refused.append(body_error(field, f"the code package {digest[:12]} (code.digest) {why}", import_path))
    return refused


def missing_callable(store, digest: str, tree, import_path: str) -> str | None:
    """Why the module of ``import_path`` has no callable of its name (``api.module_names``), or
    None when its source binds it or cannot tell (the workers then look for it)."""
    found = store.module_names(digest, module_name(import_path), tree)
    if found is None or found[1] is None:
        return None
    file, names = found
    return missing_name(names, import_path, file)


def ignored_field_errors(spec: RunSpec, *, prefix: str = "") -> list[dict]:
    """422 items for what a new submission (a run, a sweep's base) may not ask though a stored
    spec may hold it: fields set to no effect (``api.specs.ignored_field_problems``), and what
    every worker would refuse at its start (``api.specs.unrunnable_problems``: a batch larger
    than the data, tokens on data without them)."""
    return [body_error(prefix + field, why, value)
            for field, value, why in ignored_field_problems(spec) + unrunnable_problems(spec)]


def data_root_errors(spec: RunSpec, settings: Settings, *, prefix: str = "") -> list[dict]:
    """422 items for each data set root of ``spec`` outside the configured data directories."""
    return [body_error(field, why, root) for field, root, why in data_root_problems(spec, settings.data_dirs, prefix=prefix)]


@router.get("", response_model=RunsPage, operation_id="list_runs", responses=NOT_MODIFIED)
def list_runs(request: Request, repo: RepoDep, caller: CallerDep, status: RunStatus | None = None,
              sweep_id: Annotated[str | None, Query(max_length=64, description="only this sweep's trials")] = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50,
              cursor: Annotated[str | None, Query(max_length=512)] = None,
              project: Annotated[str | None, Query(max_length=64, description="only this project's runs")] = None,
              tag: Annotated[str | None, Query(max_length=64, description="only runs with this tag")] = None,
              name: Annotated[str | None, Query(max_length=128, description="only runs whose name contains this "
                                                                             "(case-insensitive)")] = None,
              created_after: Annotated[datetime | None, Query(description="only runs created after this time "
                                                                          "(ISO 8601; no offset: UTC)")] = None,
              created_before: Annotated[datetime | None, Query(description="only runs created before this time")] = None,
              archived: Annotated[Archived, Query(description="archived runs: hidden (false), only (true) or "
                                                              "both (all)")] = "false",
              order_by: Annotated[str | None, Query(max_length=140, description="best:<metric key>: that key's best "
                                                    "value first (max or min by api.views.metric_mode); only "
                                                    "runs that reported the key. Default: newest first")] = None,
              ) -> RunsPage:
    """Runs of the API key's projects, newest first (or by a metric's best value), filtered by
    tag, name, status, sweep, creation time and archive state; pass ``next_cursor`` back as
    ``cursor`` for the next page (with the same filters and order). ETag / If-None-Match → 304."""
    projects = caller.visible(project)
    problems, after, before, best_key = list_query_values(created_after, created_before, order_by)
    if problems:
        return validation_response(problems)
    where = RunFilter(projects=projects, status=status, sweep_id=sweep_id, tag=clean_text(tag), name=clean_text(name),
                      created_after=after, created_before=before, archived=archived)
    runs, next_cursor = repo.list_runs(where, limit=limit, cursor=cursor, order_by_best=best_key)
    return conditional_json(request, RunsPage(data=[queued_view(request, run) for run in runs],
                                              next_cursor=next_cursor))


def list_query_values(created_after: datetime | None, created_before: datetime | None, order_by: str | None):
    """The 422 items for ``GET /runs``' time bounds and ``order_by``, the bounds in UTC (naive
    ones are UTC already) and the ``order_by`` metric key."""
    problems, bounds = [], []
    for field, when in (("created_after", created_after), ("created_before", created_before)):
        try:
            bounds.append(when.astimezone(timezone.utc) if when is not None and when.tzinfo is not None else when)
        except OverflowError:
            bounds.append(None)
            problems.append(field_error(field, ["query", field], "a time between the years 1 and 9999 in UTC",
                                        when.isoformat()))
    key = None
    if order_by is not None:
        try:
            key = order_by_key(clean_text(order_by))
        except ValueError as exc:
            problems.append(field_error("order_by", ["query", "order_by"], str(exc), order_by))
    return problems, bounds[0], bounds[1], key


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
    return repo.cancel_run(run_id, by=caller.who).to_view()


@router.get("/{run_id}/events", response_model=RunEventsPage, operation_id="list_run_events", responses=NOT_FOUND)
def list_run_events(run_id: str, repo: RepoDep, caller: CallerDep) -> RunEventsPage:
    """Every status change of the run, oldest first, with the attempt and the reason."""
    scoped_run(repo, caller, run_id, Role.VIEWER)
    return RunEventsPage(data=repo.events(run_id))


@router.get("/{run_id}/metrics", response_model=MetricsPage, operation_id="list_run_metrics", responses=NOT_FOUND)
def list_run_metrics(run_id: str, repo: RepoDep, caller: CallerDep,
                     after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
                     limit: Annotated[int, Query(ge=1, le=100_000)] = 5000,
                     all_attempts: bool = False,
                     key: Annotated[str | None, Query(max_length=256, description="only this key's points, e.g. "
                                                                                  "eval/accuracy")] = None) -> Response:
    """Metric points with ``seq > after`` (of ``key`` alone when given); poll again with
    ``after=last_seq`` for new ones. Points a resumed attempt superseded (it reported their
    steps again) only with ``all_attempts=true``: by default the series has one value per step,
    the surviving one."""
    scoped_run(repo, caller, run_id, Role.VIEWER)
    points, last_seq = repo.metric_rows_after(run_id, after=after, limit=limit, all_attempts=all_attempts, key=key)
    # Encoded here in one pass, as pydantic encodes a ``MetricsPage``: returning the model would
    # have FastAPI build, dump, validate and encode 10,000 points (a dashboard's page) one by one.
    return Response(pydantic_core.to_json({"data": points, "last_seq": last_seq}), media_type="application/json")


@router.post("/{run_id}/resume", response_model=RunView, operation_id="resume_run",
             responses={**NOT_FOUND, 409: {"model": ErrorBody}})
def resume_run(run_id: str, repo: RepoDep, caller: CallerDep,
               request: Annotated[ResumeRequest | None, Body()] = None) -> RunView:
    """Restart a FAILED, CANCELED or STOPPED run as a new attempt that resumes from its newest committed
    checkpoint, optionally on ``num_workers`` workers (the checkpoint reshards). 409 otherwise."""
    scoped_run(repo, caller, run_id, Role.MEMBER)
    num_workers = request.num_workers if request is not None else None
    try:
        return repo.resume_run(run_id, num_workers=num_workers, by=caller.who).to_view()
    except ValidationError as exc:
        return validation_response([field_error("num_workers", ["body", "num_workers"], one_line(exc.errors()),
                                                 num_workers)])


@router.get("/{run_id}/checkpoints", response_model=CheckpointsPage, operation_id="list_run_checkpoints",
            responses=NOT_FOUND)
def list_run_checkpoints(run_id: str, repo: RepoDep, caller: CallerDep) -> CheckpointsPage:
    """The run's checkpoints, oldest first: step, time, bytes, committed, and ``url``, the
    fsspec URL of the folder (loadable with ``torch.distributed.checkpoint``)."""
    scoped_run(repo, caller, run_id, Role.VIEWER)
    return CheckpointsPage(data=repo.checkpoints(run_id))
