"""FastAPI dependencies as ``Annotated`` aliases: what a route needs, taken from ``app.state``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from service.ray_jobs import JobsClient
from service.repository import Repository
from service.settings import Settings
from service.sweep_repository import SweepRepository


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


def require_run_token(run_id: str, request: Request, repo: RepoDep) -> str:
    """Accept a worker's request only with ``Authorization: Bearer <current attempt's token>``.

    Unknown runs get the same 401 as wrong tokens, so the endpoint reveals nothing.
    """
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip() or not repo.check_token(run_id, token.strip()):
        raise HTTPException(status_code=401, detail=UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
    return run_id


RunTokenDep = Annotated[str, Depends(require_run_token)]


SWEEP_UNAUTHORIZED = "invalid or missing sweep token"


def require_sweep_token(sweep_id: str, request: Request, sweeps: SweepsDep) -> str:
    """Accept a sweep driver's request only with ``Authorization: Bearer <current attempt's
    sweep token>``; unknown sweeps get the same 401 as wrong tokens."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip() or not sweeps.check_token(sweep_id, token.strip()):
        raise HTTPException(status_code=401, detail=SWEEP_UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
    return sweep_id


SweepTokenDep = Annotated[str, Depends(require_sweep_token)]
