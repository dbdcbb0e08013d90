"""``pack``: write an image folder or a built-in data set as WebDataset tar shards.

Each sample is ``{key}.png`` (the image, PNG) and ``{key}.cls`` (its integer label as text),
written with ``webdataset.TarWriter`` to a local folder or ``s3://`` prefix (fsspec), in shards
of ``shard_size`` samples named ``{name}-000000.tar``, ... Samples are shuffled (seeded) before
packing so each shard mixes the classes; plain ``tar`` and the ``webdataset`` package read the
shards. ``tessera data pack`` is the command line for it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import fsspec
import numpy as np
import torch
from torchvision.io import ImageReadMode, decode_image, encode_png
from webdataset import TarWriter

from workers.data.errors import DataError
from workers.s3_limits import bound_retries, storage_options

BUILT_IN = ("fashion_mnist", "digits")
FIXED_MTIME = 0.0  # reproducible tar bytes


@dataclasses.dataclass(frozen=True)
class PackResult:
    urls: str  # the brace pattern to paste into a spec
    num_samples: int
    num_shards: int
    num_classes: int
    channels: int

    def spec_snippet(self) -> str:
        return (f"{{name: webdataset, urls: \"{self.urls}\", image_key: png, label_key: cls, "
                f"num_samples: {self.num_samples}, num_classes: {self.num_classes}, channels: {self.channels}, "
                "shuffle_buffer: 1000}")


def _built_in(name: str, split: str, root: str | None) -> tuple[np.ndarray, np.ndarray]:
    """uint8 ``(N, H, W)`` grayscale images and int labels of a built-in data set."""
    if name == "fashion_mnist":
        from pathlib import Path

        from workers.data.fashion_mnist import FILES, _read_idx, load_fashion_mnist

        folder = Path(root or "/usr/share/datasets/fashion-mnist")
        if not all((folder / f).is_file() for f in FILES[split]):
            load_fashion_mnist(split, root=str(folder))  # raises the loader's explanation
        return _read_idx(folder / FILES[split][0]), _read_idx(folder / FILES[split][1])
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from workers.data.digits import SPLIT_SEED

    bunch = load_digits()  # 8x8, pixels 0..16; the same split as the built-in `digits`
    train, test = train_test_split(np.arange(len(bunch.target)), test_size=0.2, random_state=SPLIT_SEED,
                                   stratify=bunch.target)
    chosen = train if split == "train" else test
    return (bunch.images[chosen] * (255.0 / 16.0)).round().astype(np.uint8), bunch.target[chosen]


def _samples(source: str, split: str, limit: int | None, root: str | None
             ) -> tuple[list[int], list, int, int]:
    """``(labels, items, num_classes, channels)``; an item is PNG bytes or an image path."""
    if source in BUILT_IN:
        images, labels = _built_in(source, split, root)
        if limit is not None:
            images, labels = images[:limit], labels[:limit]
        return [int(x) for x in labels], list(images), 10, 1
    from workers.data.image_folder import list_image_folder

    paths, labels, classes = list_image_folder(source)
    if limit is not None:
        paths, labels = paths[:limit], labels[:limit]
    with _open(paths[0], "rb") as f:
        channels = int(decode_image(torch.frombuffer(bytearray(f.read()), dtype=torch.uint8),
                                    mode=ImageReadMode.UNCHANGED).shape[0])
    return labels, paths, len(classes), 1 if channels in (1, 2) else 3


def _open(url: str, mode: str) -> fsspec.core.OpenFile:
    """``fsspec.open`` (which makes a local file's folders) with S3's bounded waits and tries
    (``workers.s3_limits``): a store that stops answering fails the pack instead of hanging it."""
    opened = fsspec.open(url, mode, **storage_options(url))
    bound_retries(opened.fs)
    return opened


def _png(item) -> bytes:
    if isinstance(item, np.ndarray):
        return encode_png(torch.from_numpy(np.array(item, copy=True)).unsqueeze(0)).numpy().tobytes()
    with _open(item, "rb") as f:
        data = f.read()
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return data
    try:
        return encode_png(decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8))).numpy().tobytes()
    except Exception as exn:
        raise DataError(f"image {item!r} cannot be decoded: {exn}") from None


def shard_urls(dest: str, name: str, count: int) -> Iterator[str]:
    for index in range(count):
        yield f"{dest.rstrip('/')}/{name}-{index:06d}.tar"


def pack(source: str, dest: str, *, shard_size: int = 1000, split: str = "train", limit: int | None = None,
         name: str | None = None, seed: int = 0, root: str | None = None) -> PackResult:
    """Write ``source`` (``fashion_mnist``, ``digits`` or an image folder path/URL) as shards under
    ``dest``. ``root``: where the built-in data set's files are (Fashion-MNIST)."""
    if shard_size < 1:
        raise ValueError(f"shard_size {shard_size} must be >= 1")
    labels, items, num_classes, channels = _samples(source, split, limit, root)
    order = np.random.default_rng(seed).permutation(len(labels))
    name = name or split
    num_shards = math.ceil(len(labels) / shard_size)
    for shard, url in enumerate(shard_urls(dest, name, num_shards)):
        with _open(url, "wb") as stream:
            writer = TarWriter(stream, encoder=False, mtime=FIXED_MTIME)
            for position in order[shard * shard_size:(shard + 1) * shard_size]:
                writer.write({"__key__": f"{int(position):08d}", "png": _png(items[position]),
                              "cls": str(labels[position]).encode()})
            writer.close()
    last = f"{num_shards - 1:06d}"
    urls = f"{dest.rstrip('/')}/{name}-{{000000..{last}}}.tar" if num_shards > 1 else f"{dest.rstrip('/')}/{name}-000000.tar"
    return PackResult(urls=urls, num_samples=len(labels), num_shards=num_shards, num_classes=num_classes,
                      channels=channels)
