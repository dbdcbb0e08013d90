"""What both DataLoader-backed loaders (image_folder, webdataset) need from torch's DataLoader:
worker processes that start clean, fail fast when a worker raises, and keep the trainer's global
RNG untouched."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
from typing import Any, Iterator

# Imported once by the fork server, so that a loader worker forked from it imports nothing to
# unpickle its dataset. "__main__": without it each worker would run the parent's main module
# again (multiprocessing's spawn semantics), under Ray an ``import ray`` per worker per epoch.
_PRELOADED = ["__main__", "torch", "api.data_specs", "workers.data.image_folder", "workers.data.webdataset_loader"]


def worker_processes(num_workers: int) -> dict[str, Any]:
    """DataLoader keywords for ``num_workers`` loader processes, forked by a fork server.

    Not forked from the rank (torch's default on Linux): a training rank runs other threads
    (Ray's, the metric reporter, fsspec's IO loop, an async checkpoint write), and a child forked
    while one of them held a lock inherits it held, forever. Seen in the suite: a loader worker
    hung for good in its first S3 read, flushing a log file whose buffer lock another thread of
    the rank held at the fork; the rank waited on that worker and DDP's other rank on the rank.
    The fork server is a single-threaded process (fork + exec), so its children inherit no
    other thread's locks; it is started once per process (``start_worker_server``) and its
    preloaded imports keep each worker's start as cheap as a plain fork's
    (``tests/workers/test_loader_processes.py``). The price: a worker's dataset is pickled to
    it rather than inherited, so datasets stay small (shard plans, file lists)."""
    if num_workers <= 0:
        return {"num_workers": 0}
    return {"num_workers": num_workers, "multiprocessing_context": start_worker_server(), "prefetch_factor": 4}


def start_worker_server() -> Any:
    """Start this process's fork server if it is not running (it imports in the background while
    the caller goes on: loaders call this when built, before their first epoch needs it); return
    its multiprocessing context."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOADED)  # no effect once the server runs: the list never changes
    multiprocessing.forkserver.ensure_running()
    return context


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


def private_generator(seed: int, epoch: int) -> Any:
    """A DataLoader's own generator. Without one, every ``iter(DataLoader)`` draws its workers'
    base seed from torch's global RNG, which the trainer checkpoints for augmentations (CutMix,
    dropout): a loader created at a resume point would shift that stream and break bitwise resume."""
    import torch

    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)
