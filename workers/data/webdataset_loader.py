"""``WebDatasetLoader``: WebDataset tar shards streamed from local disk or ``s3://`` (fsspec/s3fs;
never downloaded whole), parsed by the ``webdataset`` package, decoded by DataLoader workers.

Sample order is a pure function of (seed, epoch, rank, world_size, loader worker):

1. the shard list (``urls``, brace-expanded) is permuted by a generator seeded with (seed, epoch);
2. rank r takes every ``world_size``-th shard from r; its worker w takes every
   ``active``-th of those from w (``active``: ``num_workers``, capped at the rank's shard count);
3. each worker streams its shards in that order through a shuffle buffer seeded with
   (seed, epoch, rank, worker) and batches ``batch_size // world_size`` samples itself; the
   DataLoader hands the batches out round-robin, so batch i of the epoch comes from worker
   ``i % active``;
4. every rank takes ``num_samples // batch_size`` steps per epoch. With equal shards whose
   count is a multiple of ``world_size x active`` (``tessera data pack`` writes equal ones)
   each sample is seen exactly once per epoch; otherwise a worker whose shards run short
   starts its shards again (padding, like ``TensorLoader``'s wrap-around) and surplus samples
   wait for the next epoch's order.

Position and resume: the state is ``(epoch, batch_in_epoch)`` in global batches, saved with
every checkpoint. A resumed loader rebuilds the same order and each worker skips the samples
of the batches already trained on (it reads them again but does not decode them), so with the
same world size and ``num_workers`` the run continues bitwise exactly. With another world size
or worker count the run continues at the same global batch and epoch, with the same number of
steps left in it, but the rest of that epoch follows the new split: some samples of that one
epoch may repeat or be missed. Later epochs are exact permutations again.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Iterator

import numpy as np
import torch
from botocore.exceptions import BotoCoreError
from braceexpand import braceexpand
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from webdataset.filters import _shuffle
from webdataset.tariterators import group_by_keys, tar_file_iterator

from workers.data.errors import DataError
from workers.data.loading import batches_failing_fast, private_generator, start_worker_server, worker_processes
from workers.data.position import BatchPosition, rank_batch_size
from workers.data.transforms import SampleTransform, collate, decode
from workers.s3_limits import bounded_fs

log = logging.getLogger(__name__)


def expand_urls(pattern: str) -> list[str]:
    """The shard URLs of a brace pattern such as ``s3://b/train-{000000..000019}.tar``."""
    return list(braceexpand(pattern))


def read_shard(url: str, *, image_key: str, label_key: str) -> Iterator[tuple[str, bytes, bytes]]:
    """``(key, image bytes, label bytes)`` of each sample in one tar shard, streamed."""
    try:
        fs, path = bounded_fs(url)  # a store that stops answering fails the read (workers.s3_limits)
        stream = fs.open(path, "rb")
    except Exception as exn:  # missing bucket or object, no access, a store that does not answer
        raise cannot_open(url, exn) from None
    count, tail = 0, _Tail(stream)
    try:
        files = ({**f, "__url__": url} for f in _complete_tar(tar_file_iterator(tail), tail, url))
        for sample in group_by_keys(files):
            key = sample["__key__"]
            if image_key not in sample or label_key not in sample:
                has = sorted(k for k in sample if not k.startswith("__"))
                missing = image_key if image_key not in sample else label_key
                raise DataError(f"shard {url!r}: sample {key!r} has no .{missing} file (it has "
                                f"{', '.join('.' + k for k in has) or 'nothing'}); expected .{image_key} and .{label_key} "
                                "in every sample")
            count += 1
            yield key, sample[image_key], sample[label_key]
    except DataError:
        raise
    except BotoCoreError as exn:  # the store's answer stalled or broke off (after its tries: workers.s3_limits)
        raise DataError(f"shard {url!r} could not be read to its end (after {count} samples, {tail.size} bytes): "
                        f"{type(exn).__name__}: {exn}") from None
    except Exception as exn:  # tarfile.ReadError, truncated stream, duplicate names
        raise DataError(f"shard {url!r} is not a readable WebDataset tar (after {count} samples): "
                        f"{type(exn).__name__}: {exn}") from None
    finally:
        stream.close()


class _Tail:
    """A read-only stream that remembers how many bytes it gave out and the last block of them."""

    def __init__(self, stream: Any):
        self.stream, self.size, self.last = stream, 0, b""

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.size += len(data)
        self.last = (self.last + data)[-512:]
        return data


