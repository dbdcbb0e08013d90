"""A TCP proxy in front of a server (PostgreSQL, in the fault tests) that a test can take down
and bring back: ``down()`` cuts every open connection and refuses new ones, as a database that
crashed would; ``up()`` lets connections through again. The server itself is never touched
(other processes on the machine use it)."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    """Listens on 127.0.0.1 (``port``) and forwards each connection to ``target``."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._down = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept_loop, name="tcp-proxy", daemon=True).start()

    def down(self) -> None:
        """Cut every connection and refuse new ones until ``up``."""
        self._down.set()
        with self._lock:
            doomed, self._open = self._open, set()
        for sock in doomed:
            _close(sock)

    def up(self) -> None:
        self._down.clear()

    def close(self) -> None:
        self._closed = True
        self.down()
        _close(self._listener)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._down.is_set():
                _close(client)  # refused: the client sees the connection drop at once
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._open |= {client, server}
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            return  # either side closed: this direction is done (the finally below closes both)
        finally:
            for sock in (source, sink):
                with self._lock:
                    self._open.discard(sock)
                _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the peer
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
