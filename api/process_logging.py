"""How Tessera's processes log: one line format, and no line per HTTP request from the client.

httpx logs every request it sends at INFO (``HTTP Request: POST ... "HTTP/1.1 200 OK"``): the
dispatcher's calls to Ray (a few a second) and a worker's metric reports (one a flush) buried
every other line of the service's console and of a run's log. Its loggers are set to WARNING;
a request that fails still shows, as its caller logs it.
"""

from __future__ import annotations

import logging

LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CHATTY_LOGGERS = ("httpx", "httpcore")  # a line per request at INFO, and per connection step at DEBUG


def quiet_http_clients() -> None:
    """Only warnings and errors from the HTTP client's loggers, unless the process logs at DEBUG
    (its root logger): then every request shows, as asked."""
    if logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
        return
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def configure_logging(level: str | int = logging.INFO) -> None:
    """A process's own logging (the service, a job's driver): ``LINE_FORMAT`` to stderr at
    ``level``, unless the root logger has a handler already, and quiet HTTP clients."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=level.upper() if isinstance(level, str) else level, format=LINE_FORMAT)
    quiet_http_clients()
