"""FastAPI dependencies as ``Annotated`` aliases: what a route needs, taken from ``app.state``.

The ones that only read ``app.state`` (or a remembered API key) are ``async``: FastAPI runs a
plain ``def`` dependency on its thread pool, a hop there and back for each of them on every
request. What may wait on the database runs on the pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from api.validation_errors import field_error
from service.access import EVERY_PROJECT, AccessStore, Caller, ProjectNotFound, Role
from service.ray_client import JobsClient
from service.repository import Repository
from service.settings import Settings
from service.sweep_repository import SweepRepository
from service.tokens import bearer_token


async def get_repo(request: Request) -> Repository:
    return request.app.state.repo


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_sweeps(request: Request) -> SweepRepository:
    return request.app.state.sweeps


async def get_jobs(request: Request) -> JobsClient:
    return request.app.state.jobs


async def get_access(request: Request) -> AccessStore:
    return request.app.state.access


RepoDep = Annotated[Repository, Depends(get_repo)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
JobsDep = Annotated[JobsClient, Depends(get_jobs)]
SweepsDep = Annotated[SweepRepository, Depends(get_sweeps)]
AccessDep = Annotated[AccessStore, Depends(get_access)]

UNAUTHORIZED = "invalid or missing run token"
SWEEP_UNAUTHORIZED = "invalid or missing sweep token"


def authorize(request: Request, record_id: str, check: Callable[[str, str], bool], detail: str) -> str:
    """The one bearer-token check: ``record_id`` if the request's ``Authorization: Bearer
    <token>`` passes ``check(record_id, token)``, else a 401 with ``detail``.

    Unknown ids get the same 401 as wrong tokens, so the endpoint reveals nothing.
    """
    token = bearer_token(request.headers.get("authorization", ""))
    if token is None or not check(record_id, token):
        raise HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": "Bearer"})
    return record_id


def require_run_token(run_id: str, request: Request, repo: RepoDep) -> str:
    """Accept a worker's request only with the current attempt's run token."""
    return authorize(request, run_id, repo.check_token, UNAUTHORIZED)


def require_sweep_token(sweep_id: str, request: Request, sweeps: SweepsDep) -> str:
    """Accept a sweep driver's request only with the current driver attempt's sweep token."""
    return authorize(request, sweep_id, sweeps.check_token, SWEEP_UNAUTHORIZED)


RunTokenDep = Annotated[str, Depends(require_run_token)]
SweepTokenDep = Annotated[str, Depends(require_sweep_token)]


KEY_UNAUTHORIZED = ("a valid API key is required: send Authorization: Bearer tsk_... (the embedded service "
                    "writes its first key to $TESSERA_HOME/credentials)")
# A key was sent and is refused. One wording for an unknown key and a revoked one, and never the
# key itself: the answer tells nobody whether a key they try existed once.
KEY_INVALID = ("the API key sent is not valid (unknown or revoked): send a current key as Authorization: "
               "Bearer tsk_... (an admin makes one with tessera keys create; the embedded service writes its first "
               "key to $TESSERA_HOME/credentials)")


def require_caller(request: Request, access: AccessDep) -> Caller:
    """The holder of the request's API key; 401 without one (``KEY_UNAUTHORIZED``), or with an
    unknown or revoked key (``KEY_INVALID``, the same for both)."""
    token = bearer_token(request.headers.get("authorization", ""))
    if token is None:
        raise HTTPException(status_code=401, detail=KEY_UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
    caller = access.authenticate(token)
    if caller is None:
        raise HTTPException(status_code=401, detail=KEY_INVALID, headers={"WWW-Authenticate": "Bearer"})
    return caller


async def current_caller(request: Request, access: AccessDep) -> Caller:
    """``require_caller`` as a dependency: a key remembered from an earlier request is answered
    here, on the event loop; one that must be read from the database, on the thread pool."""
    token = bearer_token(request.headers.get("authorization", ""))
    caller = access.remembered_caller(token) if token is not None else None
    return caller if caller is not None else await run_in_threadpool(require_caller, request, access)


CallerDep = Annotated[Caller, Depends(current_caller)]


def project_for_create(caller: Caller, access: AccessStore, project: str | None, needed: Role = Role.MEMBER) -> str:
    """The project a new object goes to: ``project``, else the key's default one; checked
    against the key's role there (404 for a project the key has no role in, 403 below ``needed``).

    Routes that create project-owned objects (runs, sweeps, code packages) call this with the
    request's ``project`` field, and then read objects back through their ``project``. A create
    without ``project`` by a key with roles in several projects, none of them ``default``, is a
    422 naming ``project`` and those projects: there is no one project to choose."""
    name = project or caller.default_project()
    if project is None and caller.role_in(name) is None and needed.allows(Role.MEMBER):
        named = sorted(p for p in caller.roles if p != EVERY_PROJECT)
        if len(named) > 1:
            raise HTTPException(status_code=422, detail=[field_error(
                "project", ["query", "project"], f"this API key has roles in several projects ({', '.join(named)}) "
                f"and none in {name}: pass project=P (tessera submit --project P; the SDK's project=; in the "
                "dashboard, pick a project in the header)", None)])
    caller.require(name, needed, ProjectNotFound(name))
    return access.get_project(name).name  # 404 for a name no project has
