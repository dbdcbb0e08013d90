"""Storage calls with a deadline: the service's own reads and writes of object storage (log
archive, code store, model exports) give up after ``settings.storage_timeout_s``.

fsspec's backends have no common timeout setting, so each call runs on a small shared pool and
the caller stops waiting at the deadline with ``StorageTimeout`` (HTTP 503; the dispatcher
logs it and tries again later). The call itself may go on in its thread until the backend
gives up; with the pool full, later calls wait in its queue and time out too, so a hung store
never blocks a request or the dispatcher for longer than the deadline.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_STORAGE_TIMEOUT_S = 60.0
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="tessera-storage")


class StorageTimeout(TimeoutError):
    """A storage call did not finish within its deadline; ``detail`` says which and how long."""

    def __init__(self, what: str, timeout_s: float):
        self.detail = (f"storage did not answer within {timeout_s:g}s ({what}); try again later "
                       f"(the service's limit is TESSERA_STORAGE_TIMEOUT_S)")
        super().__init__(self.detail)


def bounded(what: str, timeout_s: float, call: Callable[..., T], *args, **kwargs) -> T:
    """``call(*args, **kwargs)``, or ``StorageTimeout`` once ``timeout_s`` has passed."""
    future = _pool.submit(call, *args, **kwargs)
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        future.cancel()  # still queued behind hung calls: never run it
        raise StorageTimeout(what, timeout_s) from None
