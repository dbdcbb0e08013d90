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
    (package / ".gitignore").write_text("*.ckpt\n")
    (package / "old.ckpt").write_bytes(b"\0" * 1024)
    return package


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
