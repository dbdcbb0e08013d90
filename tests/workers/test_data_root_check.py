"""The worker's own check of data-set roots: a spec that reached a worker must not read a
path outside ``TESSERA_DATA_DIRS``, symlinks included."""

from __future__ import annotations

import pytest

from api.specs import FashionMNISTSpec
from workers.data import build_dataset


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
