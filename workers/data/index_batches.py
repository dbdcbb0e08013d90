"""``IndexBatchLoader``: batches of a map-style data set read by index, the mechanism of the
image_folder loader and of your own data set (``workers.data.user_data``).

Order: the same per-epoch permutation and rank striding as ``TensorLoader`` (seeded by
``seed + epoch``, ``epoch_shard``); the data set is asked for ``(index, epoch)``, so a random
per-sample transform can seed itself from both. The batches are a pure function of (seed, epoch,
rank, world_size), not of the number of loader workers, and resuming at ``batch_in_epoch`` skips
exactly the batches already trained on, without reading them. With another world size a resumed
run continues at the same global batch of the epoch; the rest of that epoch is the new world
size's striding of the same permutation (so a few samples may repeat or be missed in that one
epoch), and later epochs are exact. With ``num_workers`` > 0 the items are read by DataLoader
worker processes forked by the fork server (``workers.data.loading``), the data set pickled to them.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from workers.data.loading import batches_failing_fast, private_generator, start_worker_server, worker_processes
from workers.data.position import BatchPosition, rank_batch_size


def epoch_shard(n: int, *, epoch: int, seed: int, rank: int, world_size: int, batch_size: int, shuffle: bool,
                drop_last: bool, pad: bool) -> list[int]:
    """This rank's indices for ``epoch``: ``TensorLoader``'s permutation, truncation/padding and striding."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)) if shuffle else torch.arange(n)
    if drop_last:
        length = n // batch_size * batch_size
    else:
        length = math.ceil(n / world_size) * world_size if pad else n
    if length > n:
        order = torch.cat([order, order[: length - n]])
    return order[:length][rank::world_size].tolist()


class IndexBatchLoader(BatchPosition):
    """Batches of ``batch_size // world_size`` items of ``dataset`` for this rank, with
    ``TensorLoader``'s interface. ``dataset[(index, epoch)]`` is one item; ``collate`` stacks a
    list of them into ``(inputs, labels)``. Training shuffles and pads the last global batch;
    evaluation (``train=False``) reads each item once across ranks, keeping the last partial batch.
    Subclasses set ``num_classes`` and ``in_channels`` (and ``image_size`` where known)."""

    def __init__(self, dataset: Dataset, *, collate: Callable[[list[Any]], tuple[torch.Tensor, torch.Tensor]],
                 batch_size: int, rank: int = 0, world_size: int = 1, train: bool = True, drop_last: bool = True,
                 seed: int = 0, device: torch.device | str = "cpu", num_workers: int = 0):
        self.per_rank_batch = rank_batch_size(batch_size, world_size)
        self.dataset, self.collate, self.num_workers = dataset, collate, num_workers
        if self.num_workers > 0:
            start_worker_server()  # imports in the background until the first epoch needs it
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.train, self.drop_last, self.seed = train, drop_last if train else False, seed
        self.device = torch.device(device)
        BatchPosition.__init__(self)
        self._length: int | None = None

    def _indices(self, epoch: int) -> list[int]:
        return epoch_shard(len(self.dataset), epoch=epoch, seed=self.seed, rank=self.rank,
                           world_size=self.world_size, batch_size=self.batch_size, shuffle=self.train,
                           drop_last=self.drop_last, pad=self.train)

    def __len__(self) -> int:
        if self._length is None:  # the same every epoch; `exhausted` asks after every batch
            shard = len(self._indices(0))
            self._length = shard // self.per_rank_batch if self.drop_last else math.ceil(shard / self.per_rank_batch)
        return self._length

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        indices, per = self._indices(self.epoch), self.per_rank_batch
        batches = [[(i, self.epoch) for i in indices[start:start + per]]
                   for start in range(self.batch_in_epoch * per, len(self) * per, per)]
        batches = [b for b in batches if b]
        if not batches:
            return
        loader = DataLoader(self.dataset, batch_sampler=batches, collate_fn=self.collate,
                            pin_memory=self.device.type == "cuda", generator=private_generator(self.seed, self.epoch),
                            **worker_processes(self.num_workers))
        for inputs, labels in batches_failing_fast(loader):
            yield self.hand_out(inputs, labels)
