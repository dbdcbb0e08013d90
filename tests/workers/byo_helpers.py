"""A user package written by a test, as a researcher would write it: ``my_project/nets.py``."""

from __future__ import annotations

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


def write_user_package(root: Path, *, broken: bool = False, name: str = "my_project") -> Path:
    """``root/<name>/{__init__.py, nets.py}``; ``broken`` makes ``nets.py`` import a missing module."""
    package = root / name
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(("import not_installed_anywhere  # the user forgot a dependency\n" if broken
                                      else "") + NETS)
    (package / ".gitignore").write_text("*.ckpt\n")
    (package / "old.ckpt").write_bytes(b"\0" * 1024)
    return package


def user_spec(name: str, digest: str | None, *, algorithms=(), batches: int = 4, num_workers: int = 1) -> dict:
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
    if digest is not None:
        spec["code"] = {"digest": digest}
    return spec