def _complete_tar(files: Iterator[dict], tail: _Tail, url: str) -> Iterator[dict]:
    """Pass ``files`` through; at the end, fail if the tar was cut short. Python's tarfile stops
    silently at a truncated header, but a complete tar ends with zero blocks."""
    yield from files
    while tail.read(1 << 16):  # the end-of-archive padding tarfile did not need to read
        pass
    if tail.size % 512 or tail.last.strip(b"\0"):
        raise DataError(f"shard {url!r} is truncated: it ends after {tail.size} bytes inside a tar entry; expected "
                        "a complete tar file (ending with zero blocks)")


def parse_label(data: bytes, *, num_classes: int, where: str) -> int:
    try:
        label = int(data.decode().strip())
    except (UnicodeDecodeError, ValueError):
        label = -1
    if not 0 <= label < num_classes:
        raise DataError(f"{where}: label {data[:32]!r} is not an integer in [0, {num_classes}) "
                        "(data.*.num_classes)")
    return label


class _WorkerPlan:
    """What one loader worker of one rank reads in one epoch."""

    def __init__(self, shards: list[str], *, batches: int | None, skip_batches: int, seed: list[int]):
        self.shards, self.batches, self.skip_batches, self.seed = shards, batches, skip_batches, seed


class _ShardStream(IterableDataset):
    """Yields collated batches; inside DataLoader worker w it follows ``plans[w]``."""

    def __init__(self, spec: Any, plans: list[_WorkerPlan], *, per_rank_batch: int, train: bool, first_plan: int):
        self.spec, self.plans, self.per_rank_batch, self.train = spec, plans, per_rank_batch, train
        self.first_plan = first_plan
        self.transform = SampleTransform(spec.transforms, train=train)

    def _one_pass(self, plan: _WorkerPlan) -> Iterator[tuple[str, bytes, bytes]]:
        for url in plan.shards:
            for key, image, label in read_shard(url, image_key=self.spec.image_key, label_key=self.spec.label_key):
                yield f"{url}#{key}", image, label

    def _samples(self, plan: _WorkerPlan) -> Iterator[tuple[str, bytes, bytes]]:
        """The worker's shards through the shuffle buffer. Training: a worker whose shards run
        short starts them again (padding, like TensorLoader); each pass is shuffled on its own, so
        the padding never displaces a first-pass sample."""
        rng = random.Random(str(plan.seed))
        while True:
            count = 0
            samples: Iterator[Any] = self._one_pass(plan)
            if self.train and self.spec.shuffle_buffer > 1:
                samples = _shuffle(samples, bufsize=self.spec.shuffle_buffer, initial=self.spec.shuffle_buffer,
                                   rng=rng)
            for sample in samples:
                count += 1
                yield sample
            if not self.train:
                return
            if count == 0:
                raise DataError(f"shards {plan.shards} hold no samples; every rank and loader worker needs "
                                "samples (use more shards, or fewer workers)")

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        # The DataLoader asks its workers round-robin from worker 0, and batch i of the epoch
        # belongs to plan i % active: a loader resumed at batch b starts at plan b % active.
        plan = self.plans[((info.id if info is not None else 0) + self.first_plan) % len(self.plans)]
        samples = self._samples(plan)
        per, batch_index = self.per_rank_batch, 0
        while plan.batches is None or batch_index < plan.batches:
            chunk = [s for _, s in zip(range(per), samples)]
            if not chunk:
                return
            if batch_index >= plan.skip_batches:  # skipped batches are read, not decoded
                yield self._batch(chunk, plan, batch_index)
            batch_index += 1

    def _batch(self, chunk: list[tuple[str, bytes, bytes]], plan: _WorkerPlan, batch_index: int):
        images, labels = [], []
        for offset, (where, image, label) in enumerate(chunk):
            rng = np.random.default_rng([*plan.seed, batch_index, offset]) if self.train else None
            images.append(self.transform(decode(image, channels=self.spec.channels, where=f"sample {where!r}"), rng))
            labels.append(parse_label(label, num_classes=self.spec.num_classes, where=f"sample {where!r}"))
        return collate(images, labels, where=[f"sample {w!r}" for w, _, _ in chunk])


