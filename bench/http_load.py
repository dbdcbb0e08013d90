"""A lean HTTP/1.1 client for the benches' rate phases: keep-alive connections over asyncio streams.

The load generator shares this machine's cores with the service and PostgreSQL. httpx costs
about 1.6 ms of CPU per request here (measured: 1,000 submits, 1.67 s of client CPU), about half
of what the service spends on a submit, so with it the bench measures its own client as much
as the service. This one formats the request bytes and reads the status line, the headers and a
``Content-Length`` body: 0.09 s of client CPU for the same 1,000 submits. It speaks only what the
service answers (no chunked bodies, no redirects); anything else raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import json


class LeanConnection:
    """One keep-alive connection; one request at a time."""

    def __init__(self, host: str, port: int, headers: dict[str, str]):
        self.host, self.port = host, port
        self.headers = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: object | None = None) -> tuple[int, bytes]:
        """Send one request (``body`` as JSON) and return its status and body."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        payload = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self.headers}"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n")
        self._writer.write(head.encode() + payload)
        try:
            return await self._response()
        except BaseException:
            await self.close()  # half read, or broken: the next request opens a new connection
            raise

    async def _response(self) -> tuple[int, bytes]:
        status_line = await self._reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        length, close = None, False
        while True:
            line = await self._reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
            elif name == b"transfer-encoding":
                raise ValueError("chunked responses are not supported by the lean client")
        body = await self._reader.readexactly(length or 0)
        if close:
            await self.close()
        return status, body

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):  # the server closed it first
                await self._writer.wait_closed()
        self._reader = self._writer = None
