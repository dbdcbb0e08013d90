"""S3 endpoints that misbehave, on real sockets, for the bounded waits of ``workers.s3_limits``:
one that accepts connections and never answers, and one that answers a GET's head and then sends
its body slowly or stops. ``serve_as_s3`` makes one the S3 endpoint with limits shrunk through
``S3_LIMITS`` (the one place the production values come from), so each test costs seconds."""

from __future__ import annotations

import socket
import threading
from abc import ABC, abstractmethod
from contextlib import contextmanager, suppress
from dataclasses import replace
from typing import Iterator

from workers import s3_limits

LIMITS = replace(s3_limits.S3Limits(), connect_timeout_s=1.0, read_timeout_s=0.5, attempts=2)


class _Server(ABC):
    """Accepts TCP connections on loopback and hands each to ``serve`` on a thread of its own."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.connections: list[socket.socket] = []
        self.closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.connections.append(conn)
            thread = threading.Thread(target=self._serve_quietly, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve_quietly(self, conn: socket.socket) -> None:
        with suppress(OSError):  # the client gave up on the connection, or close() closed it
            self.serve(conn)

    @abstractmethod
    def serve(self, conn: socket.socket) -> None:
        """What this server does with one accepted connection, on a thread of its own."""

    def close(self) -> None:
        self.closed.set()
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (close alone does not, on Linux)
        self.sock.close()
        self._accepting.join()
        for conn in self.connections:
            conn.close()
        for thread in self._threads:
            thread.join()


class SilentServer(_Server):
    """Accepts TCP connections, counts them, reads nothing and answers nothing."""

    def serve(self, conn: socket.socket) -> None:
        self.closed.wait()  # the connection stays open, silent, until the server closes


class StallingServer(_Server):
    """Every key holds ``body``: a HEAD is answered at once; a GET (ranged or not) with its head
    and its first ``sent_before_stall`` bytes, then nothing ever (``sent_before_stall`` None: the
    whole body, in ``chunks`` pieces ``interval_s`` apart). ``gets`` counts the GETs."""

    def __init__(self, body: bytes, *, sent_before_stall: int | None = None, chunks: int = 8,
                 interval_s: float = 0.0) -> None:
        self.body, self.sent_before_stall, self.chunks, self.interval_s = body, sent_before_stall, chunks, interval_s
        self.gets = 0
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        buffer = b""
        while not self.closed.is_set():  # one request after another on a kept-alive connection
            while b"\r\n\r\n" not in buffer:
                data = conn.recv(1 << 16)
                if not data:
                    return
                buffer += data
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            method = lines[0].split(" ", 1)[0]
            headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
            answer = ["ETag: \"stalling\"", "Last-Modified: Wed, 01 Jan 2025 00:00:00 GMT"]
            if method != "GET":
                conn.sendall("\r\n".join(["HTTP/1.1 200 OK", f"Content-Length: {len(self.body)}", *answer, "", ""])
                             .encode())
                continue
            start, end, status = 0, len(self.body) - 1, "200 OK"
            if "range" in headers:
                first, last = headers["range"].removeprefix("bytes=").split("-")
                start, end, status = int(first), min(int(last or end), end), "206 Partial Content"
                answer.append(f"Content-Range: bytes {start}-{end}/{len(self.body)}")
            part = self.body[start:end + 1]
            conn.sendall("\r\n".join([f"HTTP/1.1 {status}", f"Content-Length: {len(part)}", *answer, "", ""]).encode())
            self.gets += 1
            if self.sent_before_stall is not None:
                conn.sendall(part[:self.sent_before_stall])
                self.closed.wait()  # the stall: until the test closes the server
                return
            step = -(-len(part) // self.chunks)
            for offset in range(0, len(part), step):
                conn.sendall(part[offset:offset + step])
                self.closed.wait(self.interval_s)  # the slow sender's pace, not a synchronisation


@contextmanager
def serve_as_s3(server: _Server, monkeypatch) -> Iterator[_Server]:
    """``server`` as the S3 endpoint, with ``LIMITS``. s3fs keeps a file system (and its client,
    which holds the endpoint) per set of options: cleared before and after."""
    from s3fs import S3FileSystem

    monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(s3_limits, "S3_LIMITS", LIMITS)
    S3FileSystem.clear_instance_cache()
    try:
        yield server
    finally:
        S3FileSystem.clear_instance_cache()
        server.close()


def request_bound_s(body_bytes: int = 0) -> float:
    """Most one request may take with ``LIMITS``: every attempt to its deadline, botocore's
    standard backoff before each retry (rand * 2 ** (attempt - 1) s), then a generous margin."""
    deadline = LIMITS.read_timeout_s + body_bytes / LIMITS.min_upload_bytes_per_s
    backoff = sum(2 ** i for i in range(LIMITS.attempts - 1))
    return LIMITS.attempts * deadline + backoff + 5.0
