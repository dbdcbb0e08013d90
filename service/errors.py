"""Error responses: 404/409/401 with short stable details, and 422s that say how to fix the input.

A 422 body is ``{"detail": [{"field", "loc", "msg", "input"}, ...]}``; its items are made by
``api.validation_errors``, which the CLI shares.
"""

from __future__ import annotations

import functools
import inspect
import logging
import typing
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic_settings import BaseSettings

from api.validation_errors import echoed, field_error, format_validation_errors
from service.access import Forbidden, KeyNotFound, LastAdminKey, ProjectExists, ProjectNotFound
from service.keyset import InvalidCursor
from service.repository import RunNotFound
from service.sweep_repository import SweepNotFound
from service.lifecycle import IllegalTransition
from service.metric_limits import MetricLimitExceeded
from service.bounded_storage import StorageTimeout

log = logging.getLogger(__name__)


class FieldError(BaseModel):
    field: str
    loc: list[str | int]
    msg: str
    input: Any = None


class ValidationErrorBody(BaseModel):
    detail: list[FieldError]


class ErrorBody(BaseModel):
    detail: str


# For OpenAPI: routes that take input document our 422 shape instead of FastAPI's default.
VALIDATION_RESPONSES: dict[int | str, dict[str, Any]] = {422: {"model": ValidationErrorBody}}


def validation_response(errors: list[dict[str, Any]]) -> JSONResponse:
    """A 422 of ``errors``, each bad value cut short as ``echoed`` cuts it."""
    shown = [{**error, "input": echoed(error["input"])} if "input" in error else error for error in errors]
    return JSONResponse(status_code=422, content={"detail": _jsonable(shown)})


def _jsonable(value: Any) -> Any:
    try:
        return jsonable_encoder(value)
    except Exception:  # an exotic input must not turn a 422 into a 500
        return repr(value)


@functools.lru_cache(maxsize=None)
def _body_schema(endpoint: Any) -> dict[str, Any] | None:
    """JSON schema of the endpoint's pydantic body parameter, for naming allowed fields."""
    try:
        hints = typing.get_type_hints(endpoint)
        for name in inspect.signature(endpoint).parameters:
            hint = hints.get(name)
            if isinstance(hint, type) and issubclass(hint, BaseModel) and not issubclass(hint, BaseSettings):
                return hint.model_json_schema()
    except Exception:
        log.debug("no body schema for %r", endpoint, exc_info=True)
    return None


def _detail_handler(status: int):
    """An exception handler answering ``status`` with the exception's ``detail``."""

    async def handle(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=status, content={"detail": exc.detail})

    return handle


def install_error_handlers(app: FastAPI) -> None:
    """Map request-validation errors and the service's typed errors to HTTP responses."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        body = getattr(exc, "body", None)
        schema = _body_schema(request.scope.get("endpoint"))
        return validation_response(format_validation_errors(list(exc.errors()), body, schema))

    # Typed errors whose answer is a fixed status and their short, stable ``detail``.
    for error, status in ((RunNotFound, 404), (SweepNotFound, 404), (ProjectNotFound, 404), (KeyNotFound, 404),
                          (Forbidden, 403), (ProjectExists, 409), (LastAdminKey, 409), (IllegalTransition, 409)):
        app.add_exception_handler(error, _detail_handler(status))

    @app.exception_handler(StorageTimeout)
    async def _storage_timeout(_request: Request, exc: StorageTimeout) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": exc.detail}, headers={"Retry-After": "10"})

    @app.exception_handler(MetricLimitExceeded)
    async def _metric_limit(_request: Request, exc: MetricLimitExceeded) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content={"detail": exc.detail})

    @app.exception_handler(InvalidCursor)
    async def _bad_cursor(request: Request, exc: InvalidCursor) -> JSONResponse:
        cursor = request.query_params.get("cursor")
        return validation_response([field_error("cursor", ["query", "cursor"], str(exc), cursor)])
