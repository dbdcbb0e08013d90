"""What an ASGI middleware learns from the response it passes on: its status and when it started."""

from __future__ import annotations

import time

from starlette.types import Message, Send


class ResponseStart:
    """Wraps an ASGI ``send``: passes every message on and notes the ``http.response.start``
    (``status`` None and ``at`` None until the app has sent it)."""

    def __init__(self, send: Send):
        self._send = send
        self.status: int | None = None
        self.at: float | None = None  # time.perf_counter() when the response started

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status, self.at = message["status"], time.perf_counter()
        await self._send(message)
