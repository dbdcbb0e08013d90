"""Loader worker processes start clean: forked by a fork server, never from the training rank,
whose other threads may hold locks at the moment of a fork (``workers.data.loading``)."""

from __future__ import annotations

import array
import fcntl
import inspect
import json
import logging
import multiprocessing
import os
import subprocess
import sys
import termios
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from api.data_specs import ImageFolderSpec, WebDatasetSpec
from tests.local_ray import REPO_ROOT
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
    drain = threading.Thread(target=lambda: list(iter(lambda: os.read(read_end, 1 << 16), b"")), daemon=True)
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


class _Environment(IterableDataset):
    def __iter__(self):
        yield os.environ.get("TESSERA_TEST_LOADER_ENV", "unset")


def test_a_loader_worker_sees_the_environment_of_its_rank_not_of_its_server(monkeypatch):
    worker_processes(1)  # the server is up (or was already) before the variable is set
    monkeypatch.setenv("TESSERA_TEST_LOADER_ENV", "set after the server started")
    loader = DataLoader(_Environment(), batch_size=None, **worker_processes(1))
    assert list(batches_failing_fast(loader)) == ["set after the server started"]


class _FailsHoldingTheDoneEventLock(IterableDataset):
    """A worker that raises while it holds the lock of its loader's done event. Any worker may be
    holding it at any moment (it checks the event on each turn of its loop); this one is caught
    there every time, as one in CI was by chance when its rank killed it."""

    def __iter__(self):
        frame = inspect.currentframe()
        while frame.f_code.co_name != "_worker_loop":
            frame = frame.f_back
        frame.f_locals["done_event"]._cond.acquire()
        raise ValueError("a bad sample")
        yield


@pytest.mark.timeout(60)
def test_a_worker_killed_while_holding_a_shared_lock_does_not_hang_its_rank():
    loader = DataLoader(_FailsHoldingTheDoneEventLock(), batch_size=None, **worker_processes(1))
    with pytest.raises(ValueError, match="a bad sample"):
        list(batches_failing_fast(loader))


# A rank that builds a loader with workers, takes one batch and waits to be killed.
RANK = """
import multiprocessing, multiprocessing.forkserver, sys, time
from api.data_specs import ImageFolderSpec
from workers.data.image_folder import ImageFolderLoader
spec = ImageFolderSpec.model_validate({"name": "image_folder", "root": sys.argv[1], "channels": 1, "num_workers": 2})
batches = iter(ImageFolderLoader(spec, batch_size=4))
next(batches)
pids = [p.pid for p in multiprocessing.active_children()] + [multiprocessing.forkserver._forkserver._forkserver_pid]
print(*pids, flush=True)
time.sleep(600)
"""


def test_a_killed_rank_leaves_no_loader_worker_or_fork_server_behind(tmp_path):
    import psutil

    folder = write_indexed_folder(tmp_path / "images", 16)
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(folder)], stdout=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT)
    try:
        pids = [int(pid) for pid in rank.stdout.readline().split()]
        assert len(pids) == 3, pids  # two workers and their server
    finally:
        rank.kill()
        rank.wait()

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still running 30 s after their rank was killed: {pids}"
        time.sleep(0.1)


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


# A rank (``train_rank``, or ``tessera train``'s ``workers.local.train``) stopped where it builds
# its trainer, and so its loaders, for each spec given: whether this process's fork server had
# been started by then. A fresh process: a server, once started, runs until its process ends.
STARTED_BY_BUILD = """
import json, multiprocessing.forkserver, sys, torch
import workers.trainer
from api.specs import RunSpec
from workers.local import train
from workers.ray_train import train_rank, worker_config

class Built(Exception):
    'Raised where the trainer would be built: its one argument says whether the server ran by then.'

def stop_at_build(*args, **kwargs):
    raise Built(multiprocessing.forkserver._forkserver._forkserver_pid is not None)

workers.trainer.Trainer = workers.trainer.train = stop_at_build
for spec in json.loads(sys.argv[2]):
    spec = RunSpec.model_validate(spec)
    try:
        if sys.argv[1] == "train_rank":
            train_rank(worker_config(spec, run_id="r"), rank=1, world_size=2,
                       device_for=lambda gpu: torch.device("cpu"), on_eval=None, entered=0.0)
        else:
            train(spec)
    except Built as built:
        print(built.args[0], flush=True)
"""


def _run_spec(train: dict, evaluation: dict | None = None) -> dict:
    return {"name": "early", "model": {"name": "simple_cnn"}, "max_duration": "1ba",
            "optimizer": {"name": "sgd", "lr": 0.1}, "data": {"train": train, "eval": evaluation, "batch_size": 4}}


@pytest.mark.parametrize("path", ["train_rank", "local_train"])
def test_a_rank_starts_its_fork_server_before_it_builds_loaders_that_use_worker_processes(tmp_path, path):
    folder = {"name": "image_folder", "root": str(tmp_path / "images"), "channels": 1}
    specs = [_run_spec({"name": "synthetic", "num_samples": 64, "image_size": 8}),  # batches sliced in this process
             _run_spec({**folder, "num_workers": 0}),  # read in this process
             _run_spec({**folder, "num_workers": 2})]
    rank = subprocess.run([sys.executable, "-c", STARTED_BY_BUILD, path, json.dumps(specs)], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=300)
    assert rank.stdout.split() == ["False", "False", "True"], rank.stderr[-3000:]


def test_a_run_whose_evaluation_alone_uses_worker_processes_starts_the_fork_server(monkeypatch, tmp_path):
    from api.specs import RunSpec
    from workers.data import loading

    started = []
    monkeypatch.setattr(loading, "start_worker_server", lambda: started.append(True))
    folder = {"name": "image_folder", "root": str(tmp_path / "images"), "channels": 1}
    loading.start_worker_server_for(RunSpec.model_validate(_run_spec({**folder, "num_workers": 0})))
    assert started == []
    loading.start_worker_server_for(RunSpec.model_validate(_run_spec({**folder, "num_workers": 0},
                                                                     {**folder, "num_workers": 1})))
    assert started == [True]
