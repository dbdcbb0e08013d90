"""``ImageFolderLoader``: torchvision's ``root/<class>/<image>`` layout, local or ``s3://``, decoded by
``torch.utils.data.DataLoader`` worker processes (with prefetch) so decoding overlaps training.

Order: the same per-epoch permutation and rank striding as ``TensorLoader`` (seeded by
``seed + epoch``), and each sample's random crop/flip drawn from a generator seeded by
``(seed, epoch, index)``. So the batches are a pure function of (seed, epoch, rank,
world_size) — not of the number of loader workers — and resuming at ``batch_in_epoch`` skips
exactly the batches already trained on, without reading them. With another world size a
resumed run continues at the same global batch of the epoch; the rest of that epoch is the new
world size's striding of the same permutation (so a few samples may repeat or be missed in
that one epoch), and later epochs are exact.
"""

from __future__ import annotations

import math
import os
import posixpath
from typing import Any, Iterator

import fsspec
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from workers.data.errors import DataError
from workers.data.loading import batches_failing_fast, private_generator, start_worker_server, worker_processes
from workers.data.position import BatchPosition
from workers.data.transforms import SampleTransform, collate, decode

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".webp")


def list_image_folder(root: str) -> tuple[list[str], list[int], list[str]]:
    """``(paths, labels, classes)``: every image under ``root/<class>/``, sorted; classes are the
    sorted folder names and a label is its folder's index."""
    fs, base = fsspec.core.url_to_fs(root)
    try:
        if not fs.isdir(base):
            raise DataError(f"image_folder root {root!r} does not exist or is not a folder; expected "
                            "root/<class>/<image> folders")
        found = fs.find(base)
    except DataError:
        raise
    except Exception as exn:  # missing bucket, no credentials, ...
        raise DataError(f"image_folder root {root!r} cannot be listed: {type(exn).__name__}: {exn}") from None
    base = base.rstrip("/")
    per_class: dict[str, list[str]] = {}
    for path in sorted(found):
        parts = posixpath.relpath(path, base).split("/")
        if len(parts) >= 2 and path.lower().endswith(IMAGE_EXTENSIONS):
            per_class.setdefault(parts[0], []).append(path)
    if not per_class:
        raise DataError(f"image_folder root {root!r} holds no images in class folders; expected "
                        f"root/<class>/<image> with extensions {', '.join(IMAGE_EXTENSIONS)}")
    classes = sorted(per_class)
    paths, labels = [], []
    for label, name in enumerate(classes):
        paths.extend(per_class[name])
        labels.extend([label] * len(per_class[name]))
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol not in ("file", "local"):
        paths = [f"{protocol}://{p}" for p in paths]
    return paths, labels, classes


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


class _Images(Dataset):
    """Reads, decodes and transforms one ``(index, epoch)`` item; opens its filesystem per process."""

    def __init__(self, paths: list[str], labels: list[int], *, channels: int, transform: SampleTransform, seed: int):
        self.paths, self.labels, self.channels = paths, labels, channels
        self.transform, self.seed = transform, seed
        self._fs: tuple[int, Any] | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def _read(self, path: str) -> bytes:
        if self._fs is None or self._fs[0] != os.getpid():  # workers must not share the rank's s3fs session
            self._fs = (os.getpid(), fsspec.core.url_to_fs(path)[0])
        try:
            with self._fs[1].open(path, "rb") as f:
                return f.read()
        except Exception as exn:
            raise DataError(f"image {path!r} cannot be read: {type(exn).__name__}: {exn}") from None

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, int, str]:
        index, epoch = item
        path = self.paths[index]
        image = decode(self._read(path), channels=self.channels, where=f"image {path!r}")
        rng = np.random.default_rng([self.seed, epoch, index]) if self.transform.train else None
        return self.transform(image, rng), self.labels[index], path


def _collate(items: list[tuple[torch.Tensor, int, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    return collate([i[0] for i in items], [i[1] for i in items], where=[f"image {i[2]!r}" for i in items])


class ImageFolderLoader(BatchPosition):
    """Batches of ``batch_size // world_size`` for this rank, with ``TensorLoader``'s interface."""

    def __init__(self, spec: Any, *, batch_size: int, rank: int = 0, world_size: int = 1, train: bool = True,
                 drop_last: bool = True, seed: int = 0, device: torch.device | str = "cpu"):
        if batch_size % world_size:
            raise ValueError(f"batch_size {batch_size} must be divisible by world_size {world_size}")
        paths, labels, self.classes = list_image_folder(spec.root)
        self.num_classes = spec.num_classes or len(self.classes)
        if max(labels) >= self.num_classes:
            raise DataError(f"image_folder root {spec.root!r} has {len(self.classes)} class folders but "
                            f"num_classes is {self.num_classes}; expected at most {self.num_classes} folders")
        self.in_channels, self.num_workers = spec.channels, spec.num_workers
        if self.num_workers > 0:
            start_worker_server()
        # Known only when the spec fixes it (crop, else resize); models then pick small-image stems.
        self.image_size = spec.transforms.crop or spec.transforms.resize if spec.transforms else None
        self.dataset = _Images(paths, labels, channels=spec.channels,
                               transform=SampleTransform(spec.transforms, train=train), seed=seed)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.per_rank_batch = batch_size // world_size
        self.train, self.drop_last, self.seed = train, drop_last if train else False, seed
        self.device = torch.device(device)
        BatchPosition.__init__(self)
        self._length: int | None = None
        if len(self) == 0:
            raise DataError(f"image_folder root {spec.root!r} has {len(paths)} images: no full batch of "
                            f"{batch_size} for rank {rank} of {world_size}; lower data.batch_size or add images")

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
        loader = DataLoader(self.dataset, batch_sampler=batches, collate_fn=_collate,
                            pin_memory=self.device.type == "cuda", generator=private_generator(self.seed, self.epoch),
                            **worker_processes(self.num_workers))
        for images, labels in batches_failing_fast(loader):
            yield self.hand_out(images, labels)
