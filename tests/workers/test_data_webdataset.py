"""WebDataset shards on moto's S3 (over HTTP), written by ``tessera data pack``: each sample once
per epoch across 2 ranks x 2 loader workers, a per-epoch order, and an exact mid-epoch resume."""

from __future__ import annotations

import pytest
import torch

from api.data_specs import WebDatasetSpec
from tests.workers.data_helpers import indices_of, served, write_indexed_folder
from workers.data.pack import pack
from workers.data.webdataset_loader import WebDatasetLoader

NUM = 240  # 8 shards of 30


@pytest.fixture(scope="module")
def shards(s3_server, tmp_path_factory):
    folder = write_indexed_folder(tmp_path_factory.mktemp("indexed"), NUM)
    return pack(str(folder), s3_server.url("wds-indexed"), shard_size=30)


def spec_for(shards, **overrides) -> WebDatasetSpec:
    body = {"name": "webdataset", "urls": shards.urls, "num_samples": shards.num_samples, "channels": 1,
            "num_classes": 4, "num_workers": 2, "shuffle_buffer": 50}
    return WebDatasetSpec.model_validate({**body, **overrides})


def loaders(spec, *, world_size=2, batch_size=24, seed=3, **kwargs):
    return [WebDatasetLoader(spec, batch_size=batch_size, rank=r, world_size=world_size, seed=seed, **kwargs)
            for r in range(world_size)]


def epoch_of(ranks, epoch):
    out = []
    for loader in ranks:
        loader.set_epoch(epoch)
        out.append(served(loader))
    return out


def test_pack_reports_the_pattern_and_count(shards):
    assert shards.num_samples == NUM and shards.num_shards == 8 and shards.num_classes == 4
    assert shards.urls.endswith("/train-{000000..000007}.tar")


def test_each_sample_once_per_epoch_across_two_ranks_and_two_workers(shards):
    ranks = loaders(spec_for(shards))
    assert [len(r) for r in ranks] == [NUM // 24] * 2
    first = epoch_of(ranks, 0)
    assert [len(x) for x in first] == [NUM // 2] * 2  # equal steps on every rank
    assert sorted(first[0] + first[1]) == list(range(NUM))
    second = epoch_of(ranks, 1)
    assert sorted(second[0] + second[1]) == list(range(NUM)) and second != first  # a new order each epoch
    assert epoch_of(loaders(spec_for(shards)), 0) == first  # and the same order for the same (seed, epoch)
    assert first[0] != sorted(first[0])  # the shuffle buffer mixes samples within the shards


def test_labels_and_transforms_follow_the_spec(shards):
    spec = spec_for(shards, transforms={"resize": 16, "crop": 12, "hflip": True,
                                        "normalize": {"mean": [0.5], "std": [0.25]}}, num_workers=0)
    images, labels = next(iter(loaders(spec, world_size=1)[0]))
    assert images.shape == (24, 1, 12, 12) and images.dtype == torch.float32 and labels.dtype == torch.int64
    assert set(labels.tolist()) <= {0, 1, 2, 3}


@pytest.mark.parametrize("stop_after", [1, 3])
def test_state_dict_mid_epoch_resumes_with_exactly_the_remaining_samples(shards, stop_after):
    spec = spec_for(shards)
    uninterrupted = []
    for loader in loaders(spec):
        loader.set_epoch(2)
        uninterrupted.append(served(loader))
    for rank, loader in enumerate(loaders(spec)):
        loader.set_epoch(2)
        before = served(loader, limit=stop_after)
        state = loader.state_dict()
        assert state["epoch"] == 2 and state["batch_in_epoch"] == stop_after
        fresh = loaders(spec)[rank]
        fresh.load_state_dict(state)
        after = served(fresh)
        assert before + after == uninterrupted[rank]  # no repeats, no skips, same order
        assert fresh.exhausted


def test_bitwise_equal_batches_after_resume_with_random_transforms(shards):
    spec = spec_for(shards, transforms={"crop": 6, "hflip": True})
    full = list(loaders(spec, world_size=1)[0])
    resumed = loaders(spec, world_size=1)[0]
    resumed.load_state_dict({"epoch": 0, "batch_in_epoch": 4})
    rest = list(resumed)
    assert len(rest) == len(full) - 4
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(full[4:], rest))


def test_eval_loader_reads_every_sample_once_without_shuffling(shards):
    ranks = loaders(spec_for(shards), batch_size=50, train=False)
    served_by_rank = epoch_of(ranks, 0)
    assert sorted(served_by_rank[0] + served_by_rank[1]) == list(range(NUM))


def test_uneven_shards_pad_so_every_rank_takes_the_same_steps(s3_server, tmp_path):
    folder = write_indexed_folder(tmp_path / "uneven", 100)
    uneven = pack(str(folder), s3_server.url("wds-uneven"), shard_size=30)  # 30, 30, 30, 10
    ranks = loaders(spec_for(uneven, shuffle_buffer=0), batch_size=20)
    counts = [len(x) for x in epoch_of(ranks, 0)]
    assert counts == [50, 50]  # num_samples // batch_size = 5 steps of 10 on each rank


def test_indices_helper_reads_what_the_folder_wrote(tmp_path):
    from torchvision.io import decode_image
    folder = write_indexed_folder(tmp_path / "f", 300)
    image = decode_image(str(folder / "class_3" / "img_00299.png")).float().div(255).unsqueeze(0)
    assert indices_of(image) == [299]


def test_reading_leaves_the_global_rng_alone(shards):
    """The trainer checkpoints torch's global RNG for augmentations; a loader must not draw from it."""
    state = torch.get_rng_state()
    list(loaders(spec_for(shards), world_size=1)[0])
    assert torch.equal(torch.get_rng_state(), state)


def test_resuming_on_another_world_size_keeps_the_epoch_and_the_steps_left(shards):
    two = loaders(spec_for(shards))
    for loader in two:
        loader.set_epoch(1)
        served(loader, limit=4)
    one = loaders(spec_for(shards), world_size=1)[0]
    one.load_state_dict(two[0].state_dict())  # 4 global batches of 24 done, saved on 2 ranks
    rest = served(one)
    assert one.epoch == 1 and len(rest) == NUM - 4 * 24 and len(set(rest)) == len(rest)
