"""Retrying calls to the service through its outages, for as long as a run is patient.

``TESSERA_REPORT_PATIENCE_S`` (default 30 minutes) is how long a worker keeps trying to reach
the service before its run fails, clearly, saying so: long enough to outlive a service restart
or a database failover, short enough that a service gone for good does not hold GPUs forever.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, TypeVar

import httpx

from api.errors import ApiError

log = logging.getLogger(__name__)
T = TypeVar("T")

PATIENCE_ENV = "TESSERA_REPORT_PATIENCE_S"
DEFAULT_PATIENCE_S = 1800.0


def report_patience_s() -> float:
    """``TESSERA_REPORT_PATIENCE_S`` or 30 minutes."""
    return float(os.environ.get(PATIENCE_ENV) or DEFAULT_PATIENCE_S)


def is_retryable(exc: BaseException) -> bool:
    """Connection problems and 5xx/429 answers are worth retrying; other 4xx answers are not."""
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, ApiError) and (exc.status_code >= 500 or exc.status_code == 429)


def call_with_retries(fn: Callable[[], T], *, what: str, budget_s: float | None = None,
                      first_delay_s: float = 0.5, max_delay_s: float = 10.0) -> T:
    """``fn()``, retried with exponential backoff on retryable errors for up to ``budget_s``
    (default: the report patience)."""
    deadline = time.monotonic() + (report_patience_s() if budget_s is None else budget_s)
    delay = first_delay_s
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_retryable(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("%s failed (%s: %s); retrying in %.1fs", what, type(exc).__name__, exc, delay)
            time.sleep(delay)
            delay = min(2 * delay, max_delay_s)
