"""The web dashboard: a static single-page app served by the control plane itself.

``mount_dashboard(app)`` serves ``static/index.html`` at ``/`` and the rest of ``static/``
(the app's ES modules, its CSS and the vendored libraries) under ``/static/``. The page talks
only to ``/api/v1``; there is no build step and no second server. Views live in
``static/js/`` (one module per page, routed by the URL's hash: ``#/runs``, ``#/runs/<id>``,
``#/algorithms``, ``#/submit``).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"

# Revalidate on every load (a cheap 304 with the ETag StaticFiles sends) so a browser never
# runs yesterday's JavaScript against today's API after an upgrade.
REVALIDATE = {"Cache-Control": "no-cache"}


class _RevalidatedStaticFiles(StaticFiles):
    def file_response(self, *args, **kwargs):
        response = super().file_response(*args, **kwargs)
        response.headers.update(REVALIDATE)
        return response


def mount_dashboard(app: FastAPI) -> None:
    """Serve the dashboard at ``/`` and its assets under ``/static/``."""
    index = STATIC_DIR / "index.html"

    @app.get("/", include_in_schema=False)
    def dashboard_index() -> FileResponse:
        return FileResponse(index, media_type="text/html", headers=REVALIDATE)

    app.mount("/static", _RevalidatedStaticFiles(directory=STATIC_DIR), name="dashboard-static")
