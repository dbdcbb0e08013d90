"""Request limits applied before any route runs: body size, and values no column can hold.

``RequestLimits`` is a plain ASGI middleware, so it works on the byte stream: it refuses a body
whose ``Content-Length`` is over the limit without reading it, and otherwise reads at most
``limit + 1`` bytes (chunked bodies included) before it answers 413, so memory stays bounded by
the limit whatever a client sends. A body within the limit is replayed to the app unchanged.

It then refuses, with a 422 naming the field, NUL characters in the query string and integers
beyond 64 bits in JSON bodies (``api.limits``): PostgreSQL cannot store them, and a route should
never be the place that finds out. NUL characters in bodies and paths are the routes' business:
ids with one are simply unknown (404), and text a worker reports (an error message) is kept
with the NUL removed rather than refused, so a FAILED report is never lost.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.limits import INT64_MAX, INT64_MIN, MAX_DEPTH, db_value_problems, value_problem
from api.validation_errors import join_field
from service.json_body import PARSED, parse_json

MiB = 1024 * 1024
BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


class BodyTooLarge(Exception):
    """The request body passed its size limit while it streamed in (answered 413)."""


class RequestLimits:
    """ASGI middleware: ``max_body_bytes`` for every route, ``code_max_body_bytes`` for routes
    under ``code_prefix`` (user code packages are larger than specs)."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, code_max_body_bytes: int,
                 code_prefix: str = "/api/v1/code") -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.code_max_body_bytes = code_max_body_bytes
        self.code_prefix = code_prefix

    def _limit_for(self, path: str) -> tuple[int, str]:
        if path == self.code_prefix or path.startswith(self.code_prefix + "/"):
            return self.code_max_body_bytes, "TESSERA_CODE_MAX_BODY_BYTES"
        return self.max_body_bytes, "TESSERA_MAX_BODY_BYTES"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problems = _parameter_problems(scope)
        if problems:
            await _send_json(send, 422, {"detail": problems})
            return
        if scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        limit, setting = self._limit_for(scope["path"])
        too_large = {"detail": f"request body is larger than {limit} bytes, the limit for this route "
                               f"({setting}); send less"}
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _send_json(send, 413, too_large)
            return
        try:
            body = await _read_body(receive, limit)
        except BodyTooLarge:
            await _send_json(send, 413, too_large)
            return
        if _is_json(scope) and body:
            problems = _json_problems(scope, body)
            if problems:
                await _send_json(send, 422, {"detail": problems})
                return
        await self.app(scope, _replay(body, receive), send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return b"json" in value.lower()
    return False


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, or ``BodyTooLarge`` as soon as more than ``limit`` bytes have arrived."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect, as the server would say it

    return replayed


def _parameter_problems(scope: Scope) -> list[dict[str, Any]]:
    problems = []
    query = scope.get("query_string", b"").decode("latin-1")
    for name, value in parse_qsl(query, keep_blank_values=True):
        for text, what in ((name, "parameter name"), (value, "value")):
            problem = value_problem(text)
            if problem:
                problems.append({"field": name.replace("\x00", "\\x00"), "loc": ["query", name],
                                 "msg": f"query {what}: {problem}", "input": value})
    return problems


def _may_have_problems(data: Any, depth: int = 0) -> bool:
    """False only if the walk of ``api.limits.db_value_problems(data, text=False)`` would find
    nothing: no integer past 64 bits, nothing nested past ``MAX_DEPTH``. It looks at types and
    recurses into containers only, where the walk builds a path and a generator per value (its
    CPU was most of the check on a 1,000-point metric report); True sends the body to the walk,
    which says what is wrong."""
    if type(data) is dict:
        items: Any = data.values()  # keys are JSON strings: only text is checked in keys
    elif type(data) is list:
        items = data
    else:
        return type(data) is int and not INT64_MIN <= data <= INT64_MAX
    if depth + 1 > MAX_DEPTH and items:
        return True
    for item in items:
        kind = type(item)
        if kind is int:
            if not INT64_MIN <= item <= INT64_MAX:
                return True
        elif (kind is dict or kind is list) and _may_have_problems(item, depth + 1):
            return True
    return False


def _json_problems(scope: Scope, body: bytes) -> list[dict[str, Any]]:
    """What no column can hold in a JSON body. A body that parses is left in the scope for the
    route (``service.json_body``): it is parsed once."""
    try:
        data = parse_json(body)
    except RecursionError:
        return [{"field": "", "loc": ["body"], "msg": "JSON nested too deeply", "input": None}]
    except ValueError:
        return []  # not JSON: the route's own validation says so, with the position
    scope[PARSED] = data
    if not _may_have_problems(data):
        return []
    return [{"field": join_field(loc), "loc": ["body", *loc], "msg": msg, "input": value}
            for loc, msg, value in db_value_problems(data, text=False)][:20]


async def _send_json(send: Send, status: int, content: Any) -> None:
    body = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
