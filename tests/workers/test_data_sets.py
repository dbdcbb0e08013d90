"""Data sets and the sharded TensorLoader."""

import pytest
import torch

from api.specs import DigitsSpec, FashionMNISTSpec, SyntheticSpec
from workers.data import TensorLoader, build_dataset, num_classes_of

FASHION_ROOT = "/usr/share/datasets/fashion-mnist"


def test_digits_split_into_1437_train_and_360_test_images():
    train_x, train_y = build_dataset(DigitsSpec(name="digits", split="train", image_size=32))
    test_x, test_y = build_dataset(DigitsSpec(name="digits", split="test", image_size=32))
    assert train_x.shape == (1437, 1, 32, 32) and train_y.shape == (1437,)
    assert test_x.shape == (360, 1, 32, 32) and test_y.shape == (360,)
    assert train_x.dtype == torch.float32 and train_y.dtype == torch.int64
    assert set(train_y.tolist()) == set(range(10))


def test_digits_are_normalized_and_the_same_on_every_call():
    x1, y1 = build_dataset(DigitsSpec(name="digits", image_size=16))
    x2, y2 = build_dataset(DigitsSpec(name="digits", image_size=16))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert abs(x1.mean().item()) < 1e-4 and abs(x1.std().item() - 1.0) < 1e-3


@pytest.mark.skipif(not __import__("os").path.isdir(FASHION_ROOT), reason="dataset-fashion-mnist not installed")
def test_fashion_mnist_reads_the_idx_files_with_limit_and_resize():
    x, y = build_dataset(FashionMNISTSpec(name="fashion_mnist", split="test", limit=100, image_size=32))
    assert x.shape == (100, 1, 32, 32) and y.shape == (100,) and y.max() <= 9
    full_x, _ = build_dataset(FashionMNISTSpec(name="fashion_mnist", split="test"))
    assert full_x.shape == (10000, 1, 28, 28)
    assert abs(full_x.mean().item()) < 0.05  # the published mean/std normalize it


