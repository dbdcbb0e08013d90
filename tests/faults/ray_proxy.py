"""A small TCP proxy in front of an HTTP server (a Ray head's Jobs API) that can be made to
misbehave the ways a real outage does, switched while it runs:

* ``PASS``: bytes go both ways untouched.
* ``HANG``: connections are accepted and requests swallowed; nothing ever answers.
* ``ERROR_5XX``: every request is answered ``503`` at once and never reaches the server.
* ``LOSE_SUBMIT_ANSWERS``: a ``POST /api/jobs/`` reaches the server, but its answer is dropped
  and the connection reset: the server acted, the client cannot know.

It reads only the first line of each request, so it is for tests, not for production traffic.
"""

from __future__ import annotations

import enum
import socket
import struct
import threading

ANSWER_503 = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 28\r\n"
              b"Connection: close\r\n\r\nproxy: upstream unavailable\n")
SUBMIT_LINE = b"POST /api/jobs/ "


class Mode(enum.Enum):
    PASS = "pass"
    HANG = "hang"
    ERROR_5XX = "5xx"
    LOSE_SUBMIT_ANSWERS = "lose submit answers"


class RayProxy:
    """Listens on a free loopback port (``url``) and forwards to ``upstream_host:upstream_port``."""

    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.mode = Mode.PASS
        self.lost_submits = 0  # submits that reached the server and whose answers were dropped
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="ray-proxy", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream, timeout=30)
        except OSError:
            client.close()
            return
        server.settimeout(None)
        lose_answers = threading.Event()  # set once this connection carried a submit to drop
        threading.Thread(target=self._answers, args=(server, client, lose_answers), daemon=True).start()
        with client, server:
            while (chunk := _recv(client)) is not None:
                mode = self.mode
                if mode is Mode.HANG:
                    continue  # swallowed: the client waits until its own timeout
                if mode is Mode.ERROR_5XX:
                    client.sendall(ANSWER_503)
                    return
                if mode is Mode.LOSE_SUBMIT_ANSWERS and chunk.startswith(SUBMIT_LINE):
                    lose_answers.set()
                    self.lost_submits += 1
                server.sendall(chunk)

    def _answers(self, server: socket.socket, client: socket.socket, lose: threading.Event) -> None:
        while (chunk := _recv(server)) is not None:
            if lose.is_set():  # the server acted; reset the client instead of answering
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
                client.close()
                return
            if self.mode is Mode.HANG:
                continue
            try:
                client.sendall(chunk)
            except OSError:
                return


def _recv(sock: socket.socket) -> bytes | None:
    try:
        chunk = sock.recv(65536)
    except OSError:
        return None
    return chunk or None