class WebDatasetLoader(BatchPosition):
    """Batches of ``batch_size // world_size`` for this rank, with ``TensorLoader``'s interface.

    ``train=False`` (evaluation): no shuffling, every sample of this rank's shards once, the
    last batch may be partial, and ranks may hold different numbers of batches."""

    def __init__(self, spec: Any, *, batch_size: int, rank: int = 0, world_size: int = 1, train: bool = True,
                 seed: int = 0, device: torch.device | str = "cpu"):
        self.per_rank_batch = rank_batch_size(batch_size, world_size)
        self.spec, self.train, self.seed = spec, train, seed
        self.shards = expand_urls(spec.urls)
        if len(self.shards) < world_size:
            raise DataError(f"data urls {spec.urls!r} expand to {len(self.shards)} shard(s) but {world_size} ranks "
                            "need at least one each; write more shards (tessera data pack --shard-size)")
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.active_workers = min(max(1, spec.num_workers), -(-len(self.shards) // world_size))
        self.in_channels, self.num_classes = spec.channels, spec.num_classes
        # Known only when the spec fixes it (crop, else resize); models then pick small-image stems.
        self.image_size = spec.transforms.crop or spec.transforms.resize if spec.transforms else None
        self.device = torch.device(device)
        BatchPosition.__init__(self)
        if train and len(self) == 0:
            raise DataError(f"num_samples {spec.num_samples} makes no full batch of {batch_size}; lower "
                            "data.batch_size or check num_samples")
        _check_readable(self.shards[rank])
        if spec.num_workers > 0:
            start_worker_server()

    def __len__(self) -> int:
        """Steps per epoch: ``num_samples // batch_size`` for training (every rank the same)."""
        if self.train:
            return self.spec.num_samples // self.batch_size
        return -(-self.spec.num_samples // self.batch_size)  # an estimate: ranks' shards may differ

    def _plans(self, epoch: int, skip: int) -> list[_WorkerPlan]:
        order = list(self.shards)
        if self.train:
            order = [order[i] for i in np.random.default_rng([self.seed, epoch]).permutation(len(order))]
        mine = order[self.rank::self.world_size]
        active = min(self.active_workers, len(mine))
        steps = len(self) if self.train else None
        return [_WorkerPlan(mine[w::active], batches=None if steps is None else len(range(w, steps, active)),
                            skip_batches=len(range(w, skip, active)), seed=[self.seed, epoch, self.rank, w])
                for w in range(active)]

    @property
    def exhausted(self) -> bool:
        return self.train and self.batch_in_epoch >= len(self)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.exhausted:
            return
        plans = self._plans(self.epoch, self.batch_in_epoch)
        dataset = _ShardStream(self.spec, plans, per_rank_batch=self.per_rank_batch, train=self.train,
                               first_plan=self.batch_in_epoch % len(plans))
        workers = len(plans) if self.spec.num_workers > 0 else 0
        loader = DataLoader(dataset, batch_size=None, pin_memory=self.device.type == "cuda",
                            generator=private_generator(self.seed, self.epoch), **worker_processes(workers))
        for images, labels in batches_failing_fast(loader):
            yield self.hand_out(images, labels)

    def state_dict(self) -> dict[str, Any]:
        """The position in global batches plus what the order depends on (to tell an exact resume
        from one on another world size or worker count)."""
        return {**super().state_dict(), "world_size": self.world_size,
                "loader_workers": self.active_workers, "num_shards": len(self.shards)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        saved = (state.get("world_size", self.world_size), state.get("loader_workers", self.active_workers))
        if self.batch_in_epoch and saved != (self.world_size, self.active_workers):
            log.warning("resuming mid-epoch %d on %d ranks x %d loader workers (saved on %d x %d): the rest of this "
                        "epoch follows the new split, so some of its samples may repeat or be missed",
                        self.epoch, self.world_size, self.active_workers, *saved)


def _check_readable(url: str) -> None:
    """Fail at start-up, not mid-epoch, when the first shard of this rank is not there."""
    try:
        fs, path = bounded_fs(url)
        fs.info(path)
    except Exception as exn:
        raise cannot_open(url, exn) from None


def cannot_open(url: str, exn: Exception) -> DataError:
    """The error of a shard that could not be opened, with what to check: the store when it gave
    no answer (botocore's errors: no answer in time, a refused or dropped connection; the URL may
    well be right), else the URL and its bucket."""
    check = ("the store did not answer; check that its endpoint is up and reachable" if isinstance(exn, BotoCoreError)
             else "expected an existing tar file (check data.*.urls and that the bucket exists)")
    return DataError(f"shard {url!r} cannot be opened: {type(exn).__name__}: {exn}; {check}")
