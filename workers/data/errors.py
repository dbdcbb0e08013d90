"""``DataError``: data that cannot be read as the spec says, with the URL or key and what was expected."""

from __future__ import annotations

from typing import Any, Iterator


class DataError(ValueError):
    """Bad or missing data. The message names the shard, file or sample and what was expected,
    so the run fails with it (it pickles across DataLoader workers and Ray)."""

    def __reduce__(self):
        return (type(self), (str(self),))


def batches_failing_fast(loader: Any) -> Iterator[Any]:
    """Iterate a ``torch.utils.data.DataLoader``; when a worker's error surfaces, stop the worker
    processes at once. (torch's own shutdown after a worker exception waits 5 s per worker for
    workers that never exit, then terminates them: a bad shard would stall the run.)"""
    iterator = iter(loader)
    try:
        yield from iterator
    except Exception:
        for worker in getattr(iterator, "_workers", ()):
            if worker.is_alive():
                worker.terminate()
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        raise
