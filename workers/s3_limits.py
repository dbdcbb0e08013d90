"""How long a worker waits on S3 before a call fails, and how often a call is tried: the options
every worker-side file system is built with (``storage_options``, ``bounded_fs``), whether it
holds checkpoints, data shards, images or code packages.

Without these a checkpoint save to an S3 endpoint that accepts connections and never answers
blocked the training loop for good (seen: no return after 8 minutes, and none after 200 s with
2 s timeouts); a data loader or a code-package fetch built its file system without them as well.
Found in the dependencies (s3fs 2026.9.0, aiobotocore 3.10.0, aiohttp 3.14.5, botocore 1.43.117,
fsspec 2026.9.0):

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
- A GET's body is not part of the request that botocore sends and retries: for an operation with
  a streaming answer (GetObject) ``request.stream_output`` is set (botocore/endpoint.py:124-129),
  aiobotocore's ``send`` returns at the response head (aiobotocore/httpsession.py:333-338) and
  the body is read later through ``AioStreamingBody`` (aiobotocore/endpoint.py:56-63), each read
  bounded only by ``sock_read``, restarted on every chunk received (aiohttp/client_proto.py:287-297,
  :310-326). A body that stops arriving raises ``AioReadTimeoutError`` (aiobotocore/response.py:
  137-151), which s3fs retries by sending the whole GET again: ``_cat_file`` (s3fs/core.py:
  1314-1360) and a streamed file's ``_inner_fetch`` (:2893-2919) wrap request and body read in
  ``_error_wrapper`` with ``retries``. Measured before, against a server that sends a head and
  700 bytes and then nothing (as ``StallingServer`` in tests/workers/s3_endpoints.py does): 5 GETs,
  77 s with the defaults below, and then for ``cat_file`` (a code package) a bare ``FSTimeoutError`` with no message
  (fsspec turns any ``asyncio.TimeoutError`` into one, fsspec/asyn.py:102-104), for a streamed
  file (a WebDataset shard) ``IndexError: tuple index out of range`` (that ``FSTimeoutError`` is
  an ``OSError`` on Python 3.11, and s3fs reads ``ex.args[0]`` of it, s3fs/core.py:2727-2728),
  which the loader reported as "not a readable WebDataset tar".

What is done instead: every request gets a deadline (``workers.s3_deadline.DeadlineSession``,
aiobotocore's ``http_session_cls``, aiobotocore/config.py:47) of ``read_timeout_s`` plus the
body's bytes at ``min_upload_bytes_per_s``. A request that misses it, or that times out reading,
fails with ``S3NoAnswerError``, a botocore ``ConnectionError``: botocore's standard retry mode
retries it with backoff (botocore/retries/standard.py:492-495), like a refused or dropped
connection or throttling (``SlowDown``, :544) and 5xx, while s3fs passes it straight on (it is
none of s3fs's retryable errors), so for a silent store botocore's ``attempts`` are the only
request retries. Bounds with the defaults: one request fails within ``attempts`` x (15 s + body
/ 1 MiB/s) plus up to 1 + 2 s of backoff (measured: 46 s for a small file). One try of a
checkpoint save fails at its first call that gets no answer (``FsspecStorage.isfile`` raises a
storage error, where fsspec's own ``isfile`` answered False and went on to the PUT: measured
then, 95 s a try and 4.8 minutes for the save's 3 tries, ``Checkpointer.attempts``); the save is
then reported "not committed" and training goes on.

The deadline ends at the response head, so it never cuts a long download short: a body streams
for as long as bytes keep coming. A body that stalls for ``read_timeout_s`` fails with
``S3AnswerStalledError`` (an ``HTTPClientError``, not a timeout, so neither fsspec nor s3fs
garbles it); s3fs sends the GET again, and ``bounded_fs`` sets s3fs's ``retries`` on the file
system to ``attempts``, so a GET whose answer stalls each time is sent ``attempts`` times, not 5
(measured with the defaults: 3 GETs, 46 s, and the error names the endpoint and the bytes read).
No option can do that: s3fs's ``__init__`` takes no ``retries`` and hands unknown options to
aiobotocore's ``AioSession`` (s3fs/core.py:410, :665), and fsspec picks the file system's class
by protocol alone. s3fs uses the same ``retries`` around the requests themselves (:466-467), where
it now multiplies botocore's attempts only for errors that fail at once (a connection closed
while sending, throttling that outlasted botocore's backoff), never for a wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import HTTPClientError
from fsspec.core import url_to_fs


@dataclass(frozen=True)
class S3Limits:
    connect_timeout_s: float = 10.0
    # No byte from S3 for this long fails a request (aiohttp's sock_read), or a body being read;
    # also the deadline of a request without a body, and of waiting for "100 Continue".
    read_timeout_s: float = 15.0
    # A request's deadline grows with its body: S3 parts are up to 50 MiB (s3fs's block size),
    # which at this rate may take 50 s to send.
    min_upload_bytes_per_s: float = float(1 << 20)
    # Attempts per request, botocore's standard mode (throttling, 5xx, dropped connections, timeouts);
    # also how often s3fs sends a GET whose answer stalled (``bounded_fs``).
    attempts: int = 3


S3_LIMITS = S3Limits()


class S3NoAnswerError(BotoConnectionError):
    fmt = "No answer from {endpoint_url} within {seconds:.1f}s ({reason})"


class S3AnswerStalledError(HTTPClientError):
    """A GET's body stopped arriving. An ``HTTPClientError`` so that s3fs sends the GET again
    (``bounded_fs`` bounds how often); not a ``TimeoutError``, which fsspec replaces by an
    ``FSTimeoutError`` without a message and s3fs then fails to read."""

    fmt = "The answer from {endpoint_url} stalled: no byte for {seconds:.1f}s after {received} of {expected} bytes"


def s3fs_options() -> dict[str, Any]:
    """``S3FileSystem`` keyword arguments for ``S3_LIMITS`` (read now: tests shrink them)."""
    from workers.s3_deadline import DeadlineSession  # imports aiobotocore (aiohttp): only for s3 URLs

    limits = S3_LIMITS
    return {"config_kwargs": {"connect_timeout": limits.connect_timeout_s, "read_timeout": limits.read_timeout_s,
                              "retries": {"mode": "standard", "total_max_attempts": limits.attempts},
                              "http_session_cls": DeadlineSession}}


def storage_options(url: str) -> dict[str, Any]:
    """The fsspec options every worker-side file system of ``url`` is built with: for ``s3://``,
    the bounds above, so that a store that stops answering fails a call in bounded time rather than
    hanging a worker. fsspec caches a file system per set of options, so changing ``S3_LIMITS``
    (tests do) takes effect for file systems built afterwards. Pass the file system it builds to
    ``bound_retries`` (or use ``bounded_fs``)."""
    if not str(url).startswith(("s3://", "s3a://")):
        return {}
    return s3fs_options()


def bound_retries(fs: Any) -> Any:
    """``fs``; an S3 file system built with ``storage_options`` sends a GET whose answer stalled at
    most its botocore attempts times, instead of s3fs's ``retries = 5`` (a class attribute that no
    option sets). fsspec shares one file system among all who build it with the same options in a
    process, all of them ours, so setting it on the instance changes no one else's. (For an async
    file system such as s3fs its cache key leaves the thread out, fsspec/spec.py:102-107, so an
    asynchronous save's writer, built on a thread of its own, gets the same instance too.)"""
    retries = getattr(fs, "config_kwargs", {}).get("retries")
    if isinstance(retries, dict) and "total_max_attempts" in retries:
        fs.retries = retries["total_max_attempts"]
    return fs


def bounded_fs(url: str) -> tuple[Any, str]:
    """fsspec's ``url_to_fs(url)`` with ``storage_options`` and ``bound_retries``: the file system
    and the path within it."""
    fs, path = url_to_fs(url, **storage_options(url))
    return bound_retries(fs), path
