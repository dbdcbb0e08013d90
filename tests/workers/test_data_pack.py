"""``tessera data pack``: Fashion-MNIST (600 images) into WebDataset shards on moto's S3, read back
with the plain ``webdataset`` package and ``tarfile``; and a run on those shards, stopped
mid-epoch and resumed from its checkpoint, ending bitwise equal to the uninterrupted run."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
import webdataset as wds
from torchvision.io import decode_image

from api.specs import RunSpec
from tests.workers.checkpoint_helpers import assert_bitwise_equal, forget_after, latest_url
from workers.data.fashion_mnist import FILES, _read_idx
from workers.reporter import MemorySink
from workers.trainer import train

FMNIST = Path("/usr/share/datasets/fashion-mnist")
TESSERA = str(Path(sys.executable).with_name("tessera"))


@pytest.fixture(scope="module")
def packed(s3_server):
    dest = s3_server.url("fmnist-600")
    result = subprocess.run([TESSERA, "data", "pack", "fashion_mnist", dest, "--shard-size", "100", "--limit", "600"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "300"})
    assert result.returncode == 0, result.stdout + result.stderr
    return dest, result.stdout


def test_pack_prints_the_urls_pattern_and_num_samples(packed):
    dest, output = packed
    assert f"urls: {dest}/train-{{000000..000005}}.tar" in output
    assert "num_samples: 600" in output and "channels: 1" in output


def test_shards_are_plain_tars_the_webdataset_package_reads(packed, tmp_path):
    dest, _ = packed
    images = _read_idx(FMNIST / FILES["train"][0])[:600]
    labels = _read_idx(FMNIST / FILES["train"][1])[:600]
    for index in range(6):  # the plain package reads local files: copy the shards down
        (tmp_path / f"train-{index:06d}.tar").write_bytes(fsspec.open(f"{dest}/train-{index:06d}.tar").open().read())
    with tarfile.open(tmp_path / "train-000000.tar") as tar:
        names = tar.getnames()
    assert len(names) == 200 and {Path(n).suffix for n in names} == {".png", ".cls"}
    seen = set()
    for sample in wds.WebDataset(str(tmp_path / "train-{000000..000005}.tar"), shardshuffle=False):
        index = int(sample["__key__"])  # the key is the image's index in the source
        image = decode_image(torch.frombuffer(bytearray(sample["png"]), dtype=torch.uint8))
        assert np.array_equal(image[0].numpy(), images[index]) and int(sample["cls"]) == labels[index]
        seen.add(index)
    assert seen == set(range(600))


def test_pack_refuses_a_missing_source_with_a_clear_message(tmp_path):
    result = subprocess.run([TESSERA, "data", "pack", str(tmp_path / "nope"), str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
    assert result.returncode == 1 and "does not exist or is not a folder" in result.stderr


def streamed_spec(urls: str, **overrides) -> RunSpec:
    data = {"name": "webdataset", "urls": urls, "num_samples": 600, "channels": 1, "shuffle_buffer": 100,
            "num_workers": 2, "transforms": {"crop": 24, "hflip": True, "normalize": {"mean": [0.29], "std": [0.35]}}}
    body = {"name": "wds-resume", "model": {"name": "simple_cnn", "params": {"width": 8, "hidden": 16}},
            "data": {"train": data, "eval": {**data, "num_samples": 600}, "batch_size": 40},
            "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}, "max_duration": "20ba",
            "checkpoint": {"interval": "4ba", "keep_last": 10}, "deterministic": True, "seed": 11,
            "algorithms": [{"name": "cutmix"}], **overrides}  # CutMix draws from the global RNG
    return RunSpec.model_validate(body)


def test_a_run_resumed_mid_epoch_from_streamed_shards_ends_bitwise_equal(packed, tmp_path):
    dest, _ = packed
    spec = streamed_spec(f"{dest}/train-{{000000..000005}}.tar")  # 15 batches an epoch
    whole, interrupted = f"file://{tmp_path}/whole", f"file://{tmp_path}/interrupted"
    train(spec, checkpoint_url=whole, sink=MemorySink())
    train(spec, checkpoint_url=interrupted, sink=MemorySink())
    forget_after(interrupted, 8)  # as if it died in batch 9 of epoch 0, with batch 8 committed
    sink = MemorySink()
    with torch.random.fork_rng():
        torch.manual_seed(999)
        metrics = train(spec, checkpoint_url=interrupted, sink=sink)
    assert [step for step, _ in sink.values("train/loss")] == list(range(9, 21))
    assert metrics["time/epoch"] == 1 and latest_url(interrupted).endswith("ep1-ba20")
    assert assert_bitwise_equal(latest_url(whole), latest_url(interrupted)) > 4
