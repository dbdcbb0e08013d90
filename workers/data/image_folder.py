"""``ImageFolderLoader``: torchvision's ``root/<class>/<image>`` layout, local or ``s3://``, decoded by
``torch.utils.data.DataLoader`` worker processes (with prefetch) so decoding overlaps training.

Order and resume are ``IndexBatchLoader``'s (``workers.data.index_batches``): the same per-epoch
permutation and rank striding as ``TensorLoader``, and each sample's random crop/flip drawn from
a generator seeded by ``(seed, epoch, index)``. So the batches are a pure function of (seed,
epoch, rank, world_size), not of the number of loader workers, and a resume at
``batch_in_epoch`` skips exactly the batches already trained on, without reading them.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from workers.data.errors import DataError
from workers.data.index_batches import IndexBatchLoader
from workers.data.position import rank_batch_size
from workers.data.transforms import SampleTransform, collate, decode
from workers.s3_limits import bounded_fs

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".webp")


def list_image_folder(root: str) -> tuple[list[str], list[int], list[str]]:
    """``(paths, labels, classes)``: every image under ``root/<class>/``, sorted; classes are the
    sorted folder names and a label is its folder's index."""
    fs, base = bounded_fs(root)
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
            self._fs = (os.getpid(), bounded_fs(path)[0])
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


class ImageFolderLoader(IndexBatchLoader):
    """Batches of ``batch_size // world_size`` images for this rank, with ``TensorLoader``'s interface."""

    def __init__(self, spec: Any, *, batch_size: int, rank: int = 0, world_size: int = 1, train: bool = True,
                 drop_last: bool = True, seed: int = 0, device: torch.device | str = "cpu"):
        rank_batch_size(batch_size, world_size)  # before listing or building anything
        paths, labels, self.classes = list_image_folder(spec.root)
        self.num_classes = spec.num_classes or len(self.classes)
        if max(labels) >= self.num_classes:
            raise DataError(f"image_folder root {spec.root!r} has {len(self.classes)} class folders but "
                            f"num_classes is {self.num_classes}; expected at most {self.num_classes} folders")
        self.in_channels = spec.channels
        # Known only when the spec fixes it (crop, else resize); models then pick small-image stems.
        self.image_size = spec.transforms.crop or spec.transforms.resize if spec.transforms else None
        dataset = _Images(paths, labels, channels=spec.channels,
                          transform=SampleTransform(spec.transforms, train=train), seed=seed)
        super().__init__(dataset, collate=_collate, batch_size=batch_size, rank=rank, world_size=world_size,
                         train=train, drop_last=drop_last, seed=seed, device=device, num_workers=spec.num_workers)
        if len(self) == 0:
            raise DataError(f"image_folder root {spec.root!r} has {len(paths)} images: no full batch of "
                            f"{batch_size} for rank {rank} of {world_size}; lower data.batch_size or add images")
