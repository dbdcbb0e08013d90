"""Where everything lives in storage: the one module that builds storage URLs and paths.

Layout under the storage root (``TESSERA_STORAGE_URL``, ``file://`` or ``s3://``; a local
``tessera train`` uses ``--checkpoint-dir`` the same way)::

    runs/{run_id}/
        checkpoints/ep{E}-ba{B}/   one checkpoint (its files: ``workers.checkpoint.manager``)
        attempts/{n}.started       rank 0's marker: this job attempt started training once
        logs/attempt-{n}.log       attempt n's Ray job log, copied by the service
        logs/attempt-{n}.log.final empty: that copy is its finished job's whole log
        exports/step-{N}.{safetensors,pt}  the trained model as one file (``workers.export``)
        tensorboard/               TensorBoard event files of the spec's tensorboard logger
    ray/attempt-{n}/               Ray Train's own storage for attempt n
    sweeps/{sweep_id}/tune/        the sweep's Tune experiment (restored by a restarted driver)
    code/{sha256}.zip              a code package, named by the hash of its bytes

Ray Train and Tune take local *paths* (not ``file://`` URLs) for local storage, so the
``ray/`` and ``sweeps/`` entries are paths for ``file://`` roots and URLs otherwise; every
other entry is an fsspec URL.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts)])


def normalize_url(url: str) -> str:
    """An fsspec URL: a bare path becomes ``file:///abs/path``."""
    if "://" in url:
        return url.rstrip("/")
    return "file://" + os.path.abspath(url)

TUNE_EXPERIMENT = "tune"  # the Tune experiment's name: the last folder of sweep_experiment_path


def tessera_home() -> Path:
    """``$TESSERA_HOME`` (default ``.tessera``) as an absolute path: Ray workers run in Ray's
    session folder, so relative paths would land there."""
    return Path(os.environ.get("TESSERA_HOME", ".tessera")).resolve()


def default_ray_storage_path() -> str:
    """``$TESSERA_HOME/ray``: Ray Train's and Tune's storage when no storage URL is set."""
    return str(tessera_home() / "ray")


def default_local_root() -> str:
    """``$TESSERA_HOME/local``: the storage root of ``tessera train`` runs."""
    return str(tessera_home() / "local")


def run_url(storage_url: str, run_id: str) -> str:
    """``{storage}/runs/{run_id}``: the run's checkpoints and attempt markers live under it."""
    return join(normalize_url(storage_url), "runs", run_id)


def checkpoints_url(run: str) -> str:
    """``{run}/checkpoints``, for the run folder ``run`` (see ``run_url``)."""
    return join(run, "checkpoints")


def attempts_url(run: str) -> str:
    """``{run}/attempts``: one marker per job attempt that started training."""
    return join(run, "attempts")


def attempt_marker_url(run: str, attempt: int) -> str:
    """``{run}/attempts/{attempt}.started``."""
    return join(attempts_url(run), f"{attempt}.started")


def attempt_log_url(run: str, attempt: int) -> str:
    """``{run}/logs/attempt-{attempt}.log``: the service copies the attempt's Ray job log here
    (``service.storage_paths.attempt_log_url`` builds the same URL; the service cannot import workers)."""
    return join(run, "logs", f"attempt-{attempt}.log")


def run_of_checkpoints(checkpoints: str) -> str:
    """The run folder of a ``checkpoints_url``: its parent."""
    return checkpoints.rstrip("/").rsplit("/", 1)[0]


def export_url(run: str, step: int, fmt: str) -> str:
    """``{run}/exports/step-{step}.safetensors`` (``fmt="safetensors"``) or ``.pt`` (``fmt="torch"``)."""
    suffix = {"safetensors": "safetensors", "torch": "pt"}[fmt]
    return join(run, "exports", f"step-{step}.{suffix}")


def tensorboard_url(run: str) -> str:
    """``{run}/tensorboard``: the tensorboard logger's event files (``workers.loggers``)."""
    return join(run, "tensorboard")


def code_package_url(storage_url: str, sha256: str) -> str:
    """``{storage}/code/{sha256}.zip``."""
    return join(normalize_url(storage_url), "code", f"{sha256}.zip")


def _ray_root(storage_url: str) -> str:
    """The storage root as Ray takes it: a local path for ``file://`` (or a bare path), else the URL."""
    parsed = urlparse(storage_url)
    root = parsed.path if parsed.scheme in ("", "file") else storage_url
    return root.rstrip("/")


def ray_storage_path(storage_url: str | None, *, attempt: int) -> str | None:
    """Ray Train's storage for one attempt, ``{storage}/ray/attempt-{n}``; None without storage."""
    if not storage_url:
        return None
    return f"{_ray_root(storage_url)}/ray/attempt-{attempt}"


def _sweep_folder(storage_url: str | None, sweep_id: str) -> str:
    """``{storage}/sweeps/{sweep_id}``; without a storage URL, under ``$TESSERA_HOME/ray``."""
    root = _ray_root(storage_url) if storage_url else default_ray_storage_path()
    return f"{root.rstrip('/')}/sweeps/{sweep_id}"


def sweep_experiment_path(storage_url: str | None, sweep_id: str) -> str:
    """``{storage}/sweeps/{sweep_id}/tune``; without a storage URL, under ``$TESSERA_HOME/ray``."""
    return f"{_sweep_folder(storage_url, sweep_id)}/{TUNE_EXPERIMENT}"


def failed_trials_url(storage_url: str | None, sweep_id: str) -> str:
    """``{storage}/sweeps/{sweep_id}/failed-trials``: a trial that failed for a reason a retry
    would not fix leaves its error there as a file named by its trial id, so that Tune's retries
    of it fail at once. Worked out in the driver: a trial actor runs in another folder."""
    return f"{_sweep_folder(storage_url, sweep_id)}/failed-trials"
