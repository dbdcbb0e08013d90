"""Loader worker processes start clean: forked by a fork server, never from the training rank,
whose other threads may hold locks at the moment of a fork (``workers.data.loading``)."""

from __future__ import annotations

import array
import fcntl
import logging
import multiprocessing
import os
import termios
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from api.data_specs import ImageFolderSpec, WebDatasetSpec
from tests.workers.data_helpers import write_indexed_folder
from workers.data.image_folder import ImageFolderLoader
from workers.data.loading import batches_failing_fast, worker_processes
from workers.data.pack import pack
from workers.data.webdataset_loader import WebDatasetLoader


class _Logs(IterableDataset):
    """What a library does in a loader worker (aiobotocore, finding credentials): log a line."""

    def __iter__(self):
        logging.getLogger("tessera.test.loader-worker").warning("a line from a loader worker")
        yield torch.ones(1)


@pytest.fixture
def log_stream_held_by_another_thread():
    """A logging handler whose stream's buffer lock a thread holds: it is blocked inside a write
    to a pipe nobody reads (the state a rank's log file is in while another thread writes it)."""
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w", buffering=1 << 20)
    handler = logging.StreamHandler(stream)
    logging.getLogger().addHandler(handler)
    writer = threading.Thread(target=lambda: (stream.write("x" * (4 << 20)), stream.flush()), daemon=True)
    writer.start()
    deadline = time.monotonic() + 30
    while _unread_bytes(read_end) < PIPE_CAPACITY:  # full: the writer is blocked inside the write
        assert time.monotonic() < deadline, "the writer thread never filled the pipe"
        time.sleep(0.01)
    yield
    logging.getLogger().removeHandler(handler)
    drain = threading.Thread(target=lambda: list(iter(lambda: os.read(read_end, 1 << 16), b"")))
    drain.start()
    writer.join(timeout=30)
    stream.close()
    drain.join(timeout=30)
    os.close(read_end)


PIPE_CAPACITY = 1 << 16  # Linux's default


def _unread_bytes(read_end: int) -> int:
    size = array.array("i", [0])
    fcntl.ioctl(read_end, termios.FIONREAD, size)
    return size[0]


def _first_batch(**processes) -> list:
    loader = DataLoader(_Logs(), batch_size=None, **processes)
    return [batch.tolist() for batch in batches_failing_fast(loader)]


def test_a_loader_worker_never_inherits_a_lock_another_thread_holds(log_stream_held_by_another_thread):
    # The trap is real: a worker forked from this multi-threaded process hangs on its first log line.
    with pytest.raises(RuntimeError, match="timed out"):
        _first_batch(num_workers=1, timeout=5)
    # A worker from the fork server does not.
    assert _first_batch(**worker_processes(1), timeout=60) == [[1.0]]


def _process_kinds(loader) -> set[str]:
    iterator = iter(loader)
    next(iterator)  # the workers are up while the epoch is open
    kinds = {type(p).__name__ for p in multiprocessing.active_children()}
    iterator.close()
    return kinds


def test_both_loaders_start_their_workers_from_the_fork_server(tmp_path):
    folder = write_indexed_folder(tmp_path / "images", 40)
    images = ImageFolderSpec.model_validate({"name": "image_folder", "root": str(folder), "channels": 1,
                                             "num_workers": 1})
    shards = pack(str(folder), str(tmp_path / "shards"), shard_size=20)
    stream = WebDatasetSpec.model_validate({"name": "webdataset", "urls": shards.urls, "num_samples": 40,
                                            "channels": 1, "num_classes": 4, "num_workers": 1})
    for loader in (ImageFolderLoader(images, batch_size=10), WebDatasetLoader(stream, batch_size=10)):
        assert _process_kinds(loader) == {"ForkServerProcess"}, type(loader).__name__
