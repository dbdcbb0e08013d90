"""The API's interactive docs (Swagger UI) at ``/api/v1/docs``, from the dashboard's vendored copy.

FastAPI's own docs page loads Swagger UI from a CDN (cdn.jsdelivr.net): on a machine without
internet, as a lab's cluster often is, the page stayed blank. The same page is served here with
its script, stylesheet and icon under ``/static/vendor/`` (``service/dashboard/static/vendor/VENDOR.md``).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

VENDOR = "/static/vendor"


# The OpenAPI security scheme of the API: a user's key, or a run's or sweep driver's own token,
# as ``Authorization: Bearer ...`` (service/deps.py checks it). With it the docs page has an
# Authorize button, and "Try it out" sends the key. Required by every operation unless its route
# says otherwise with ``openapi_extra=OPEN`` (health, the catalog).
BEARER = {"bearer": {"type": "http", "scheme": "bearer",
                     "description": "an API key (tsk_...): $TESSERA_HOME/credentials holds the first one"}}
OPEN: dict = {"security": []}  # a route's openapi_extra: answered without a key


def document_bearer_auth(app: FastAPI) -> None:
    """Add the bearer scheme to ``app``'s OpenAPI document as the default of every operation.
    Done on the document, once, rather than by a FastAPI security dependency on each route,
    which every request would pay for in dependency solving."""
    build = app.openapi

    def openapi() -> dict:
        schema = build()  # FastAPI's, built once and kept in app.openapi_schema
        if "security" not in schema:
            schema.setdefault("components", {}).setdefault("securitySchemes", {}).update(BEARER)
            schema["security"] = [{"bearer": []}]
        return schema

    app.openapi = openapi


def mount_api_docs(app: FastAPI, path: str) -> None:
    """Serve Swagger UI for ``app.openapi_url`` at ``path`` (the app is built with ``docs_url=None``).
    The key entered with Authorize lives in the page only: Swagger UI's ``persistAuthorization``
    would keep it in localStorage, past the tab, where the dashboard keeps its key for the tab."""
    document_bearer_auth(app)

    @app.get(path, include_in_schema=False)
    def api_docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{app.title} API",
                                   swagger_js_url=f"{VENDOR}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{VENDOR}/swagger-ui.css",
                                   swagger_favicon_url=f"{VENDOR}/favicon-32x32.png")
