"""Error responses: 404/409/401 with short stable details, and 422s that say how to fix the input.

A 422 body is ``{"detail": [{"field", "loc", "msg", "input"}, ...]}``: ``field`` is the dotted
path the user wrote (``optimizer.lr``, not pydantic's ``optimizer.sgd.lr``), ``input`` the bad
value, and ``msg`` what is allowed; for unknown fields the allowed names are appended.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import typing
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic_settings import BaseSettings

from api.errors import field_path
from service.access import Forbidden, KeyNotFound, ProjectExists, ProjectNotFound
from service.repository import InvalidCursor, RunNotFound
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


def field_error(field: str, loc: list[Any], msg: str, value: Any) -> dict[str, Any]:
    return {"field": field, "loc": loc, "msg": msg, "input": value}


def validation_response(errors: list[dict[str, Any]]) -> JSONResponse:
    return JSONResponse(status_code=422, content={"detail": _jsonable(errors)})


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


def _schema_node(schema: dict[str, Any], loc: list[Any]) -> dict[str, Any] | None:
    """The schema object at pydantic location ``loc`` (which includes union tags)."""
    defs = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = defs.get(node["$ref"].rsplit("/", 1)[-1], {})
        return node

    def members(node: dict[str, Any]) -> list[dict[str, Any]]:
        found = node.get("oneOf") or node.get("anyOf")
        return [resolve(m) for m in found] if found else [node]

    node = resolve(schema)
    for segment in loc:
        candidates = [m for m in members(node) if m.get("type") != "null"]
        mapping = {}
        for candidate in [node, *candidates]:
            mapping.update(candidate.get("discriminator", {}).get("mapping", {}))
        if isinstance(segment, str) and segment in mapping:  # a union tag: pick that member
            node = resolve({"$ref": mapping[segment]})
            continue
        for candidate in candidates:
            if isinstance(segment, int) and "items" in candidate:
                node = resolve(candidate["items"])
                break
            if isinstance(segment, str) and segment in candidate.get("properties", {}):
                node = resolve(candidate["properties"][segment])
                break
        else:
            return None
    return node


def _allowed_fields(schema: dict[str, Any] | None, loc: list[Any]) -> list[str]:
    node = _schema_node(schema, loc) if schema else None
    if node is None:
        return []
    for member in [node, *(node.get("oneOf") or node.get("anyOf") or [])]:
        if "properties" in member:
            return list(member["properties"])
    return []


def _trim_loc(loc: list[Any], body: Any) -> list[Any]:
    """Drop what pydantic appends after a scalar value (union member labels such as 'int')."""
    node = body
    for index, segment in enumerate(loc):
        if isinstance(node, dict):
            if segment in node:
                node = node[segment]
            elif node.get("name") != segment:
                return loc  # a missing or unknown field: keep the rest as pydantic wrote it
        elif isinstance(node, list) and isinstance(segment, int) and 0 <= segment < len(node):
            node = node[segment]
        else:
            return loc[:index]
    return loc


# A message of a whole-object rule that starts with the path it is about:
# "scheduler.grace_period 2ep must ...", "search.params['optimizer.lr']: value ...".
_LEADING_PATH = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\['[^']*'\]|\[\d+\])+(?=[:\s])")
_PATH_PART = re.compile(r"\.?([A-Za-z_]\w*)|\['([^']*)'\]|\[(\d+)\]")


def _field_named_in(msg: str, body: Any) -> tuple[str, Any] | None:
    """(path, value) when a whole-object rule's message begins with a path into ``body``; the
    value is None for a field the body leaves out. None if the message names no such path."""
    match = _LEADING_PATH.match(msg)
    if match is None:
        return None
    parts = [(name or key, int(index) if index else None) for name, key, index in _PATH_PART.findall(match[0])]
    node = body
    for position, (key, index) in enumerate(parts):
        last = position == len(parts) - 1
        if index is not None and isinstance(node, list) and index < len(node):
            node = node[index]
        elif index is None and isinstance(node, dict) and (key in node or last):
            node = node.get(key)
        else:
            return None
    return match[0], node


def _format_one(error: dict[str, Any], body: Any, schema: dict[str, Any] | None) -> dict[str, Any]:
    loc = list(error.get("loc", ()))
    source, inner = (loc[0], loc[1:]) if loc and loc[0] in ("body", "query", "path", "header") else ("body", loc)
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    msg = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    value = error.get("input")
    if source == "body":
        field = field_path(_trim_loc(inner, body), body)
    else:
        field = ".".join(str(part) for part in inner)

    if kind == "value_error" and source == "body" and not inner and (named := _field_named_in(msg, body)):
        field, value = named  # a rule over the whole body that says which field it is about
    elif kind == "missing" or (kind == "value_error" and source == "body" and not inner and value == body):
        value = None  # pydantic echoes the enclosing object here, which is not the bad value
    elif kind == "json_invalid" and ctx.get("error"):
        msg = f"{msg}: {ctx['error']} at position {inner[0] if inner else '?'}; send a JSON object"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        # The problem is the discriminator field itself (`model.name`), and its value the tag.
        tag = str(ctx.get("discriminator", "'name'")).strip("'")
        field = f"{field}.{tag}" if field else tag
        value = ctx.get("tag", value.get(tag) if isinstance(value, dict) else value)
        if kind == "union_tag_not_found":
            node = _schema_node(schema, inner) if schema else None
            tags = list((node or {}).get("discriminator", {}).get("mapping", {}))
            if tags:
                msg = f"Field required: {tag!r} must be one of " + ", ".join(repr(t) for t in tags)
    elif kind == "extra_forbidden" and source == "body":
        allowed = _allowed_fields(schema, inner[:-1])
        if allowed:
            msg = f"{msg}; allowed fields here: {', '.join(allowed)}"
    return field_error(field, loc, msg, value)


def format_validation_errors(errors: list[dict[str, Any]], body: Any, schema: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Turn pydantic/FastAPI errors into our 422 items.

    A value refused by every member of a plain union (``int | "auto"``) gives one error per
    member; they become one item whose message lists the alternatives.
    """
    items: list[dict[str, Any]] = []
    for error in errors:
        item = _format_one(error, body, schema)
        same = next((i for i in items if item["field"] and i["field"] == item["field"]
                     and i["input"] == item["input"] and i["loc"][:-1] == item["loc"][:-1]), None)
        if same is not None:
            same["msg"] = f"{same['msg']}; or {item['msg']}"
        else:
            items.append(item)
    return items


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
                          (Forbidden, 403), (ProjectExists, 409), (IllegalTransition, 409)):
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
