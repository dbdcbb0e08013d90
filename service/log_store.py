"""Job logs in storage: a run attempt's at ``{project storage}/runs/{run_id}/logs/attempt-{n}.log``,
a sweep driver attempt's at ``{project storage}/sweeps/{sweep_id}/logs/attempt-{n}.log``.

Ray keeps a job's driver log only as long as the Ray cluster lives (and only until the service
has it forget the job); the service copies each attempt's log here (``service.log_archive``)
so it outlives both. The URLs come from ``service.storage_paths``.
"""

from __future__ import annotations

from fastapi import Request
from fsspec.core import url_to_fs

from service.bounded_storage import DEFAULT_STORAGE_TIMEOUT_S, bounded
from service.code_store import write_whole
from service.db.models import DEFAULT_PROJECT
from service.storage_paths import attempt_log_url, project_storage_url, sweep_log_url

LOG_URLS = {"run": attempt_log_url, "sweep": sweep_log_url}  # by job kind (``JobKind.name``)
FINAL_SUFFIX = ".final"  # beside a log: the empty marker of a finished job's whole log


class LogStore:
    """Write and read attempt logs under a storage root (``file://`` or ``s3://``), each in its
    run's (or sweep's) folder under its project prefix, beside the checkpoints and exports."""

    def __init__(self, storage_url: str, *, timeout_s: float = DEFAULT_STORAGE_TIMEOUT_S):
        self.storage_url = storage_url.rstrip("/")
        self.fs, _ = url_to_fs(self.storage_url)
        self.timeout_s = timeout_s  # each save or read gives up after this (StorageTimeout)

    def _path(self, record_id: str, attempt: int, project: str, kind: str) -> str:
        return url_to_fs(LOG_URLS[kind](project_storage_url(self.storage_url, project), record_id, attempt))[1]

    def save(self, record_id: str, attempt: int, text: str, *, project: str = DEFAULT_PROJECT,
             kind: str = "run", final: bool = False) -> None:
        """Store (replace) the attempt's log; readers see the old copy or the new one, never half.
        ``kind``: ``"run"`` (``record_id`` is a run's) or ``"sweep"`` (a sweep driver's).
        ``final``: this is the log of a job that has finished, so nothing more will come: a
        marker beside it, written after it, says so (``is_final``)."""
        path = self._path(record_id, attempt, project, kind)
        bounded(f"saving log {path}", self.timeout_s, write_whole, self.fs, path, text.encode())
        if final:
            self.mark_final(record_id, attempt, project=project, kind=kind)

    def mark_final(self, record_id: str, attempt: int, *, project: str = DEFAULT_PROJECT, kind: str = "run") -> None:
        """Mark the stored log as its job's whole log: nothing more will come (``is_final``)."""
        path = self._path(record_id, attempt, project, kind) + FINAL_SUFFIX
        bounded(f"marking log {path} final", self.timeout_s, write_whole, self.fs, path, b"")

    def is_final(self, record_id: str, attempt: int, *, project: str = DEFAULT_PROJECT, kind: str = "run") -> bool:
        """Whether the stored log is its finished job's whole log (``mark_final``). A log stored
        before there were markers reads as not final until a reader finds Ray has forgotten its
        job, and marks it (``service.routes.logs``)."""
        path = self._path(record_id, attempt, project, kind) + FINAL_SUFFIX
        self.fs.invalidate_cache(path)
        return bool(bounded(f"looking for {path}", self.timeout_s, self.fs.exists, path))

    def read(self, record_id: str, attempt: int, *, project: str = DEFAULT_PROJECT,
             kind: str = "run") -> bytes | None:
        """The stored log's bytes, or None if none was stored."""
        path = self._path(record_id, attempt, project, kind)
        self.fs.invalidate_cache(path)
        try:
            return bounded(f"reading log {path}", self.timeout_s, self.fs.cat_file, path)
        except FileNotFoundError:
            return None


def get_log_store(request: Request) -> LogStore:
    """The app's ``LogStore`` on its settings' storage URL (built on first use)."""
    store = getattr(request.app.state, "log_store", None)
    if store is None:
        settings = request.app.state.settings
        store = request.app.state.log_store = LogStore(settings.storage_url, timeout_s=settings.storage_timeout_s)
    return store
