"""Data benchmark: how fast the streamed loaders feed training, against the in-memory TensorLoader.

    .venv/bin/python bench/data.py [--samples 6000] [--batch-size 128] [--steps 30] [--loader-workers 2]

On the same Fashion-MNIST images (28x28 grayscale PNGs):
- samples/s of one epoch read by ``webdataset`` (shards on moto's S3 over HTTP, in this process),
  by ``image_folder`` (PNG files on local disk) and by ``TensorLoader`` (tensors in memory);
- the fraction of a ResNet-20 training step (forward, backward, SGD step; one torch thread, as
  a run with cpus_per_worker 1) spent waiting for the next batch, with ``--loader-workers``
  DataLoader worker processes. Goal: < 5%.

Prints a JSON report. moto runs in this process, so S3 numbers include serving the objects on
the same cores; a real object store is farther away but does not share the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.local_s3 import start_s3  # noqa: E402  (after the path insert)


def write_folder(root: Path, images, labels) -> None:
    import torch
    from torchvision.io import encode_png

    for index, (image, label) in enumerate(zip(images, labels)):
        folder = root / f"class_{int(label)}"
        folder.mkdir(parents=True, exist_ok=True)
        png = encode_png(torch.from_numpy(image.copy()).unsqueeze(0)).numpy().tobytes()
        (folder / f"{index:06d}.png").write_bytes(png)


def epoch_rate(loader) -> float:
    """Samples per second over one epoch (worker start-up included)."""
    loader.set_epoch(0)
    start, count = time.perf_counter(), 0
    for _, labels in loader:
        count += len(labels)
    return count / (time.perf_counter() - start)


def wait_fraction(loader, steps: int, warmup: int = 3) -> dict[str, float]:
    """Train ResNet-20 on ``loader``; the share of each step spent in ``next(batches)``."""
    import torch

    from api.specs import CifarResNet20Spec
    from workers.models import build_model

    torch.manual_seed(0)
    model = build_model(CifarResNet20Spec(name="cifar_resnet20"), num_classes=10, in_channels=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader.set_epoch(0)
    batches = iter(loader)
    waited = total = 0.0
    for step in range(warmup + steps):
        start = time.perf_counter()
        inputs, targets = next(batches)
        fetched = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        end = time.perf_counter()
        if step >= warmup:  # the first batches include forking the workers and filling the buffer
            waited, total = waited + fetched - start, total + end - start
    return {"wait_fraction": waited / total, "step_s": total / steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--loader-workers", type=int, default=2)
    parser.add_argument("--out", help="also write the JSON report here")
    args = parser.parse_args()

    import torch

    from api.data_specs import ImageFolderSpec, WebDatasetSpec
    from workers.data import TensorLoader
    from workers.data.fashion_mnist import FILES, _read_idx
    from workers.data.image_folder import ImageFolderLoader
    from workers.data.pack import pack
    from workers.data.webdataset_loader import WebDatasetLoader

    torch.set_num_threads(1)
    root = Path("/usr/share/datasets/fashion-mnist")
    images = _read_idx(root / FILES["train"][0])[:args.samples]
    labels = _read_idx(root / FILES["train"][1])[:args.samples]
    server, _ = start_s3("bench-data")
    report: dict = {"samples": len(labels), "batch_size": args.batch_size, "loader_workers": args.loader_workers}
    try:
        packed = pack("fashion_mnist", "s3://bench-data/fmnist", shard_size=500, limit=args.samples)
        tmp = Path(tempfile.mkdtemp(prefix="bench-data-"))
        write_folder(tmp / "folder", images, labels)
        common = {"channels": 1, "num_workers": args.loader_workers}
        make = {
            "tensor": lambda: TensorLoader(torch.from_numpy(images.copy()).float().div(255).unsqueeze(1),
                                           torch.from_numpy(labels.astype("int64")), batch_size=args.batch_size),
            "webdataset_s3": lambda: WebDatasetLoader(WebDatasetSpec(
                name="webdataset", urls=packed.urls, num_samples=packed.num_samples, shuffle_buffer=1000, **common),
                batch_size=args.batch_size),
            "image_folder_local": lambda: ImageFolderLoader(ImageFolderSpec(
                name="image_folder", root=str(tmp / "folder"), **common), batch_size=args.batch_size),
        }
        for name, build in make.items():
            rate = epoch_rate(build())
            report[name] = {"samples_per_s": round(rate, 1), **{k: round(v, 4) for k, v in
                                                                  wait_fraction(build(), args.steps).items()}}
            print(name, report[name], file=sys.stderr, flush=True)
        for name in ("webdataset_s3", "image_folder_local"):
            report[name]["vs_tensor_samples_per_s"] = round(report[name]["samples_per_s"] /
                                                            report["tensor"]["samples_per_s"], 4)
    finally:
        server.stop()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
