"""Run logs in storage: ``{TESSERA_STORAGE_URL}/runs/{run_id}/logs/attempt-{n}.log``.

Ray keeps a job's driver log only as long as the Ray cluster lives; the service copies each
attempt's log here (``service.log_archive``) so it outlives the cluster. The layout mirrors
``workers.paths.attempt_log_url`` (the service cannot import workers); a test checks both agree.
"""

from __future__ import annotations

import secrets

from fastapi import Request
from fsspec.core import url_to_fs


def attempt_log_url(storage_url: str, run_id: str, attempt: int) -> str:
    """``{storage}/runs/{run_id}/logs/attempt-{attempt}.log``."""
    return f"{storage_url.rstrip('/')}/runs/{run_id}/logs/attempt-{attempt}.log"


class LogStore:
    """Write and read attempt logs under one storage URL (``file://`` or ``s3://``)."""

    def __init__(self, storage_url: str):
        self.storage_url = storage_url.rstrip("/")
        self.fs, _ = url_to_fs(self.storage_url)

    def _path(self, run_id: str, attempt: int) -> str:
        return url_to_fs(attempt_log_url(self.storage_url, run_id, attempt))[1]

    def save(self, run_id: str, attempt: int, text: str) -> None:
        """Store (replace) the attempt's log; readers see the old copy or the new one, never half."""
        path = self._path(run_id, attempt)
        data = text.encode()
        if "file" in self.fs.protocol:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            partial = f"{path}.{secrets.token_hex(4)}.partial"
            self.fs.pipe_file(partial, data)
            self.fs.mv(partial, path)
        else:  # an object store's PUT is atomic already
            self.fs.pipe_file(path, data)

    def read(self, run_id: str, attempt: int) -> bytes | None:
        """The stored log's bytes, or None if none was stored."""
        path = self._path(run_id, attempt)
        self.fs.invalidate_cache(path)
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError:
            return None


def get_log_store(request: Request) -> LogStore:
    """The app's ``LogStore`` on its settings' storage URL (built on first use)."""
    store = getattr(request.app.state, "log_store", None)
    if store is None:
        store = request.app.state.log_store = LogStore(request.app.state.settings.storage_url)
    return store
