"""FastAPI dependencies as ``Annotated`` aliases: what a route needs, taken from ``app.state``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from service.ray_jobs import JobsClient
from service.repository import Repository
from service.settings import Settings


def get_repo(request: Request) -> Repository:
    return request.app.state.repo


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_jobs(request: Request) -> JobsClient:
    return request.app.state.jobs


RepoDep = Annotated[Repository, Depends(get_repo)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
JobsDep = Annotated[JobsClient, Depends(get_jobs)]

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
