"""Which process dispatches, when the API is served by several (``TESSERA_WORKERS`` > 1).

Every API process builds a ``Dispatcher``, but only one may hand runs to Ray and follow their
jobs: two would both admit the same queued runs against one quota. ``SoleLease`` is the lease of
a service in one process: always held. ``AdvisoryLease`` is PostgreSQL's: the process whose
dedicated connection holds a session-level advisory lock dispatches. The lock ends with that
connection, so when the leading process dies (or its connection does), another process takes
the lock on its next try, reconciles with Ray and dispatches from then on.

A write answered by a process that does not dispatch (a submit, a cancel) must still wake the
one that does, as ``service.dispatch_wake`` does within a process: the follower sends a
``NOTIFY`` on ``WAKE_CHANNEL`` and every process ``LISTEN``\\ s on its own connection. Only the
leader acts on it.

The lease's connections have TCP keepalives and a user timeout at both ends
(``CONNECTION_OPTIONS`` for libpq, ``SERVER_SETTINGS`` for the server's side of the session): a
leader cut off from the database notices within about 30 s, and the server ends the lost
session, and with it the lock, about as soon (its operating system's default would take hours). Until then the leader may dispatch beside its
successor; a tick's writes take row locks and Ray refuses a second job with the same submission
id, so no attempt is submitted twice. The session that holds the lock is named
``tessera dispatcher pid=N`` in ``pg_stat_activity``; the others ``tessera dispatch-lease pid=N``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy import Engine

log = logging.getLogger(__name__)

# pg_try_advisory_lock's key: any 64-bit number no other user of the database locks (locks are
# per database). This one is the bytes "tessera\x01".
LOCK_KEY = 0x7465737365726101
WAKE_CHANNEL = "tessera_dispatch"
LISTEN_POLL_S = 1.0  # how often the listening thread looks up from the socket to see if it must stop
# libpq options of the lease's own connections: bounded connects, and dead peers found in ~30 s.
CONNECTION_OPTIONS = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                      "keepalives_count": 3, "tcp_user_timeout": 30_000}
# The same on the server's side of each session (ordinary users may set these).
SERVER_SETTINGS = {"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3",
                   "tcp_user_timeout": "30000"}


class DispatchLease(Protocol):
    def held(self) -> bool:
        """Whether this process dispatches now; tries to take the lease when it does not."""

    def notify(self) -> None:
        """Wake the process that dispatches (called by one that does not)."""

    def listen(self, on_wake: Callable[[], None]) -> None:
        """Call ``on_wake`` (from another thread) whenever any process calls ``notify``."""

    def close(self) -> None:
        """Give the lease up and stop listening."""


class SoleLease:
    """The lease of a service served by one process: always held; nothing to notify."""

    def held(self) -> bool:
        return True

    def notify(self) -> None:
        """Nothing to do: the one process's wakes reach its own dispatcher directly."""

    def listen(self, on_wake: Callable[[], None]) -> None:
        """Nothing to do: no other process sends wakes."""

    def close(self) -> None:
        """Nothing to do: no lock and no connection are held."""


class AdvisoryLease:
    """A PostgreSQL session advisory lock on a connection of its own; see the module docstring.

    ``held`` and ``notify`` are called from the dispatcher's thread only; ``listen`` starts one
    daemon thread with a second connection.
    """

    def __init__(self, engine: Engine):
        if engine.dialect.name != "postgresql":
            raise ValueError(f"an advisory lease needs PostgreSQL, not {engine.dialect.name}")
        self.engine = engine
        self._conn: Any = None
        self._held = False
        self._error: str | None = None  # why the last try to reach the database failed; None: it did not
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None

    def _connect(self, role: str) -> Any:
        """A raw psycopg connection outside the pool (a pooled one would carry the lock off), in
        autocommit, named so that ``pg_stat_activity`` says which process holds what."""
        dialect = self.engine.dialect
        args, kwargs = dialect.create_connect_args(self.engine.url)
        conn = dialect.connect(*args, **{**CONNECTION_OPTIONS, **kwargs})
        conn.autocommit = True
        for name, value in SERVER_SETTINGS.items():
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        self._name(conn, role)
        return conn

    @staticmethod
    def _name(conn: Any, role: str) -> None:
        conn.execute("SELECT set_config('application_name', %s, false)", (f"tessera {role} pid={os.getpid()}",))

    def held(self) -> bool:
        try:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._drop()
                self._conn = self._connect("dispatch-lease")
            if self._held:
                self._conn.execute("SELECT 1")  # the lock lives exactly as long as this session
            elif self._conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()[0]:
                self._held = True
                self._name(self._conn, "dispatcher")
            self._error = None
        except Exception as exc:  # the database is away: whoever holds the lock now, it is not us
            if self._held:
                log.warning("lost the dispatch lease: %s", exc)
            elif self._error is None:  # once per outage, not every interval
                log.warning("cannot ask for the dispatch lease (this process will not dispatch until it can): %s",
                            exc)
            self._error = str(exc)
            self._drop()
        return self._held

    def notify(self) -> None:
        try:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._drop()
                self._conn = self._connect("dispatch-lease")
            self._conn.execute("SELECT pg_notify(%s, '')", (WAKE_CHANNEL,))
        except Exception as exc:  # the leader ticks on its interval anyway: a lost wake costs latency only
            log.warning("could not wake the dispatching process: %s", exc)
            self._drop()

    def listen(self, on_wake: Callable[[], None]) -> None:
        if self._listener is not None:
            return
        self._stop.clear()
        self._listener = threading.Thread(target=self._listen, args=(on_wake,), name="tessera-dispatch-wake",
                                          daemon=True)
        self._listener.start()

    def _listen(self, on_wake: Callable[[], None]) -> None:
        conn, failing = None, False
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = self._connect("dispatch-wake")
                    conn.execute(f"LISTEN {WAKE_CHANNEL}")
                    if failing:
                        log.info("dispatch wakes: listening again")
                    failing = False
                for _ in conn.notifies(timeout=LISTEN_POLL_S, stop_after=1):
                    on_wake()
            except Exception as exc:  # the database is away: try again after a pause
                if not failing:  # once per outage; the leader ticks on its interval meanwhile
                    log.warning("dispatch wakes: listening failed (%s); retrying every %.0f s", exc, LISTEN_POLL_S)
                failing = True
                if conn is not None:
                    conn.close()
                conn = None
                self._stop.wait(LISTEN_POLL_S)
        if conn is not None:
            conn.close()

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # a broken connection: the server ends the session
                if self._held and not self._conn.broken:  # at once: closing alone frees it when the server notices
                    self._conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
            with contextlib.suppress(Exception):
                self._conn.close()  # ends the session, and with it the lock
        self._conn, self._held = None, False

    def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.join(LISTEN_POLL_S * 3)
            self._listener = None
        self._drop()


def lease_for(engine: Engine, workers: int) -> DispatchLease:
    """The lease for a service served by ``workers`` processes on ``engine``'s database."""
    return AdvisoryLease(engine) if workers > 1 else SoleLease()
