"""Short garbage-collector pauses: the objects made while the service starts are frozen.

Everything made at startup (modules, the app and its routes, pydantic models, the database
engine) lives as long as the process, yet each full collection of the oldest generation walked
all of it: measured in ``bench/control_plane.py``'s tick phase, every tick that ran one took
about 110 ms instead of 25 (the tick's p99, and any request waiting on the GIL meanwhile).
``gc.freeze()`` moves what exists now into a permanent generation that collections skip (a
list splice: it costs nothing; startup's own garbage waits there until shutdown).
``gc.unfreeze()`` on the way out gives it all back, so a process that builds many apps (the
test suite) frees each one.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def startup_heap_frozen() -> Iterator[None]:
    """Freeze the heap as it is now until the block ends."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
