"""Wake the dispatcher when a request changed something it acts on.

The dispatcher ticks every ``dispatch_interval_s``; without this, a submitted run waited up to
one interval before it was handed to Ray, a cancel before its job was stopped, and a queued
run behind a run that just ended before it was admitted. After a successful write under the
API prefix (POST, PUT, PATCH or DELETE answered 2xx) the dispatcher's loop runs its next tick
at once. The workers' progress reports (metrics, checkpoints, notes: many per second, nothing
for the dispatcher to do) do not wake it; their status reports do (an ended run frees room).
"""

from __future__ import annotations

from typing import Any

from service.response_start import ResponseStart

READS = frozenset({"GET", "HEAD", "OPTIONS"})
PROGRESS_REPORTS = ("/report/metrics", "/report/checkpoint", "/report/note")


class WakeDispatcher:
    """ASGI middleware: ``app.state.dispatcher.wake()`` after each successful write."""

    def __init__(self, app: Any, *, prefix: str):
        self.app, self.prefix = app, prefix

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if (scope["type"] != "http" or scope["method"] in READS or not path.startswith(self.prefix)
                or any(marker in path for marker in PROGRESS_REPORTS)):
            await self.app(scope, receive, send)
            return
        response = ResponseStart(send)
        await self.app(scope, receive, response)
        dispatcher = getattr(scope["app"].state, "dispatcher", None) if "app" in scope else None
        if response.status is not None and 200 <= response.status < 300 and dispatcher is not None:
            dispatcher.wake()
