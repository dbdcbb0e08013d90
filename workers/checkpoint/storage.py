"""Checkpoint storage behind a tiny protocol with ``str`` paths, over fsspec.

Local folders (``file://``) and object stores (``s3://bucket/prefix``, with ``AWS_ENDPOINT_URL``
for MinIO or moto) share the same retention and "latest" logic. Object stores have no real
folders: a "folder" exists once an object under its prefix does. Listings bypass fsspec's
directory cache, because another rank or process may have written since the last look.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Callable, Protocol, TypeVar

import fsspec

# URL building lives in workers.paths, which must not import this package: importing
# workers.checkpoint loads torch.distributed.checkpoint, seconds that the Ray job driver
# (which builds paths but never reads a checkpoint) should not pay.
from workers.paths import join, normalize_url  # noqa: F401  (re-exported)
from workers.s3_limits import bounded_fs

log = logging.getLogger(__name__)
T = TypeVar("T")


class Storage(Protocol):
    def isdir(self, path: str) -> bool: ...

    def isfile(self, path: str) -> bool: ...

    def listdir(self, path: str) -> list[str]: ...

    def remove(self, path: str) -> None: ...


class FsspecStorage:
    """``Storage`` over one fsspec file system; every path is a full URL."""

    def __init__(self, url: str):
        self.root = normalize_url(url)
        self.fs, _ = bounded_fs(self.root)  # S3's bounded waits and tries (workers.s3_limits)
        self.scheme = self.root.split("://", 1)[0]

    def _path(self, url: str) -> str:
        return bounded_fs(url)[1]

    def _url(self, path: str) -> str:
        return f"{self.scheme}://{path}" if self.scheme != "file" else f"file://{path}"

    def isdir(self, url: str) -> bool:
        self.fs.invalidate_cache()
        return self.fs.isdir(self._path(url))

    def isfile(self, url: str) -> bool:
        """Whether ``url`` is a file; a storage error raises. fsspec's own ``isfile`` answers False
        for any error (fsspec/asyn.py ``_isfile`` and spec.py ``isfile``, 2026.9): in an outage a
        committed checkpoint's marker read as absent, and retention deleted the checkpoint as torn."""
        self.fs.invalidate_cache()
        try:
            return self.fs.info(self._path(url))["type"] == "file"
        except FileNotFoundError:
            return False

    def listdir(self, url: str) -> list[str]:
        """Names (not paths) of the entries directly under ``url``; [] if it does not exist."""
        self.fs.invalidate_cache()
        path = self._path(url)
        if not self.fs.exists(path):
            return []
        return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(path, detail=False))

    def remove(self, url: str) -> None:
        """Delete a file or a whole folder; missing is fine."""
        path = self._path(url)
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache()

    def write_bytes(self, url: str, data: bytes) -> None:
        """Write ``data`` at ``url`` whole: a reader finds no file or all of it (the service, for
        one, reads an export as ready once its file exists). An object store's PUT is whole
        already; a local file is written aside and renamed into place."""
        path = self._path(url)
        if self.scheme != "file":
            with self.fs.open(path, "wb") as f:
                f.write(data)
            return
        folder = path.rsplit("/", 1)[0]
        self.fs.makedirs(folder, exist_ok=True)
        # Named apart from the file's own name: a reader that matches names (TensorBoard takes
        # any name with "tfevents" in it) must not pick the partial up.
        partial = f"{folder}/.tessera-{secrets.token_hex(4)}.partial"
        try:
            with self.fs.open(partial, "wb") as f:
                f.write(data)
            self.fs.mv(partial, path)  # os.rename: atomic within the folder's filesystem
        except BaseException:  # a full disk, a stopped worker: no partial left behind
            if self.fs.exists(partial):
                self.fs.rm(partial)
            raise

    def read_bytes(self, url: str) -> bytes:
        with self.fs.open(self._path(url), "rb") as f:
            return f.read()

    def size(self, url: str) -> int:
        """Total bytes under ``url``."""
        self.fs.invalidate_cache()
        try:
            return int(self.fs.du(self._path(url), total=True))
        except FileNotFoundError:
            return 0


def storage_for(url: str) -> FsspecStorage:
    return FsspecStorage(url)


def with_retries(fn: Callable[[], T], *, what: str, attempts: int = 3, first_delay_s: float = 0.5,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, retried with exponential backoff (object stores drop connections and throttle).
    Raises the last error once ``attempts`` are used up."""
    delay = first_delay_s
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts:
                raise
            log.warning("%s failed (attempt %d/%d: %s: %s); retrying in %.1fs",
                        what, attempt, attempts, type(exc).__name__, exc, delay)
            sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


__all__ = ["FsspecStorage", "Storage", "fsspec", "join", "normalize_url", "storage_for", "with_retries"]
