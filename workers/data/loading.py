"""What the DataLoader-backed loaders (image_folder, your own data set, webdataset) need from torch's DataLoader:
worker processes that start clean, fail fast when a worker raises, and keep the trainer's global
RNG untouched."""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import multiprocessing.forkserver
import os
import select
import sys
import threading
import time
from typing import Any, Iterator

# Imported once by the fork server, so that a loader worker forked from it imports nothing to
# unpickle its dataset.
_PRELOADED = ["torch", "api.data_specs", "workers.data.image_folder", "workers.data.user_items",
              "workers.data.webdataset_loader"]
# multiprocessing runs the parent's main script again in every worker it starts this way (as
# ``__mp_main__``; its "__main__" preload is a no-op on Python 3.11: ``ensure_running`` keeps a
# ``main_path`` key that ``get_preparation_data`` no longer writes). That is cheap only if what
# the script imports is already imported: Ray's worker script imports ``ray``, the CLI ``cli.main``.
_MAIN_IMPORTS = ["ray", "cli.main"]


def worker_processes(num_workers: int) -> dict[str, Any]:
    """DataLoader keywords for ``num_workers`` loader processes, forked by a fork server.

    Not forked from the rank (torch's default on Linux): a training rank runs other threads
    (Ray's, the metric reporter, fsspec's IO loop, an async checkpoint write), and a child forked
    while one of them held a lock inherits it held, forever. Seen in the suite: a loader worker
    hung for good in its first S3 read, flushing a log file whose buffer lock another thread of
    the rank held at the fork; the rank waited on that worker and DDP's other rank on the rank.
    The fork server is a single-threaded process (fork + exec), so its children inherit no
    other thread's locks (``tests/workers/test_loader_processes.py`` holds such a lock and shows
    both). It is started once per process (``start_worker_server``) and imports what workers
    need once. What a worker does not inherit any more, it is given: the rank's environment as
    of this call, and a watch on the rank (a worker's parent is now the server, so torch's own
    check of its parent no longer sees the rank die). Two costs: a worker's dataset is pickled
    to it rather than inherited (so datasets stay small: shard plans, file lists), and its
    logging is not the rank's (warnings reach stderr, which Ray keeps in the worker's log)."""
    if num_workers <= 0:
        return {"num_workers": 0}
    return {"num_workers": num_workers, "multiprocessing_context": start_worker_server(), "prefetch_factor": 4,
            "worker_init_fn": functools.partial(_start_worker, os.getpid(), dict(os.environ))}


def start_worker_server_for(spec: Any) -> None:
    """Start the fork server now if ``spec``'s loaders read with worker processes (``num_workers``
    above 0 on an image folder, WebDataset shards or your own data set, for training or
    evaluation), before the rank imports the trainer and builds it: the server's own imports (torch,
    Ray, the data modules: seconds) then run beside those, not while the first epoch waits for
    them. A run whose loaders read in this process gets no server.

    That early is as safe as at the loaders' build: the server is a fresh interpreter, forked and
    exec'd at once (``multiprocessing.util.spawnv_passfds``), whatever other threads hold. From this
    moment it keeps only what its own imports read (the environment, ``sys.path``); a worker still
    gets the rank's environment (``worker_processes``), and its ``sys.path`` and working directory
    (``spawn.get_preparation_data``, sent with each worker: a user's code installed later is found)
    as of its epoch."""
    datasets = (spec.data.train, spec.data.eval)
    if any(getattr(dataset, "num_workers", 0) > 0 for dataset in datasets if dataset is not None):
        start_worker_server()


def start_worker_server() -> Any:
    """Start this process's fork server if it is not running (it imports in the background while
    the caller goes on: loaders call this when built, before their first epoch needs it; ranks
    earlier, ``start_worker_server_for``); return its multiprocessing context."""
    context = multiprocessing.get_context("forkserver")
    # The list is read when the server starts; later calls change nothing.
    context.set_forkserver_preload(_PRELOADED + [name for name in _MAIN_IMPORTS if name in sys.modules])
    multiprocessing.forkserver.ensure_running()
    return context


def _start_worker(rank_pid: int, environ: dict[str, str], worker_id: int) -> None:
    """In a loader worker, before it reads anything: the rank's environment, and a thread that
    ends the worker when the rank is gone (SIGKILLed, OOM-killed), so no worker, and then no
    fork server (it exits when its last child does), outlives its rank."""
    os.environ.clear()
    os.environ.update(environ)
    threading.Thread(target=_exit_with, args=(rank_pid,), name="tessera-rank-watch", daemon=True).start()


def _exit_with(rank_pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # raised once the rank is gone
        try:
            watch = os.pidfd_open(rank_pid)
        except ProcessLookupError:
            raise
        except OSError:  # no pidfd on this kernel: ask every second
            while True:
                os.kill(rank_pid, 0)
                time.sleep(1.0)
        select.select([watch], [], [])  # readable once the process has exited
    os._exit(1)


def batches_failing_fast(loader: Any) -> Iterator[Any]:
    """Iterate a ``torch.utils.data.DataLoader``; when a worker's error surfaces, stop the worker
    processes at once. (torch's own shutdown after a worker exception waits 5 s per worker for
    workers that never exit, then terminates them: a bad shard would stall the run.)"""
    iterator = iter(loader)
    try:
        yield from iterator
    except Exception:
        _kill_workers(iterator)
        raise


def _kill_workers(iterator: Any) -> None:
    """Kill a multi-process DataLoader iterator's workers, wait for them, then let torch release
    the rest (its queues).

    torch's shutdown sets the workers' done event, a ``multiprocessing.Event``, and every worker
    checks that event on each turn of its loop, holding the event's lock while it does. A worker
    killed at that moment leaves the lock held for good, and the ``set()`` then waits forever:
    the rank hung, and CI with it. Once the workers are dead nobody reads the event, so torch is
    handed a plain one to set (``tests/workers/test_loader_processes.py`` kills a worker holding
    the lock). A worker that dies by itself holding it (OOM-killed) still hangs torch's own
    liveness check, before any error reaches this function: that is torch's, not handled here.

    On CUDA a pin-memory thread reads the workers' results; it is stopped first, as torch does,
    while the workers are alive: a worker killed mid-message would leave it waiting for the rest."""
    from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL, signal_handling

    if not hasattr(iterator, "_workers"):  # num_workers=0: batches are made in this process
        return
    if hasattr(iterator, "_pin_memory_thread"):
        iterator._pin_memory_thread_done_event.set()
        iterator._worker_result_queue.put((None, None))  # wakes it if it waits for a result
        iterator._pin_memory_thread.join(timeout=MP_STATUS_CHECK_INTERVAL)
    if iterator._worker_pids_set:
        # torch's SIGCHLD handler would report the workers this kills ("killed by signal") in
        # place of the error being raised (where they are this process's children: fork).
        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False
    for worker in iterator._workers:
        if worker.is_alive():
            worker.kill()
    for worker in iterator._workers:
        worker.join(timeout=MP_STATUS_CHECK_INTERVAL)  # a worker in an uninterruptible read may outlive SIGKILL a while
    iterator._workers_done_event = threading.Event()
    iterator._shutdown_workers()


def private_generator(seed: int, epoch: int) -> Any:
    """A DataLoader's own generator. Without one, every ``iter(DataLoader)`` draws its workers'
    base seed from torch's global RNG, which the trainer checkpoints for augmentations (CutMix,
    dropout): a loader created at a resume point would shift that stream and break bitwise resume."""
    import torch

    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)
