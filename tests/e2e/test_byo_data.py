"""Bring your own data, end to end: Fashion-MNIST packed as WebDataset shards into S3 (moto over
HTTP) by ``tessera data pack``, a user model written here and shipped with ``--code``, trained by
a live service on Ray with 2 DDP workers to a real accuracy; an ``image_folder`` of PNGs in S3
trained through the SDK; a run over a shard that does not exist, which must fail naming it; and
the README's text example, on padded sentences, through the service and Ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from api.views import RunStatus
from tests.e2e.conftest import wait_for_status
from tests.e2e.test_byo_model import run_id_of, submit
from tests.workers.data_helpers import write_indexed_folder

pytestmark = pytest.mark.integration
TESSERA = str(Path(sys.executable).with_name("tessera"))

# A researcher's package: a small conv net that does not care about the image size.
NETS = '''
import torch.nn as nn


def build(num_classes, in_channels, width=16):
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(2 * width * 7 * 7, num_classes))
'''
FMNIST_NORMALIZE = {"mean": [0.286], "std": [0.353]}


def write_package(root: Path) -> Path:
    package = root / "fmnist_nets"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(NETS)
    return package


def pack(src: str, dest: str, *args: str) -> dict[str, str]:
    """``tessera data pack`` as a user runs it; returns the ``urls`` and ``num_samples`` it prints."""
    result = subprocess.run([TESSERA, "data", "pack", src, dest, *args], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "COLUMNS": "300"})
    assert result.returncode == 0, result.stdout + result.stderr
    printed = dict(line.split(": ", 1) for line in result.stdout.splitlines() if line.startswith(("urls", "num_")))
    return {"urls": printed["urls"], "num_samples": int(printed["num_samples"])}


def run_spec(name: str, train: dict, evaluation: dict, *, duration: str, batch_size: int = 64) -> dict:
    # Small on purpose (one loader worker per rank, evaluation only at the end): the run shares
    # two cores with the service, Ray and S3.
    return {"name": name, "model": {"import": "fmnist_nets.nets:build", "params": {"width": 8}},
            "data": {"train": train, "eval": evaluation, "batch_size": batch_size},
            "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}, "scheduler": {"name": "cosine"},
            "max_duration": duration, "eval_interval": duration,
            "parallelism": {"strategy": "ddp", "num_workers": 2}, "seed": 7}


def test_a_user_model_trains_on_packed_shards_in_s3_to_a_real_accuracy(s3_service, s3_server, tmp_path):
    train = pack("fashion_mnist", s3_server.url("fmnist"), "--shard-size", "500", "--limit", "2000")
    test = pack("fashion_mnist", s3_server.url("fmnist"), "--split", "test", "--shard-size", "125", "--limit", "500")
    assert train == {"urls": s3_server.url("fmnist/train-{000000..000003}.tar"), "num_samples": 2000}
    shard = {"name": "webdataset", "channels": 1, "num_classes": 10, "num_workers": 1,
             "transforms": {"normalize": FMNIST_NORMALIZE}}
    spec = run_spec("byo-data-wds", {**shard, **train, "shuffle_buffer": 500}, {**shard, **test}, duration="2ep")
    result = submit(s3_service, spec, write_package(tmp_path), tmp_path, "--follow")
    assert result.returncode == 0, result.stdout + result.stderr
    run = s3_service.client().get_run(run_id_of(result))
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.summary["time/batch"] == 2 * (2000 // 64)
    assert run.summary["eval/accuracy"] > 0.6  # chance is 0.1


def test_an_image_folder_in_s3_trains_to_completion(s3_service, s3_server, tmp_path):
    folder = write_indexed_folder(tmp_path / "images", 96)  # class_0..class_3, 8x8 grayscale PNGs
    bucket = boto3.client("s3", endpoint_url=s3_server.endpoint_url)
    for image in folder.rglob("*.png"):
        bucket.upload_file(str(image), s3_server.bucket, f"images/{image.relative_to(folder).as_posix()}")
    images = {"name": "image_folder", "root": s3_server.url("images"), "channels": 1, "num_workers": 1}
    spec = run_spec("byo-data-folder", images, images, duration="2ep", batch_size=16)
    client = s3_service.client()
    run = client.create_run(spec, code=write_package(tmp_path))
    run = wait_for_status(client, run.id, {RunStatus.COMPLETED, RunStatus.FAILED}, timeout=240)
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.summary["time/batch"] == 2 * (96 // 16) and 0.0 <= run.summary["eval/accuracy"] <= 1.0


def test_a_run_over_a_missing_shard_fails_naming_its_url(s3_service, s3_server, tmp_path):
    missing = {"name": "webdataset", "urls": s3_server.url("nowhere/train-{000000..000001}.tar"),
               "num_samples": 200, "channels": 1, "num_workers": 1}
    client = s3_service.client()
    run = client.create_run(run_spec("byo-data-missing", missing, missing, duration="1ep"),
                            code=write_package(tmp_path))
    run = wait_for_status(client, run.id, {RunStatus.COMPLETED, RunStatus.FAILED}, timeout=240)
    assert run.status is RunStatus.FAILED
    assert f"shard '{s3_server.url('nowhere/train-00000')}" in run.error, run.error
    assert "cannot be opened" in run.error, run.error


def test_your_own_padded_text_trains_a_language_model_through_the_service_on_ray(s3_service, tmp_path):
    # examples/byo as a user submits it, on the package's padded sentences (targets of -100):
    # items pickled to the Ray worker, tokens counted, perplexity over the kept characters only.
    import yaml

    from tests.conftest import REPO_ROOT

    example = REPO_ROOT / "examples" / "byo"
    spec = yaml.safe_load((example / "text_spec.yaml").read_text())
    for split in ("train", "eval"):
        spec["data"][split]["import"] = "my_project.text:char_sentences"
    spec |= {"name": "byo-text-e2e", "max_duration": "6ba"}
    client = s3_service.client()
    run = client.create_run(spec, code=example / "my_project")
    run = wait_for_status(client, run.id, {RunStatus.COMPLETED, RunStatus.FAILED}, timeout=240)
    assert run.status is RunStatus.COMPLETED, run.error
    vocabulary = len(set((example / "my_project" / "corpus.txt").read_text()))
    assert run.summary["time/batch"] == 6 and 1.0 < run.summary["eval/perplexity"] < 0.7 * vocabulary
