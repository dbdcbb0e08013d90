"""image_folder: PNGs written by the test, read by DataLoader workers; each sample once per epoch
across ranks, transforms from the spec, an exact resume, and a run that trains on it."""

from __future__ import annotations

import pytest
import torch

from api.data_specs import ImageFolderSpec
from api.specs import RunSpec
from tests.workers.data_helpers import served, write_indexed_folder
from workers.data.image_folder import ImageFolderLoader
from workers.trainer import train

NUM = 120


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_indexed_folder(tmp_path_factory.mktemp("folder"), NUM, num_classes=3)


def spec_for(folder, **overrides) -> ImageFolderSpec:
    return ImageFolderSpec.model_validate({"name": "image_folder", "root": str(folder), "channels": 1, **overrides})


def test_classes_are_the_sorted_folders_and_each_sample_comes_once_per_epoch(folder):
    ranks = [ImageFolderLoader(spec_for(folder), batch_size=20, rank=r, world_size=2, seed=5) for r in range(2)]
    assert ranks[0].classes == ["class_0", "class_1", "class_2"] and ranks[0].num_classes == 3
    first = [served(r) for r in ranks]
    assert [len(x) for x in first] == [NUM // 2] * 2 and sorted(first[0] + first[1]) == list(range(NUM))
    for r in ranks:
        r.set_epoch(1)
    assert [served(r) for r in ranks] != first


def test_labels_are_the_class_folders(folder):
    loader = ImageFolderLoader(spec_for(folder, num_workers=0), batch_size=NUM, seed=0)
    images, labels = next(iter(loader))
    pixel = (images[:, 0, 3, 3] * 255).round().long()  # write_indexed_folder paints 20 * label
    assert torch.equal(pixel, labels * 20)


def test_transforms_resize_crop_flip_normalize(folder):
    spec = spec_for(folder, transforms={"resize": 16, "crop": 12, "hflip": True,
                                        "normalize": {"mean": [0.5], "std": [0.5]}})
    images, _ = next(iter(ImageFolderLoader(spec, batch_size=8, seed=0)))
    assert images.shape == (8, 1, 12, 12) and images.min() >= -1.0 and images.max() <= 1.0
    evaluation = ImageFolderLoader(spec, batch_size=7, seed=0, train=False)
    assert len(evaluation) == -(-NUM // 7)  # eval keeps the last partial batch
    assert sum(len(b[1]) for b in evaluation) == NUM


def test_resume_mid_epoch_gives_the_same_remaining_batches_bitwise(folder):
    spec = spec_for(folder, transforms={"crop": 6, "hflip": True})
    full = list(ImageFolderLoader(spec, batch_size=10, seed=1))
    resumed = ImageFolderLoader(spec, batch_size=10, seed=1)
    resumed.load_state_dict({"epoch": 0, "batch_in_epoch": 5})
    rest = list(resumed)
    assert len(rest) == len(full) - 5 and resumed.exhausted
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(full[5:], rest))


def test_a_run_trains_on_an_image_folder(folder):
    spec = RunSpec.model_validate({
        "name": "folder-run", "model": {"name": "simple_cnn", "params": {"width": 8, "hidden": 16}},
        "data": {"train": {"name": "image_folder", "root": str(folder), "channels": 1},
                 "eval": {"name": "image_folder", "root": str(folder), "channels": 1}, "batch_size": 20},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}, "max_duration": "3ep", "eval_interval": "1ep",
    })
    metrics = train(spec)
    assert metrics["time/batch"] == 3 * (NUM // 20)
    assert metrics["eval/accuracy"] > 0.6  # three classes painted in distinct grays: learnable


def test_reading_leaves_the_global_rng_alone(folder):
    state = torch.get_rng_state()
    list(ImageFolderLoader(spec_for(folder, transforms={"crop": 6, "hflip": True}), batch_size=10, seed=1))
    assert torch.equal(torch.get_rng_state(), state)


def test_an_image_folder_on_s3_is_read_by_loader_workers(folder, s3_server):
    import fsspec

    root = s3_server.url("image-folder")
    fs = fsspec.filesystem("s3")
    for path in folder.rglob("*.png"):
        fs.pipe(f"{root}/{path.parent.name}/{path.name}", path.read_bytes())
    loader = ImageFolderLoader(spec_for(root, num_workers=2), batch_size=20, seed=5)
    local = ImageFolderLoader(spec_for(folder, num_workers=0), batch_size=20, seed=5)
    assert loader.classes == local.classes and served(loader) == served(local)
