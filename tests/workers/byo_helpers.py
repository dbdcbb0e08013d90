"""A user package written by a test, as a researcher would write it: ``my_project/nets.py`` (a
model) and ``my_project/data.py`` (data sets)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

NETS = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

LOSS_CALLS = []


class TinyMLP(nn.Module):
    """No conv layers, no attention: BlurPool, ChannelsLast and ALiBi find nothing here."""

    def __init__(self, num_classes, in_channels, width):
        super().__init__()
        self.flatten = nn.Flatten()
        self.hidden = nn.LazyLinear(width)
        self.out = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.out(F.relu(self.hidden(self.flatten(x))))

    def loss(self, outputs, targets):
        LOSS_CALLS.append(tuple(outputs.shape))
        return F.cross_entropy(outputs, targets)


def build(num_classes, in_channels, width=16):
    model = TinyMLP(num_classes, in_channels, width)
    model.hidden = nn.Linear(in_channels * 8 * 8, width)  # the test data is 8x8
    return model
'''

DATA = '''
import random

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

SIZE = 8


class Blobs(Dataset):
    """``size`` items ``(image, label)``: label ``i % num_classes``, a ``(channels, 8, 8)`` image of
    the label's gray level whose pixel (0, 0, 0) holds ``i`` (so a test can tell which item a batch
    holds); ``features``: the flattened image. ``bad_label_at``, ``bad_shape_at``: one broken item."""

    def __init__(self, size, channels=1, features=False, bad_label_at=None, bad_shape_at=None, noisy=False):
        self.size, self.channels, self.features = size, channels, features
        self.bad_label_at, self.bad_shape_at, self.noisy = bad_label_at, bad_shape_at, noisy
        self.classes = self.num_classes = 4

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        label = i % self.classes
        image = torch.full((self.channels, SIZE, SIZE), label / self.classes)
        image[0, 0, 0] = float(i)
        if self.noisy:  # random augmentation, from each of the three global generators
            image[0, 1, 1] = torch.rand(()).item() + random.random() + float(np.random.rand())
        if i == self.bad_shape_at:
            image = image[:, :4]
        if i == self.bad_label_at:
            label = self.classes + 3
        return (image.flatten() if self.features else image), label


def train_set(size=64, **kwargs):
    return Blobs(size, **kwargs)


def test_set(size=32, **kwargs):
    return Blobs(size, **kwargs)


def without_classes(size=16):
    data = Blobs(size)
    del data.num_classes
    return data


class LazyFile(Blobs):
    """Opens its file on first use, as data sets of file handles (HDF5, LMDB) do."""

    def __init__(self, path, size=64):
        super().__init__(size)
        self.path, self.handle = path, None

    def __getitem__(self, i):
        if self.handle is None:
            self.handle = open(self.path, "rb")
        return super().__getitem__(i)


def lazy_file(path, size=64):
    return LazyFile(path, size)


def not_a_dataset():
    return 42


class Stream(IterableDataset):
    def __iter__(self):
        yield torch.zeros(1, SIZE, SIZE), 0


def stream():
    return Stream()


def broken(size=8):
    raise RuntimeError("the data is not there")


class Tokens(Dataset):
    """A language-model data set: windows of ``seq_len`` ids of a repeating text over a vocabulary
    of ``vocab`` (``num_classes``), targets shifted by one; ``pad``: the last ``pad`` positions of
    every odd item are padding (token 0, target -100); ``bad``: one broken item (``"float"``,
    ``"short"``, ``"id"``: a float tensor, one id short, an id outside the vocabulary;
    ``"ignored"``: every target -100; ``"negative"``: a target -5; ``"ignored_token"``: a token -100;
    ``"uint8"``: uint8 targets with -100 written into one, which stores 156)."""

    def __init__(self, size, seq_len, vocab=12, bad=None, bad_at=None, pad=0):
        self.size, self.seq_len, self.bad, self.bad_at, self.pad = size, seq_len, bad, bad_at, pad
        self.num_classes = vocab
        self.text = torch.tensor([(i * 7 + i // vocab) % vocab for i in range(size * seq_len + 1)])

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        start = i * self.seq_len
        tokens, targets = self.text[start:start + self.seq_len], self.text[start + 1:start + self.seq_len + 1]
        if self.pad and i % 2:
            tokens, targets = tokens.clone(), targets.clone()
            tokens[-self.pad:], targets[-self.pad:] = 0, -100
        if i == self.bad_at:
            tokens, targets = tokens.clone(), targets.clone()
            if self.bad == "float":
                tokens = tokens.float()
            elif self.bad == "short":
                targets = targets[:-1]
            elif self.bad == "id":
                tokens[3] = self.num_classes
            elif self.bad == "ignored":
                targets[:] = -100
            elif self.bad == "negative":
                targets[2] = -5
            elif self.bad == "ignored_token":
                tokens[2] = -100
            elif self.bad == "uint8":  # -100 written into uint8 is 156: an id, outside the vocabulary
                targets = targets.to(torch.uint8)
                targets[2] = -100
        return tokens, targets


def tokens(size=64, seq_len=16, **kwargs):
    return Tokens(size, seq_len, **kwargs)
'''


def write_user_package(root: Path, *, broken: bool = False, name: str = "my_project",
                       needs: str | None = None) -> Path:
    """``root/<name>/{__init__.py, nets.py}``; ``broken`` makes ``nets.py`` import a missing
    module, ``needs`` a module of a pip requirement (``code.requirements``) whose ``WIDTH`` it uses."""
    package = root / name
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    imports = "import not_installed_anywhere  # the user forgot a dependency\n" if broken else ""
    nets = NETS
    if needs:
        imports += f"import {needs}\n"
        nets = nets.replace("def build(num_classes, in_channels, width=16):",
                            f"def build(num_classes, in_channels, width={needs}.WIDTH):")
    (package / "nets.py").write_text(imports + nets)
    (package / "data.py").write_text(DATA)
    (package / ".gitignore").write_text("*.ckpt\n")
    (package / "old.ckpt").write_bytes(b"\0" * 1024)
    return package


@contextlib.contextmanager
def importable_user_package(root: Path, monkeypatch, name: str = "my_project") -> Iterator[Path]:
    """``write_user_package(root)`` on ``sys.path`` while the block runs (``monkeypatch`` restores
    the path), its modules forgotten before and after, so each test imports its own."""
    package = write_user_package(root, name=name)
    monkeypatch.setattr(sys, "path", [str(root), *sys.path])

    def forget() -> None:
        for module in [n for n in sys.modules if n.split(".")[0] == name]:
            del sys.modules[module]

    forget()
    try:
        yield package
    finally:
        forget()


def store(tmp_path, package) -> str:
    """Put the package where the service would: ``{storage}/code/{digest}.zip``; returns the storage URL."""
    code = tmp_path / "storage" / "code"
    code.mkdir(parents=True, exist_ok=True)
    (code / f"{package.digest}.zip").write_bytes(package.data)
    return f"file://{tmp_path}/storage"


def write_wheel(folder: Path, name: str = "tessera_probe_dep", version: str = "1.0", width: int = 6) -> Path:
    """A pure-Python wheel of one module ``name`` (``WIDTH = width``), built by hand (a zip with
    its dist-info, as PEP 427 describes), so pip installs it with no index and no build step:
    require it as ``f"{name} @ {path.as_uri()}"``."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {f"{name}.py": f"WIDTH = {width}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tessera-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def user_spec(name: str, digest: str | None, *, algorithms=(), batches: int = 4, num_workers: int = 1,
              user_data: bool = False) -> dict:
    """A run of ``my_project.nets:build`` on synthetic 8x8 images in 4 classes, or (``user_data``)
    on ``my_project.data``'s data sets, which are the same shape."""
    spec = {
        "name": name,
        "model": {"import": "my_project.nets:build", "params": {"width": 8}},
        "data": {"train": {"name": "synthetic", "num_samples": 64, "image_size": 8, "channels": 1, "num_classes": 4},
                 "eval": {"name": "synthetic", "split": "test", "num_samples": 32, "image_size": 8, "channels": 1,
                          "num_classes": 4},
                 "batch_size": 16},
        "optimizer": {"name": "sgd", "lr": 0.1},
        "max_duration": f"{batches}ba",
        "algorithms": list(algorithms),
        "parallelism": {"strategy": "ddp" if num_workers > 1 else "none", "num_workers": num_workers},
    }
    if user_data:
        spec["data"].update(train={"import": "my_project.data:train_set", "params": {"size": 64}},
                            eval={"import": "my_project.data:test_set", "params": {"size": 32}})
    if digest is not None:
        spec["code"] = {"digest": digest}
    return spec