def test_missing_fashion_mnist_files_raise_an_error_saying_where_and_how_to_install(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        build_dataset(FashionMNISTSpec(name="fashion_mnist", root=str(tmp_path / "nope")))
    message = str(info.value)
    assert str(tmp_path / "nope") in message
    assert "train-images-idx3-ubyte.gz" in message and "t10k-labels-idx1-ubyte.gz" in message
    assert "apt-get install dataset-fashion-mnist" in message


def test_synthetic_data_has_the_requested_shape_and_is_deterministic():
    spec = SyntheticSpec(name="synthetic", num_samples=50, num_classes=4, channels=2, image_size=12)
    x, y = build_dataset(spec)
    assert x.shape == (50, 2, 12, 12) and y.max() < 4
    assert torch.equal(x, build_dataset(spec)[0])
    assert num_classes_of(spec) == 4


def test_synthetic_train_and_test_splits_are_different_samples():
    train_x, _ = build_dataset(SyntheticSpec(name="synthetic", num_samples=64, split="train"))
    test_x, _ = build_dataset(SyntheticSpec(name="synthetic", num_samples=64, split="test"))
    distances = torch.cdist(train_x.flatten(1), test_x.flatten(1))
    assert distances.min() > 1.0


def loaders(n, *, world_size, batch_size, **kwargs):
    x = torch.arange(n).float().view(n, 1)
    y = torch.arange(n)
    return [TensorLoader(x, y, batch_size=batch_size, rank=r, world_size=world_size, **kwargs)
            for r in range(world_size)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_eval_shards_cover_every_index_exactly_once_across_ranks(world_size):
    seen = []
    for loader in loaders(103, world_size=world_size, batch_size=8 * world_size, shuffle=False,
                          drop_last=False, pad=False):
        for _, labels in loader:
            assert len(labels) <= 8
            seen += labels.tolist()
    assert sorted(seen) == list(range(103))


@pytest.mark.parametrize("drop_last", [True, False])
def test_train_shards_give_every_rank_the_same_number_of_batches(drop_last):
    ranks = loaders(103, world_size=3, batch_size=12, drop_last=drop_last, seed=5)
    batches = [[labels.tolist() for _, labels in loader] for loader in ranks]
    assert len({len(b) for b in batches}) == 1
    assert all(len(batch) == 4 for rank in batches for batch in rank[:-1])
    if drop_last:
        flat = [i for rank in batches for batch in rank for i in batch]
        assert len(flat) == len(set(flat)) == 103 // 12 * 12


def test_each_epoch_uses_a_new_permutation_shared_by_all_ranks():
    first, second = loaders(40, world_size=2, batch_size=8, seed=1)
    epoch0 = [[l.tolist() for _, l in loader] for loader in (first, second)]
    for loader in (first, second):
        loader.set_epoch(1)
    epoch1 = [[l.tolist() for _, l in loader] for loader in (first, second)]
    assert epoch0 != epoch1
    for epoch in (epoch0, epoch1):
        flat = sorted(i for rank in epoch for batch in rank for i in batch)
        assert flat == list(range(40))


def test_loader_position_resumes_mid_epoch():
    (loader,) = loaders(40, world_size=1, batch_size=8, seed=3)
    all_batches = [l.tolist() for _, l in loader]
    loader.set_epoch(0)
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = loader.state_dict()
    (resumed,) = loaders(40, world_size=1, batch_size=8, seed=3)
    resumed.load_state_dict(state)
    assert state == {"epoch": 0, "batch_in_epoch": 2}
    assert [l.tolist() for _, l in resumed] == all_batches[2:]
    assert resumed.exhausted


@pytest.mark.parametrize("gather_bytes", [1, 3 * 8 * 4, 1 << 20])  # runs of 1, 3 and every batch
@pytest.mark.parametrize("drop_last", [True, False])
def test_batches_gathered_in_runs_are_the_indexed_batches_and_resume_mid_run(monkeypatch, gather_bytes, drop_last):
    # The loader gathers several batches at once and hands out views: the values, their order,
    # a short last batch and a resume inside a run must be what indexing batch by batch gives.
    import workers.data.loader as loader_module

    monkeypatch.setattr(loader_module, "GATHER_BYTES", gather_bytes)
    (loader,) = loaders(44, world_size=1, batch_size=8, seed=7, drop_last=drop_last)
    expected = [(loader.images[idx], loader.labels[idx])
                for idx in loader._shard_indices(0).split(loader.per_rank_batch)]
    assert len(expected) == (5 if drop_last else 6)
    got = list(loader)
    assert len(got) == len(expected) and loader.exhausted
    for (images, labels), (want_images, want_labels) in zip(got, expected):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
    got[0][0].fill_(-1.0)  # a batch changed in place (an algorithm may) leaves the data set as it was
    assert loader.images.min() == 0
    (resumed,) = loaders(44, world_size=1, batch_size=8, seed=7, drop_last=drop_last)
    resumed.load_state_dict({"epoch": 0, "batch_in_epoch": 4})
    assert [labels.tolist() for _, labels in resumed] == [labels.tolist() for _, labels in expected[4:]]
    # A position moved under a paused iterator is followed: two iterators taking turns share one
    # position, and a load_state_dict mid-run jumps there (the loader indexed by position before).
    loader.set_epoch(0)
    first, second = iter(loader), iter(loader)
    turns = [next(first)[1], next(second)[1], next(first)[1]]
    assert [t.tolist() for t in turns] == [labels.tolist() for _, labels in expected[:3]]
    loader.load_state_dict({"epoch": 0, "batch_in_epoch": 1})
    assert [labels.tolist() for _, labels in first] == [labels.tolist() for _, labels in expected[1:]]


def test_a_batch_larger_than_the_data_set_with_drop_last_is_refused():
    with pytest.raises(ValueError, match="no full batch"):
        loaders(10, world_size=1, batch_size=16)


def test_shakespeare_windows_are_next_character_pairs_over_84_characters():
    from api.specs import ShakespeareSpec
    from workers.data.shakespeare import shakespeare_vocabulary

    inputs, targets = build_dataset(ShakespeareSpec(name="shakespeare", seq_len=64, limit=100))
    assert inputs.shape == targets.shape == (100, 64) and inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets: the same text one character later
    assert torch.equal(inputs[1:, 0], targets[:-1, -1])  # windows are contiguous
    vocab = shakespeare_vocabulary()
    assert len(vocab) == 84 == num_classes_of(ShakespeareSpec(name="shakespeare")) and inputs.max() < 84
    assert "".join(vocab[i] for i in inputs[0, :25].tolist()).startswith("ALL'S WELL THAT ENDS WELL")


def test_shakespeare_split_is_fixed_disjoint_and_matches_the_catalog():
    from api.catalog import DATASETS
    from api.specs import ShakespeareSpec

    train, _ = build_dataset(ShakespeareSpec(name="shakespeare", split="train"))
    test, _ = build_dataset(ShakespeareSpec(name="shakespeare", split="test"))
    info = DATASETS["shakespeare"]
    assert (len(train), len(test)) == (info.num_train, info.num_test)
    again, _ = build_dataset(ShakespeareSpec(name="shakespeare", split="test"))
    assert torch.equal(test, again)
    # The test split is the last 10% of each play: its first window is not in the training text.
    assert not (train == test[0]).all(dim=1).any()
