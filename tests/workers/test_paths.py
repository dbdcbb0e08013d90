"""The storage layout: every URL and path the workers build comes from ``workers.paths``."""

from workers.paths import (attempt_marker_url, checkpoints_url, code_package_url, ray_storage_path, run_url,
                           sweep_experiment_path)


def test_a_runs_folders_are_urls_under_runs_for_any_storage_root():
    assert run_url("/data/store/", "r1") == "file:///data/store/runs/r1"
    assert checkpoints_url(run_url("s3://bucket/root", "r1")) == "s3://bucket/root/runs/r1/checkpoints"
    assert attempt_marker_url(run_url("file:///d", "r1"), 2) == "file:///d/runs/r1/attempts/2.started"


def test_code_packages_are_named_by_their_hash():
    assert code_package_url("s3://bucket/root/", "ab12") == "s3://bucket/root/code/ab12.zip"


def test_ray_and_tune_get_local_paths_for_file_roots_and_urls_otherwise():
    assert ray_storage_path("file:///d", attempt=3) == "/d/ray/attempt-3"
    assert sweep_experiment_path("s3://b/r", "sw1") == "s3://b/r/sweeps/sw1/tune"
    assert sweep_experiment_path(None, "sw1").endswith("/ray/sweeps/sw1/tune")
