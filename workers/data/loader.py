"""``TensorLoader``: batches of an in-memory tensor data set, sharded across ranks.

Every rank draws the same per-epoch permutation (seeded by ``seed + epoch``) and takes every
``world_size``-th index starting at its rank, so together the ranks see each example once per
epoch. Training shards are made equal-length (all ranks must take the same number of steps):
``drop_last`` drops the final partial global batch, otherwise the permutation is padded by
wrapping around. Evaluation shards are not padded, so sums all-reduced across ranks count
every example exactly once.

The loader knows its position (epoch, batch within the epoch); ``state_dict`` and
``load_state_dict`` will let a resumed run continue mid-epoch.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch

from workers.data.position import BatchPosition, rank_batch_size

# The most image bytes one gather of batches holds (``TensorLoader.__iter__``).
GATHER_BYTES = 4 << 20


class TensorLoader(BatchPosition):
    """Yields ``(inputs, targets)`` batches of ``batch_size // world_size`` for this rank.

    ``batch_size`` is the global batch size. With ``shuffle=False`` the order is the data
    set's own (used for evaluation).
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, *, batch_size: int, rank: int = 0,
                 world_size: int = 1, shuffle: bool = True, drop_last: bool = True, pad: bool = True,
                 seed: int = 0, device: torch.device | str = "cpu"):
        self.per_rank_batch = rank_batch_size(batch_size, world_size)
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images, self.labels = images, labels
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.shuffle, self.drop_last, self.pad, self.seed = shuffle, drop_last, pad, seed
        super().__init__()
        self.device = torch.device(device)
        if len(self) == 0:
            raise ValueError(f"{len(images)} examples make no full batch of {batch_size}; "
                             "lower data.batch_size or set data.drop_last: false")

    @property
    def in_channels(self) -> int:
        """Image channels (for text: the sequence length, which models ignore)."""
        return self.images.shape[1]

    @property
    def image_size(self) -> int | None:
        """Image width in pixels (None for text), so models can pick small-image stems."""
        return self.images.shape[-1] if self.images.dim() == 4 else None

    def __len__(self) -> int:
        """Batches per epoch (the same on every rank for training shards)."""
        shard = len(range(self.rank, self._ordered_length(), self.world_size))
        return shard // self.per_rank_batch if self.drop_last else math.ceil(shard / self.per_rank_batch)

    def _ordered_length(self) -> int:
        n = len(self.labels)
        if self.drop_last:
            return n // self.batch_size * self.batch_size
        if self.pad:
            return math.ceil(n / self.world_size) * self.world_size
        return n

    def _order(self, epoch: int) -> torch.Tensor:
        n = len(self.labels)
        if not self.shuffle:
            return torch.arange(n)
        return torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + epoch))

    def _shard_indices(self, epoch: int) -> torch.Tensor:
        order = self._order(epoch)
        length = self._ordered_length()
        if length > len(order):
            # Wrap around so every rank gets the same number of examples (and of steps), as many
            # times as it takes: 3 examples over 8 ranks repeat them to 8.
            order = order.repeat(math.ceil(length / len(order)))
        return order[:length][self.rank::self.world_size]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The current epoch's remaining batches, on ``device``. Call ``set_epoch`` to start
        the next epoch: the trainer, not the loader, decides when an epoch begins."""
        # A batch of a hand-written loop costs two index operations (images[idx], labels[idx]);
        # here a run of batches is gathered at once and handed out as views of it (split
        # returns them all in one call), so a batch costs a fraction of one. A tiny model's step
        # feels each operation (bench/loop.py). The values and their order are the same; a
        # gathered run holds up to GATHER_BYTES of images (and its labels) beyond the data set.
        # The position is checked before each batch: a resumed epoch starts mid-way, and a
        # position moved under a paused iterator (load_state_dict, another iterator) is followed.
        indices, size, count = self._shard_indices(self.epoch), self.per_rank_batch, len(self)
        run = self._batches_per_gather()
        while self.batch_in_epoch < count:
            first = self.batch_in_epoch
            chosen = indices[first * size:min(first + run, count) * size]
            for offset, batch in enumerate(zip(self.images[chosen].split(size), self.labels[chosen].split(size))):
                if self.batch_in_epoch != first + offset:
                    break  # moved: gather from the new position
                yield self.hand_out(*batch)

    def _batches_per_gather(self) -> int:
        """How many batches one gather takes: as many as fit in ``GATHER_BYTES``, 1 to 64."""
        batch_bytes = self.per_rank_batch * self.images[:1].nbytes
        return max(1, min(64, GATHER_BYTES // max(1, batch_bytes)))
