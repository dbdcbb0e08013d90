"""A worker's reports on local disk until the service has them: bounded, ordered, durable.

Every report a run's worker makes (status changes, metric batches, checkpoint reports) is
written here first and removed only once the service answered it, so an outage of the service
or its database loses nothing the worker measured, and a reporter that restarts (Ray Train
restarting the worker group on the same node) replays what the last one left, oldest first.

Layout: ``{root}/{run_id}/{seq:012d}.json``, one file per report, written to a temporary name
and renamed, so a SIGKILLed worker leaves whole entries only. The spool holds at most
``max_bytes``; past that ``put`` raises ``SpoolFull`` and the reporter holds training until
there is room (it never drops an entry to make some).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPOOL_DIR_ENV = "TESSERA_SPOOL_DIR"
SPOOL_MAX_BYTES_ENV = "TESSERA_SPOOL_MAX_BYTES"
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB: ~5 M points, hours of a busy run's metrics


class SpoolFull(RuntimeError):
    """The spool holds ``max_bytes`` already; nothing more is taken until entries are delivered."""


@dataclass(frozen=True)
class Entry:
    seq: int
    kind: str  # "status" | "metrics" | "checkpoint"
    body: dict[str, Any]


def default_spool_root() -> Path:
    """``TESSERA_SPOOL_DIR``, or ``tessera-spool`` in the system's temporary folder."""
    return Path(os.environ.get(SPOOL_DIR_ENV) or Path(tempfile.gettempdir()) / "tessera-spool")


def default_max_bytes() -> int:
    return int(os.environ.get(SPOOL_MAX_BYTES_ENV) or DEFAULT_MAX_BYTES)


class Spool:
    """The undelivered reports of one run, oldest first. Thread-safe: the training thread and
    the checkpoint writer put, the reporter's sender takes from the head."""

    def __init__(self, directory: Path, *, max_bytes: int | None = None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = default_max_bytes() if max_bytes is None else max_bytes
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}
        self._total = 0
        for path in self.directory.glob("*.json"):  # what an earlier reporter left
            if path.stem.isdigit():
                self._sizes[int(path.stem)] = path.stat().st_size
        for stale in self.directory.glob("*.tmp"):  # a write cut short by a kill
            stale.unlink(missing_ok=True)
        self._next = max(self._sizes, default=0) + 1
        self._total = sum(self._sizes.values())

    @classmethod
    def for_run(cls, run_id: str, *, root: Path | None = None, max_bytes: int | None = None) -> "Spool":
        return cls((root or default_spool_root()) / run_id, max_bytes=max_bytes)

    def put(self, kind: str, body: dict[str, Any]) -> int:
        """Append one report; returns its sequence number. Raises ``SpoolFull`` past ``max_bytes``
        (a single entry larger than the bound is still taken into an empty spool)."""
        data = json.dumps({"kind": kind, "body": body}, separators=(",", ":")).encode()
        with self._lock:
            if self._sizes and self.bytes + len(data) > self.max_bytes:
                raise SpoolFull(f"the report spool {self.directory} holds {self.bytes} bytes "
                                f"({SPOOL_MAX_BYTES_ENV}={self.max_bytes})")
            seq, self._next = self._next, self._next + 1
            tmp = self.directory / f"{seq:012d}.tmp"
            tmp.write_bytes(data)
            tmp.rename(self.directory / f"{seq:012d}.json")
            self._sizes[seq] = len(data)
            self._total += len(data)
            return seq

    def head(self) -> Entry | None:
        """The oldest undelivered report, or None."""
        with self._lock:
            if not self._sizes:
                return None
            seq = min(self._sizes)
        raw = json.loads((self.directory / f"{seq:012d}.json").read_bytes())
        return Entry(seq, raw["kind"], raw["body"])

    def last_put(self) -> int:
        """The sequence number of the newest report in the spool or delivered from it (0: none)."""
        with self._lock:
            return self._next - 1

    def holds_through(self, seq: int) -> bool:
        """Whether a report numbered ``seq`` or lower is still undelivered."""
        with self._lock:
            return bool(self._sizes) and min(self._sizes) <= seq

    def pop(self, seq: int) -> None:
        """Forget a delivered (or refused) report."""
        with self._lock:
            self._total -= self._sizes.pop(seq, 0)
        (self.directory / f"{seq:012d}.json").unlink(missing_ok=True)

    @property
    def bytes(self) -> int:
        return self._total

    def __len__(self) -> int:
        return len(self._sizes)

    def remove_if_empty(self) -> None:
        """Remove the run's folder once everything in it was delivered."""
        with self._lock:
            if not self._sizes:
                try:
                    self.directory.rmdir()
                except OSError:  # something else is in it (another reporter's entry): keep it
                    return

