"""Data-set roots: local ones must lie under the configured data directories."""

from __future__ import annotations

import pytest

from api.data_roots import data_root_problems, root_problem
from api.specs import RunSpec

DEFAULT = "/usr/share/datasets/fashion-mnist"


@pytest.mark.parametrize("root, allowed", [
    (DEFAULT, True),                      # the built-in default
    ("/data/fmnist", True),
    ("/data", True),
    ("/data/../etc", False),              # normalised before the check
    ("/database", False),                 # a prefix of the name is not a parent folder
    ("/etc", False),
    ("data/fmnist", False),               # relative: refused
    ("file:///etc", False),
    ("s3://bucket/fmnist", True),         # remote: not a worker path
    ("/data/shards/train-{000000..000003}.tar", True),    # a WebDataset brace pattern
    ("/data/{train,extra}-{000..003}.tar", True),
    ("/data/{..,x}/etc/passwd", False),   # braces that could expand to '..', which normalising would not catch
    ("/data/.{.,}/etc/passwd", False),
    ("/data/{.,x}{.,y}/etc", False),
    ("/data/{a,{b,c}}.tar", False),       # nested groups: refused rather than reasoned about
    ("/etc/hostname::s3://bucket/x", False),   # fsspec opens the outer, local path
    ("/data/x::file:///etc", False),
    ("file:///data/fmnist", True),
    ("/tmp/shards/train-{000000..000003}.tar", False),
])
def test_a_root_is_allowed_only_under_the_data_dirs(root, allowed):
    assert (root_problem(root, DEFAULT, ["/data", "/scratch/sets"]) is None) is allowed


def test_the_worker_check_follows_symlinks(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "escape").symlink_to("/etc")
    assert root_problem(str(tmp_path / "data" / "escape"), DEFAULT, [str(tmp_path / "data")]) is None
    assert "TESSERA_DATA_DIRS" in root_problem(str(tmp_path / "data" / "escape"), DEFAULT,
                                                [str(tmp_path / "data")], resolve=True)


@pytest.mark.parametrize("train, field", [
    ({"name": "webdataset", "urls": "/tmp/shards/train-{000000..000003}.tar", "num_samples": 8}, "urls"),
    ({"name": "image_folder", "root": "/tmp/images"}, "root"),
])
def test_the_submit_check_names_the_field_and_no_missing_default(train, field):
    spec = RunSpec.model_validate({
        "name": "roots", "model": {"name": "simple_cnn"}, "optimizer": {"name": "sgd", "lr": 0.1},
        "max_duration": "1ep", "data": {"batch_size": 8, "train": train}})
    [(named, root, why)] = data_root_problems(spec, ["/data"])
    assert (named, root) == (f"data.train.{field}", train[field])
    # Neither field has a built-in default to offer (pydantic's would print as PydanticUndefined).
    assert why == "local data roots must lie under the data directories (TESSERA_DATA_DIRS: /data)"
