"""The worker's own check of data-set roots: a spec that reached a worker must not read a
path outside ``TESSERA_DATA_DIRS``, symlinks included."""

from __future__ import annotations

import pytest

from api.data_specs import WebDatasetSpec
from api.specs import FashionMNISTSpec
from workers.data import build_dataset, check_root


def test_a_worker_refuses_a_root_outside_the_data_dirs_through_a_symlink(tmp_path, monkeypatch):
    (tmp_path / "sets").mkdir()
    (tmp_path / "sets" / "escape").symlink_to("/etc")
    monkeypatch.setenv("TESSERA_SERVICE_URL", "http://tessera.test:8000")
    monkeypatch.setenv("TESSERA_DATA_DIRS", str(tmp_path / "sets"))
    spec = FashionMNISTSpec(name="fashion_mnist", root=str(tmp_path / "sets" / "escape"))
    with pytest.raises(PermissionError, match=r"root .*escape.*TESSERA_DATA_DIRS"):
        build_dataset(spec)


def test_a_root_inside_the_data_dirs_gets_to_the_loader(tmp_path, monkeypatch):
    (tmp_path / "sets" / "fmnist").mkdir(parents=True)
    monkeypatch.setenv("TESSERA_SERVICE_URL", "http://tessera.test:8000")
    monkeypatch.setenv("TESSERA_DATA_DIRS", str(tmp_path / "sets"))
    spec = FashionMNISTSpec(name="fashion_mnist", root=str(tmp_path / "sets" / "fmnist"))
    with pytest.raises(FileNotFoundError):  # allowed: the loader looks, and finds no files there
        build_dataset(spec)


def test_a_worker_checks_each_shard_of_a_urls_pattern_with_symlinks_resolved(tmp_path, monkeypatch):
    shards = tmp_path / "sets" / "shards"
    shards.mkdir(parents=True)
    (shards / "train-000000.tar").write_bytes(b"")
    (shards / "train-000001.tar").symlink_to(tmp_path / "elsewhere.tar")  # the second shard escapes
    monkeypatch.setenv("TESSERA_SERVICE_URL", "http://tessera.test:8000")
    monkeypatch.setenv("TESSERA_DATA_DIRS", str(tmp_path / "sets"))
    spec = WebDatasetSpec(name="webdataset", urls=str(shards / "train-{000000..000001}.tar"), num_samples=8)
    with pytest.raises(PermissionError, match=r"urls .*train-000001\.tar.*TESSERA_DATA_DIRS"):
        check_root(spec)
    check_root(spec.model_copy(update={"urls": str(shards / "train-000000.tar")}))  # the first alone is fine
