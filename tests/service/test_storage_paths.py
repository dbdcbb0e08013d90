"""The service's storage URLs (``service.storage_paths``) equal the workers' (``workers.paths``):
the service reads what workers write (exports, code packages) and writes what they never touch
under the same run folders (logs), so one layout must hold on both sides."""

from __future__ import annotations

import pytest

from service import storage_paths as service_paths
from workers import paths as worker_paths

STORAGE = ["s3://bucket/prefix", "file:///srv/tessera"]


@pytest.mark.parametrize("storage", STORAGE)
def test_a_runs_folder_log_and_exports_are_where_the_workers_put_them(storage):
    run = worker_paths.run_url(storage, "abc")
    assert service_paths.run_url(storage, "abc") == run
    assert service_paths.attempt_log_url(storage, "abc", 3) == worker_paths.attempt_log_url(run, 3)
    for fmt in ("safetensors", "torch"):
        assert service_paths.export_url(storage, "abc", 7, fmt) == worker_paths.export_url(run, 7, fmt)


@pytest.mark.parametrize("storage", STORAGE)
def test_a_code_package_is_where_the_workers_fetch_it(storage):
    digest = "0" * 64
    assert service_paths.code_url(storage, digest) == worker_paths.code_package_url(storage, digest)


def test_the_default_project_keeps_the_root_and_others_get_a_prefix():
    assert service_paths.project_storage_url("s3://b/t", "default") == "s3://b/t"
    assert service_paths.project_storage_url("s3://b/t/", "vision") == "s3://b/t/projects/vision"


@pytest.mark.parametrize("storage", STORAGE)
def test_ray_and_sweep_folders_that_deletion_removes_are_where_the_workers_write(storage):
    # Ray Train names an attempt's folder after the RunConfig name in workers.ray_train: tessera-{run_id}
    local = storage.removeprefix("file://")
    ray = worker_paths.ray_storage_path(storage, attempt=2)
    assert service_paths.ray_attempt_url(storage, "abc", 2).removeprefix("file://") == f"{ray}/tessera-abc"
    assert ray.startswith(local)
    tune = worker_paths.sweep_experiment_path(storage, "s1")
    assert tune.startswith(service_paths.sweep_url(storage, "s1").removeprefix("file://") + "/")
