"""The storage URLs the control plane reads and writes: the service's side of the layout that
``workers/paths.py`` owns for the workers (the service cannot import workers).

Every function here mirrors one of ``workers.paths``; ``tests/service/test_storage_paths.py``
checks that both build the same URL, so the layout has one definition per side and a test that
keeps them together.
"""

from __future__ import annotations

from service.db.models import DEFAULT_PROJECT

EXPORT_SUFFIXES = {"safetensors": "safetensors", "torch": "pt"}


def project_storage_url(root: str, project: str) -> str:
    """Where a project's runs, sweeps and code packages live: ``{root}/projects/{project}``; the
    ``default`` project keeps the root itself, so runs made before projects existed find their
    checkpoints where they left them. Workers get this as their ``TESSERA_STORAGE_URL``."""
    return root if project == DEFAULT_PROJECT else f"{root.rstrip('/')}/projects/{project}"


def run_url(storage_url: str, run_id: str) -> str:
    """``{storage}/runs/{run_id}`` (``workers.paths.run_url``)."""
    return f"{storage_url.rstrip('/')}/runs/{run_id}"


def code_url(storage_url: str, digest: str) -> str:
    """``{storage}/code/{digest}.zip`` (``workers.paths.code_package_url``)."""
    return f"{storage_url.rstrip('/')}/code/{digest}.zip"


def attempt_log_url(storage_url: str, run_id: str, attempt: int) -> str:
    """``{storage}/runs/{run_id}/logs/attempt-{attempt}.log`` (``workers.paths.attempt_log_url``)."""
    return f"{run_url(storage_url, run_id)}/logs/attempt-{attempt}.log"


def exports_url(storage_url: str, run_id: str) -> str:
    """``{storage}/runs/{run_id}/exports``."""
    return f"{run_url(storage_url, run_id)}/exports"


def export_url(storage_url: str, run_id: str, step: int, fmt: str) -> str:
    """``{storage}/runs/{run_id}/exports/step-{step}.{safetensors|pt}`` (``workers.paths.export_url``)."""
    return f"{exports_url(storage_url, run_id)}/step-{step}.{EXPORT_SUFFIXES[fmt]}"


def ray_attempt_url(storage_url: str, run_id: str, attempt: int) -> str:
    """``{storage}/ray/attempt-{n}/tessera-{run_id}``: Ray Train's own folder for one attempt
    (``workers.paths.ray_storage_path`` and the ``RunConfig`` name in ``workers.ray_train``)."""
    return f"{storage_url.rstrip('/')}/ray/attempt-{attempt}/tessera-{run_id}"


def sweep_url(storage_url: str, sweep_id: str) -> str:
    """``{storage}/sweeps/{sweep_id}``, the folder of ``workers.paths.sweep_experiment_path``."""
    return f"{storage_url.rstrip('/')}/sweeps/{sweep_id}"


def sweep_log_url(storage_url: str, sweep_id: str, attempt: int) -> str:
    """``{storage}/sweeps/{sweep_id}/logs/attempt-{attempt}.log``: a sweep driver attempt's log,
    which the service alone writes (``service.log_archive``)."""
    return f"{sweep_url(storage_url, sweep_id)}/logs/attempt-{attempt}.log"


def export_jobs_url(storage_root: str) -> str:
    """``{root}/export-jobs``: the marks of this service's model export jobs (``export_job_url``)."""
    return f"{storage_root.rstrip('/')}/export-jobs"


def export_job_url(storage_root: str, job_id: str) -> str:
    """``{root}/export-jobs/{job_id}.json``: marks a model export's Ray job as this service's
    from before it is submitted until Ray has forgotten it (``service.export_jobs``); under the
    root, as the run's own folder may be deleted first."""
    return f"{export_jobs_url(storage_root)}/{job_id}.json"
