"""aiobotocore's HTTP session with a deadline on each request and a clear error for a body that
stalls; ``workers.s3_limits`` says why and sets the numbers. A module of its own because it
imports aiobotocore and aiohttp (about 0.15 s), which only S3 URLs need."""

from __future__ import annotations

import asyncio
from typing import Any

from aiobotocore.httpsession import AIOHTTPSession
from botocore.exceptions import ReadTimeoutError

from workers import s3_limits
from workers.s3_limits import S3AnswerStalledError, S3NoAnswerError


class DeadlineSession(AIOHTTPSession):
    """aiobotocore's HTTP session with a deadline on each request, body upload included, up to
    the response head; a streamed answer's body then stalls into ``S3AnswerStalledError``."""

    async def send(self, request: Any) -> Any:
        read_timeout = self._timeout.sock_read or s3_limits.S3_LIMITS.read_timeout_s
        size = int(request.headers.get("Content-Length") or 0)
        # The rate is read at send time, not at build time: fsspec caches file systems by their
        # options, and a class made per rate would print the same and share the cache entry.
        seconds = read_timeout + size / s3_limits.S3_LIMITS.min_upload_bytes_per_s
        try:
            response = await asyncio.wait_for(super().send(request), seconds)
        except asyncio.TimeoutError:
            raise S3NoAnswerError(endpoint_url=request.url, seconds=seconds,
                                  reason=f"request deadline, {size} bytes to send") from None
        except ReadTimeoutError as exc:  # s3fs would retry this one on top of botocore
            raise S3NoAnswerError(endpoint_url=request.url, seconds=read_timeout, reason="read timeout") from exc
        if request.stream_output:  # a GET's body, read after this returns (no deadline: it may be large)
            response.raw.content = _StallGuard(response.raw.content, url=request.url, seconds=read_timeout,
                                               expected=response.headers.get("content-length", "?"))
        return response


class _StallGuard:
    """aiohttp's ``StreamReader`` of a response body, whose ``read`` raises ``S3AnswerStalledError``
    where aiohttp's ``sock_read`` timer raised a bare ``asyncio.TimeoutError``. aiobotocore's
    ``AioStreamingBody`` reads through ``read`` alone; everything else goes to the reader."""

    def __init__(self, content: Any, *, url: str, seconds: float, expected: str):
        self._content, self._url, self._seconds, self._expected = content, url, seconds, expected

    async def read(self, n: int = -1) -> bytes:
        try:
            return await self._content.read(n)
        except asyncio.TimeoutError as exc:
            raise S3AnswerStalledError(endpoint_url=self._url, seconds=self._seconds, expected=self._expected,
                                       received=getattr(self._content, "total_bytes", "?")) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._content, name)
