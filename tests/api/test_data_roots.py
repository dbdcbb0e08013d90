"""Data-set roots: local ones must lie under the configured data directories."""

from __future__ import annotations

import pytest

from api.data_roots import root_problem

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
])
def test_a_root_is_allowed_only_under_the_data_dirs(root, allowed):
    assert (root_problem(root, DEFAULT, ["/data", "/scratch/sets"]) is None) is allowed


def test_the_worker_check_follows_symlinks(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "escape").symlink_to("/etc")
    assert root_problem(str(tmp_path / "data" / "escape"), DEFAULT, [str(tmp_path / "data")]) is None
    assert "TESSERA_DATA_DIRS" in root_problem(str(tmp_path / "data" / "escape"), DEFAULT,
                                                [str(tmp_path / "data")], resolve=True)
