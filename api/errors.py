"""Errors the SDK raises; the service's error bodies have the same shape."""

from __future__ import annotations

from typing import Any

from api.validation_errors import echoed


class ApiError(Exception):
    """An HTTP error from the Tessera API: ``status_code`` (the HTTP status: 404 no such object
    in the key's projects, 409 its state refuses it, 422 invalid input, ...) and the body's
    ``detail``: a string, or for a 422 a list of ``{"field", "loc", "msg", "input"}`` items, one
    per field (``format_detail`` renders them, as ``str(error)`` does)."""

    def __init__(self, status_code: int, detail: Any):
        self.status_code = status_code
        self.detail = detail
        super().__init__(f"HTTP {status_code}: {format_detail(detail)}")


class InvalidInput(ValueError):
    """Input the SDK refuses before sending it: ``detail`` holds the same items as a 422's."""

    def __init__(self, detail: list[dict[str, Any]]):
        self.detail = detail
        super().__init__(format_detail(detail))


class ExportFailed(Exception):
    """The Ray job that was to export a checkpoint failed; the message holds its error."""


def format_detail(detail: Any) -> str:
    """Render a 422 detail list as one line per field: ``field: message (got value)``."""
    if isinstance(detail, list):
        lines = []
        for item in detail:
            if isinstance(item, dict):
                field = item.get("field") or ".".join(str(p) for p in item.get("loc", []))
                # None: mostly a field the body left out ("Field required", "data.eval is not set"),
                # where "(got None)" reads as if null had been sent; a null sent reads the same.
                got = f" (got {echoed(item['input'])!r})" if item.get("input") is not None else ""
                msg = str(item.get("msg"))
                # A message that starts with its field ("algorithms[0] 'alibi' needs ...") names it once.
                lines.append(f"{msg}{got}" if field and msg.startswith(field) else f"{field}: {msg}{got}")
            else:
                lines.append(str(item))
        return "\n".join(lines)
    return str(detail)
