"""One parse of a JSON request body: ``RequestLimits`` parses it to check its values, and the
routes take that parse instead of parsing the same bytes again.

A 1,000-point metric report is ~90 KB of JSON; parsing it twice with ``json.loads`` was about
a seventh of the service's CPU per report (py-spy, ``bench/service_ab.py --phase ingest``).

``parse_json`` tries pydantic-core's parser first (jiter: ~0.4 ms against ~1.2 ms for that
report). Where it succeeds it gives what ``json.loads`` gives: the same types and values,
floats bit for bit, arbitrarily large integers, NaN and Infinity, the last of duplicate keys
(checked over 30,000 generated numbers and the edge cases in ``tests/service/test_limits.py``).
Where it fails (invalid JSON, a lone surrogate escape it refuses, nesting past its 200 levels)
the body goes to ``json.loads``, so everything it refuses is answered exactly as before.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Coroutine

import pydantic_core
from fastapi import Request, Response
from fastapi.routing import APIRoute

PARSED = "tessera.parsed_json"  # the scope key under which RequestLimits leaves a body it parsed


def parse_json(body: bytes) -> Any:
    """``json.loads(body)``, faster where the body is plain JSON; raises what it raises."""
    try:
        return pydantic_core.from_json(body)
    except ValueError:
        return json.loads(body)


class ParsedBodyRoute(APIRoute):
    """A route whose JSON body is the one ``RequestLimits`` parsed: FastAPI reads a body through
    ``Request.json``, which parses only if the request has no ``_json`` yet (Starlette's own
    cache), so the handler sets it from the scope. The same request object goes on, so
    exception handlers and FastAPI see one request. Every router of the app is built with it
    (``tests/service/test_limits.py`` walks the app's routes; only the dashboard's page is not)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def with_parsed_body(request: Request) -> Response:
            if PARSED in request.scope:
                request._json = request.scope.pop(PARSED)  # held by the request alone from here
            return await handler(request)

        return with_parsed_body
