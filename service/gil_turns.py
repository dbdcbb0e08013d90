"""Short turns on the GIL while the service runs: threads whose database call answered wait less.

The service is one process of many threads: the event loop, the request threads of anyio's pool
(FastAPI runs each plain ``def`` route there) and the dispatcher. Most of their time is spent
waiting on PostgreSQL, with the GIL released. A thread whose query has answered must take the
GIL back, and while another thread computes (a tick planning 1,000 runs, a route encoding a
page) it waits until the holder is made to give it up: after ``sys.getswitchinterval()``, 5 ms
by default, once for every round trip. A submit makes about ten round trips.

At 1 ms, measured with ``bench/submit_ab.py`` (1,000 submits from 16 clients, 1,000 active
runs): about 1.2x the submits per second, and less CPU per submit, as fewer threads spin on the
GIL's condition variable. The interval is process-wide, so it is set for the app's lifetime and
put back after (a test process builds many apps).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

SWITCH_INTERVAL_S = 0.001


@contextmanager
def short_gil_turns(seconds: float = SWITCH_INTERVAL_S) -> Iterator[None]:
    """``sys.setswitchinterval(seconds)`` until the block ends, then the interval it replaced."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
