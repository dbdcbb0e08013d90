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


def mount_api_docs(app: FastAPI, path: str) -> None:
    """Serve Swagger UI for ``app.openapi_url`` at ``path`` (the app is built with ``docs_url=None``)."""

    @app.get(path, include_in_schema=False)
    def api_docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{app.title} API",
                                   swagger_js_url=f"{VENDOR}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{VENDOR}/swagger-ui.css",
                                   swagger_favicon_url=f"{VENDOR}/favicon-32x32.png")
