"""FastAPI dependencies as ``Annotated`` aliases: what a route needs, taken from ``app.state``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from service.ray_client import JobsClient
from service.repository import Repository
from service.settings import Settings
from service.sweep_repository import SweepRepository
from service.tokens import bearer_token


def get_repo(request: Request) -> Repository:
    return request.app.state.repo


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_sweeps(request: Request) -> SweepRepository:
    return request.app.state.sweeps


def get_jobs(request: Request) -> JobsClient:
    return request.app.state.jobs


RepoDep = Annotated[Repository, Depends(get_repo)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
JobsDep = Annotated[JobsClient, Depends(get_jobs)]
SweepsDep = Annotated[SweepRepository, Depends(get_sweeps)]

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
