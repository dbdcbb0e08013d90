"""Entry points: ``uvicorn service.main:app`` or ``service.main.run(host, port)``.

``app`` is built on first access, so importing this module reads no settings and starts nothing.
"""

from __future__ import annotations

from typing import Any

from api.process_logging import configure_logging
from service.app import create_app
from service.settings import load_settings

_app = None


def __getattr__(name: str) -> Any:
    global _app
    if name == "app":
        if _app is None:
            _app = create_app()
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run(host: str | None = None, port: int | None = None, workers: int | None = None, *,
        log_level: str = "info") -> None:
    """Serve the API with uvicorn (blocking). ``host``/``port``/``workers`` override
    ``TESSERA_HOST``/``TESSERA_PORT``/``TESSERA_WORKERS``; above one worker, see ``service.processes``."""
    import uvicorn

    overrides = {key: value for key, value in (("host", host), ("port", port), ("workers", workers))
                 if value is not None}
    settings = load_settings(**overrides)
    configure_logging(log_level)
    if settings.workers > 1:
        from service.processes import serve_processes

        serve_processes(settings, overrides, log_level=log_level)
        return
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level)
