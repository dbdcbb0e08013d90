"""How long a worker waits on S3 before a call fails, and the one layer that retries a request.

Without these a checkpoint save to an S3 endpoint that accepts connections and never answers
blocked the training loop for good (seen: no return after 8 minutes, and none after 200 s with
2 s timeouts). Found in the dependencies (s3fs 2026.9.0, aiobotocore 3.10.0, aiohttp 3.14.5,
botocore 1.43.117):

- botocore adds ``Expect: 100-continue`` to every PutObject/UploadPart with a file-like body,
  whatever its size (botocore/handlers.py:380-397). aiohttp then sends the headers and awaits
  the server's "100 Continue" with no timer running (aiohttp/client_reqrep.py:1578-1582): its
  ``sock_read`` timer starts only once the body is written (:1624), or at once for a request
  without a body (:1731). aiobotocore sets only ``sock_connect`` and ``sock_read``, no total
  (aiobotocore/httpsession.py:92-98). So ``read_timeout`` bounds a GET or HEAD, but a PUT to a
  silent endpoint waits forever; so does a large body once the server stops reading.
- Retries multiply: our ``with_retries`` (3 saves) x s3fs's ``_error_wrapper`` (``retries = 5``,
  a class attribute, s3fs/core.py:362, used at :161-178; retries ``HTTPClientError`` such as
  ``ReadTimeoutError`` but not botocore's ``ConnectionError``, :64-71) x botocore's own (legacy
  mode: 5 attempts). With s3fs's 15 s ``read_timeout`` a silent GET took 3 x 5 x 5 x 15 s.
  (botocore's ``retries={"max_attempts": n}`` counts retries, n + 1 attempts, botocore/args.py:612-620;
  ``total_max_attempts`` counts attempts, botocore/config.py:147-151.)

What is done instead: every request gets a deadline (``DeadlineSession``, aiobotocore's
``http_session_cls``, aiobotocore/config.py:47) of ``read_timeout_s`` plus the body's bytes at
``min_upload_bytes_per_s``. A request that misses it, or that times out reading, fails with
``S3NoAnswerError``, a botocore ``ConnectionError``: botocore's standard retry mode retries it
with backoff (botocore/retries/standard.py:492-495), like a refused or dropped connection or
throttling (``SlowDown``, :544) and 5xx, while s3fs passes it straight on (it is none of
s3fs's retryable errors), so for a silent store botocore's ``attempts`` are the only request
retries. Bounds with the defaults: one request fails within ``attempts`` x (15 s + body / 1 MiB/s)
plus up to 1 + 2 s of backoff (measured: 46 s for a small file). One try of a checkpoint save
fails at its first call that gets no answer (``FsspecStorage.isfile`` raises a storage error,
where fsspec's own ``isfile`` answered False and went on to the PUT: measured then, 95 s a try
and 4.8 minutes for the save's 3 tries, ``Checkpointer.attempts``); the save is then reported
"not committed" and training goes on. A body that stalls after its response began (a GET's stream)
is retried by s3fs (5 tries of 15 s without a byte), not by botocore.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiobotocore.httpsession import AIOHTTPSession
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import ReadTimeoutError


@dataclass(frozen=True)
class S3Limits:
    connect_timeout_s: float = 10.0
    # No byte from S3 for this long fails a request (aiohttp's sock_read); also the deadline of a
    # request without a body, and of waiting for "100 Continue".
    read_timeout_s: float = 15.0
    # A request's deadline grows with its body: S3 parts are up to 50 MiB (s3fs's block size),
    # which at this rate may take 50 s to send.
    min_upload_bytes_per_s: float = float(1 << 20)
    # Attempts per request, botocore's standard mode (throttling, 5xx, dropped connections, timeouts).
    attempts: int = 3


S3_LIMITS = S3Limits()


class S3NoAnswerError(BotoConnectionError):
    fmt = "No answer from {endpoint_url} within {seconds:.1f}s ({reason})"


class DeadlineSession(AIOHTTPSession):
    """aiobotocore's HTTP session with a deadline on each request, body upload included."""

    async def send(self, request: Any) -> Any:
        read_timeout = self._timeout.sock_read or S3_LIMITS.read_timeout_s
        size = int(request.headers.get("Content-Length") or 0)
        # The rate is read at send time, not at build time: fsspec caches file systems by their
        # options, and a class made per rate would print the same and share the cache entry.
        seconds = read_timeout + size / S3_LIMITS.min_upload_bytes_per_s
        try:
            return await asyncio.wait_for(super().send(request), seconds)
        except asyncio.TimeoutError:
            raise S3NoAnswerError(endpoint_url=request.url, seconds=seconds,
                                  reason=f"request deadline, {size} bytes to send") from None
        except ReadTimeoutError as exc:  # s3fs would retry this one on top of botocore
            raise S3NoAnswerError(endpoint_url=request.url, seconds=read_timeout, reason="read timeout") from exc


def s3fs_options(limits: S3Limits | None = None) -> dict[str, Any]:
    """``S3FileSystem`` keyword arguments for ``limits`` (default ``S3_LIMITS``)."""
    limits = limits or S3_LIMITS
    return {"config_kwargs": {"connect_timeout": limits.connect_timeout_s, "read_timeout": limits.read_timeout_s,
                              "retries": {"mode": "standard", "total_max_attempts": limits.attempts},
                              "http_session_cls": DeadlineSession}}
