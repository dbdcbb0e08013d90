"""Fashion-MNIST from the idx ``.gz`` files Debian's ``dataset-fashion-mnist`` installs.

Read with gzip + numpy (no torchvision folder layout needed): 60000 training and 10000 test
images of 28x28, 10 classes, normalized with the training set's mean/std (0.2860/0.3530).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

from workers.data.images import normalize, resize

MEAN, STD = 0.2860, 0.3530
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    # idx header: two zero bytes, a dtype code (0x08 = uint8), the number of dims, then one
    # big-endian int32 per dim.
    if data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise ValueError(f"{path} is not a uint8 idx file")
    ndim = data[3]
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_fashion_mnist(split: str = "train", root: str = "/usr/share/datasets/fashion-mnist",
                       image_size: int = 28, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images (N, 1, image_size, image_size) float32, labels (N,) int64)`` of ``split``.

    Raises ``FileNotFoundError`` naming the folder, the files and how to install them.
    """
    folder = Path(root)
    paths = [folder / name for name in FILES[split]]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        expected = ", ".join(name for pair in FILES.values() for name in pair)
        raise FileNotFoundError(
            f"Fashion-MNIST files not found under {folder} (missing: {', '.join(missing)}); expected {expected}. "
            "Install them with `apt-get install dataset-fashion-mnist` or set data.train.root to their folder")
    images, labels = (_read_idx(p) for p in paths)
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    pixels = torch.from_numpy(images.copy()).float().div_(255.0).unsqueeze(1)
    return normalize(resize(pixels, image_size), MEAN, STD), torch.from_numpy(labels.astype(np.int64))
