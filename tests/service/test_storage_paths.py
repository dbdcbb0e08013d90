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
