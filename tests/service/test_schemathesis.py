"""Generated requests against the live service on PostgreSQL: never a 5xx, every 4xx says why.

Schemathesis reads the service's own OpenAPI (``/api/v1/openapi.json``) and generates requests
for every operation, valid ones (positive mode) and ones that break the schema (negative mode),
sent over real HTTP to a uvicorn server whose app runs on PostgreSQL (the database that refuses
NUL characters and integers beyond 64 bits). No route is left out: the worker and sweep-driver
report routes get a real run token / sweep token (and a real id) for half of their cases, so
generated bodies reach the code behind the token check instead of stopping at a 401.

``api_headers`` is the ``Authorization`` every user route gets: the test session's admin key.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from sqlalchemy import text

from service.app import create_app
from service.settings import Settings
from tests.conftest import ADMIN_HEADERS, free_port

from schemathesis.generation import GenerationMode

API = "/api/v1"


@schemathesis.serializer("application/zip")
def _zip_body(ctx, value) -> bytes:
    """``POST /code``'s body is raw bytes: a zip, or anything else the route must refuse with a 4xx."""
    return value if isinstance(value, bytes) else str(value).encode()

# Examples per operation and generation mode. Operations that take a body get the most: their
# bodies reach the validation and the code behind it (every 400/409/200 of the report routes and
# the runs/sweeps/projects/keys bodies). An operation whose only inputs are path, query and header
# parameters answers its whole range of statuses (200/401/404/422) within its first cases, so fewer
# suffice there (about half the test's time otherwise went to them).
EXAMPLES_PER_OPERATION_AND_MODE = 75
EXAMPLES_WITHOUT_BODY = 25
MIN_CASES = 2000
# The statuses the generated requests must reach between them: both successes, and every refusal
# the service gives (bad request, auth, missing, conflict, validation).
STATUSES_REACHED = {200, 201, 400, 401, 404, 409, 422}
# Headers that frame the HTTP message: negative mode may generate one (a ``Content-Length: 4`` on
# a request without a body), which desynchronizes the keep-alive connection, so the server fails
# to parse the *next* request ("Invalid HTTP request received.") — a broken client, not a finding.
FRAMING_HEADERS = {"content-length", "transfer-encoding", "host", "connection"}


@pytest.fixture
def api_headers() -> dict[str, str]:
    """Headers that authenticate a user route: the test session's admin key."""
    return dict(ADMIN_HEADERS)


@pytest.fixture
def live_service(tmp_path, fake_jobs, postgres_url, _postgres_engine):
    """A uvicorn server on a free port serving the app on the session's PostgreSQL (emptied
    first), with the fake Ray Jobs client and no dispatcher thread; yields (base URL, app)."""
    import uvicorn

    with _postgres_engine.begin() as conn:
        conn.execute(text("TRUNCATE metrics, run_events, runs, sweeps RESTART IDENTITY CASCADE"))
    port = free_port()
    settings_ = Settings(home=tmp_path / "home", database_url=postgres_url, port=port,
                         storage_url=f"file://{tmp_path}/storage")
    app = create_app(settings_, jobs=fake_jobs, run_dispatcher=False)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    started = threading.Event()

    original_startup = server.startup

    async def startup(sockets=None):
        await original_startup(sockets)
        started.set()

    server.startup = startup
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert started.wait(60), "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(30)


def _credentials(base: str, app, fake_jobs, example_body, api_headers) -> dict[str, str]:
    """A started run and its run token, an external sweep and its driver token."""
    run = httpx.post(f"{base}{API}/runs", json=example_body, headers=api_headers).json()
    app.state.dispatcher.tick()
    run_token = fake_jobs.jobs[f"run-{run['id']}-attempt-1"]["env"]["TESSERA_RUN_TOKEN"]
    sweep_body = {"name": "fuzz", "base": example_body,
                  "search": {"params": {"optimizer.lr": {"grid": [0.1, 0.2]}}}}
    sweep = httpx.post(f"{base}{API}/sweeps", params={"driver": "external"}, json=sweep_body,
                       headers=api_headers).json()
    return {"run_id": run["id"], "run_token": run_token, "sweep_id": sweep["id"], "sweep_token": sweep["driver_token"]}


def _authenticate(case, operation_path: str, creds: dict[str, str], api_headers, use_real: bool) -> dict[str, str]:
    """Headers for the case; for token routes with ``use_real``, the real id and its token."""
    headers = dict(api_headers)
    token_route = "/report/" in operation_path or "/trials" in operation_path
    if token_route and use_real:
        if operation_path.startswith(f"{API}/runs/"):
            case.path_parameters = {**(case.path_parameters or {}), "run_id": creds["run_id"]}
            headers["Authorization"] = f"Bearer {creds['run_token']}"
        else:
            case.path_parameters = {**(case.path_parameters or {}), "sweep_id": creds["sweep_id"]}
            headers["Authorization"] = f"Bearer {creds['sweep_token']}"
    return headers


def _problem(response: requests.Response) -> str | None:
    """Why this answer breaks the rules (a 5xx, or a 4xx without a ``detail``), else None."""
    if response.status_code >= 500:
        return f"{response.status_code}: {response.text[:500]}"
    if 400 <= response.status_code < 500 and response.request.method != "HEAD":  # HEAD answers carry no body
        try:
            detail = response.json().get("detail")
        except ValueError:
            return f"{response.status_code} without a JSON body: {response.text[:200]!r}"
        if not detail:
            return f"{response.status_code} without a detail: {response.text[:200]!r}"
    return None


def test_generated_requests_get_no_5xx_and_every_4xx_names_the_problem(live_service, fake_jobs, example_body,
                                                                        api_headers):
    base, app = live_service
    creds = _credentials(base, app, fake_jobs, example_body, api_headers)
    schema = schemathesis.openapi.from_url(f"{base}{API}/openapi.json", headers=dict(api_headers))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 23
    session = requests.Session()
    statuses: Counter[int] = Counter()
    per_operation: Counter[str] = Counter()
    failures: list[str] = []
    unbreakable: list[str] = []

    for operation in operations:
        examples = EXAMPLES_PER_OPERATION_AND_MODE if len(operation.body) else EXAMPLES_WITHOUT_BODY
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=examples, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck), derandomize=True)
            @given(case=operation.as_strategy(generation_mode=mode), use_real=st.booleans())
            def send(case: Any, use_real: bool) -> None:
                headers = _authenticate(case, operation.path, creds, api_headers, use_real)
                if case.headers:
                    case.headers = {k: v for k, v in case.headers.items() if k.lower() not in FRAMING_HEADERS}
                response = case.call(base_url=base, session=session, headers=headers, timeout=30)
                statuses[response.status_code] += 1
                per_operation[operation.label] += 1
                problem = _problem(response)
                if problem and len(failures) < 30:
                    failures.append(f"{case.method} {case.formatted_path} {case.query} "
                                    f"{str(case.body)[:300]!r} -> {problem}")

            try:
                send()
            except Unsatisfiable:
                # Negative mode on an operation with nothing to break (no parameters, no body).
                assert mode is GenerationMode.NEGATIVE, operation.label
                unbreakable.append(operation.label)

    total = sum(statuses.values())
    print(f"schemathesis: {total} cases over {len(per_operation)} operations; statuses "
          f"{dict(sorted(statuses.items()))}; no negative cases for {unbreakable}")
    assert not failures, "\n".join(failures)
    assert len(per_operation) == len(operations)
    assert total >= MIN_CASES
    assert STATUSES_REACHED <= set(statuses), sorted(statuses)
    assert not [code for code in statuses if code >= 500]
