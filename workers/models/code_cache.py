"""The code cache: folders of a worker's machine that hold what a run's code needs (its
unpacked code package, its installed pip requirements), shared by the runs on the machine.

The cache is ``$TESSERA_CODE_CACHE``, default ``/tmp/tessera-code-{uid}``. It is trusted only as
far as this user alone can change it: a cache folder another user owns or can write to is
refused (a shared ``/tmp`` lets anyone make a folder first), a missing one is made private
(0700), and a folder in it counts only if it is private and holds the marker written once its
content was complete (``place``); any other is made again.

It is pruned: a process that imports from a folder holds a shared lock on the folder's
``.{name}.inuse`` file for as long as it lives (``hold``; loader worker processes forked from it
share it) and sets that file's time, the folder's last use. Whenever a run's code is installed,
the folders last used more than ``$TESSERA_CODE_CACHE_KEEP_DAYS`` ago (default 7) that no process
holds and none is placing are removed (``prune``), with their two lock files. A process that
opened a lock file just before a prune deleted it gets its lock on a file that is gone; it checks,
once granted, that the lock file is still the one at its path, and locks again if it is not
(``_locked``), so no two processes ever lock different files for one folder.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import IO, Callable

log = logging.getLogger(__name__)


class UserCodeError(RuntimeError):
    """The run's code could not be fetched, imported or called; the message says which and
    ends with the traceback's tail. One string, so it pickles across Ray."""


# In a placed folder: the folder's own name (a package's digest), written once its content is complete.
VERIFIED_MARKER = ".tessera-sha256"
KEEP_DAYS_ENV = "TESSERA_CODE_CACHE_KEEP_DAYS"
DEFAULT_KEEP_DAYS = 7.0

# The folders this process imports from, by path: the open ``.inuse`` file it holds a shared lock on.
_HELD: dict[str, IO[str]] = {}


def code_cache_dir() -> Path:
    """``$TESSERA_CODE_CACHE``, else a folder of this user's in the temporary directory."""
    default = Path(tempfile.gettempdir()) / f"tessera-code-{os.getuid()}"
    return Path(os.environ.get("TESSERA_CODE_CACHE") or default)


def _private(path: Path) -> str | None:
    """Why ``path`` is no folder only this user can change (``lstat``: a link does not count),
    or None when it is one."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return "is not a folder (a link, or a file)"
    if info.st_uid != os.getuid():
        return f"belongs to another user (uid {info.st_uid})"
    if info.st_mode & 0o022:
        return f"can be written by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def own_cache(root: Path) -> Path:
    """``root``, made private (0700) if missing; ``UserCodeError`` unless only this user can
    change it: anyone who could would choose what this process imports under a digest's name."""
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = _private(root)
    except OSError as exc:
        raise UserCodeError(f"the code cache {root} cannot be used: {exc}; set TESSERA_CODE_CACHE to a folder "
                            "of your own") from None
    if problem is not None:
        raise UserCodeError(f"the code cache {root} {problem}, so this process would import what others put "
                            "there; chmod 700 it, or set TESSERA_CODE_CACHE to a private folder of your own")
    return root


def verified(target: Path) -> bool:
    """Whether ``target`` is a folder this user placed (``place``): a package unpacked from bytes
    that matched its digest, or its installed requirements; a private folder (inside a private
    cache) holding the marker written once its content was complete."""
    try:
        return _private(target) is None and (target / VERIFIED_MARKER).read_text() == target.name
    except OSError:
        return False


def place(target: Path, fill: Callable[[Path], None]) -> None:
    """Make ``target`` (a folder in a private cache) a verified copy of what ``fill`` writes,
    unless it is one already. Holding the target's lock (workers on one machine race here),
    ``fill`` writes into a private staging folder, which gets the marker and is renamed into
    place. A folder there that is not verified (an older cache's, one cut short, someone's) is
    moved aside and removed; a verified one is never touched, so a process importing from it
    keeps it. The code package (``install_code``) and its pip requirements
    (``workers.models.user_requirements``) are both placed so."""
    with _locked(_lock_file(target, "lock"), "a", fcntl.LOCK_EX):  # released when the file closes
        if verified(target):
            return  # another worker's copy: the same content
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name[:12]}-", dir=target.parent))
        try:
            fill(staging)
            (staging / VERIFIED_MARKER).write_text(target.name)
            if os.path.lexists(target):
                _remove(_moved_aside(target))
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _moved_aside(target: Path) -> Path:
    """``target`` renamed to a hidden name beside it, at once: no process finds it half-removed."""
    stale = target.with_name(f".stale-{target.name[:12]}-{os.getpid()}-{time.monotonic_ns()}")
    target.rename(stale)
    return stale


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def _lock_file(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}.{kind}"


def _locked(path: Path, mode: str, operation: int) -> IO[str]:
    """``path`` opened (``mode``) and locked (``flock``'s ``operation``, which waits): the file
    that is at ``path`` once the lock is granted. One granted on a file a prune deleted meanwhile
    (``prune`` deletes a removed folder's lock files while it holds them) is let go, and the new
    file at ``path`` is locked instead."""
    while True:
        opened = open(path, mode)
        try:
            fcntl.flock(opened, operation)
            if _same_file(opened, path):
                return opened
        except OSError as exc:
            opened.close()
            if exc.errno != errno.ESTALE:  # NFS: another machine's prune deleted it: lock again
                raise
            continue
        except BaseException:
            opened.close()
            raise
        opened.close()


def hold(target: Path) -> None:
    """Mark ``target`` (a placed folder) used now and in use by this process until it ends: a
    shared lock on its ``.inuse`` file, kept open, whose time is the folder's last use (set
    again when the process ends, ``_release``). ``UserCodeError`` if the cache's file system
    refuses the lock."""
    path = _lock_file(target, "inuse")
    held = _HELD.get(str(target))
    try:
        if held is None or not _same_file(held, path):  # a cache removed and made again (tests) holds new files
            if held is not None:
                held.close()
            # Open to read as well: NFSv4 grants a shared lock only on a file open for reading.
            # Released when the process (and its forked children) end.
            held = _locked(path, "a+", fcntl.LOCK_SH)
            _HELD[str(target)] = held
        os.utime(path)
    except OSError as exc:
        raise UserCodeError(f"the code cache {target.parent} cannot mark {target.name} in use ({path}: {exc}); set "
                            "TESSERA_CODE_CACHE to a folder on a local file system") from None


@atexit.register
def _release() -> None:
    """As the process ends: what it held was used until now (a run longer than the keep time
    keeps its folder that long after it), then the locks go (they would with the process)."""
    for held in _HELD.values():
        with contextlib.suppress(OSError):
            os.utime(held.name)
        held.close()


def _same_file(opened: IO[str], path: Path) -> bool:
    try:
        here, there = os.fstat(opened.fileno()), path.stat()
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def keep_seconds() -> float:
    """``$TESSERA_CODE_CACHE_KEEP_DAYS`` in seconds; ValueError naming the variable if it is no
    number of days >= 0."""
    raw = os.environ.get(KEEP_DAYS_ENV) or str(DEFAULT_KEEP_DAYS)
    try:
        days = float(raw)
    except ValueError:
        days = -1.0
    if not days >= 0:  # also NaN
        raise ValueError(f"{KEEP_DAYS_ENV}={raw!r}: allowed: a number of days >= 0 (default {DEFAULT_KEEP_DAYS:g})")
    return days * 86400


def prune(cache: Path, *, keep_s: float) -> list[str]:
    """Remove the folders of ``cache`` last used more than ``keep_s`` seconds ago (their
    ``.inuse`` file's time, else the folder's own) that no process holds (``hold``) and none is
    placing (``place``); the names removed. Never waits on a lock and never raises: a folder it
    cannot take now is left for a later prune."""
    removed, now = [], time.time()
    try:
        entries = [entry for entry in cache.iterdir() if not entry.name.startswith(".")]
    except OSError as exc:
        log.warning("could not list the code cache %s to prune it: %s", cache, exc)
        return removed
    for entry in entries:
        try:
            if _prune_one(entry, now=now, keep_s=keep_s):
                removed.append(entry.name)
        except FileNotFoundError as exc:  # another prune took it, or its lock files, first
            log.debug("%s left the code cache while this prune looked at it: %s", entry, exc)
        except OSError as exc:
            log.warning("could not prune %s from the code cache: %s", entry, exc)
    if removed:
        log.info("pruned %d folders unused for over %g days from the code cache %s: %s", len(removed),
                 keep_s / 86400, cache, ", ".join(removed))
    return removed


def _prune_one(entry: Path, *, now: float, keep_s: float) -> bool:
    """``prune`` of one folder: whether it removed it. Its two lock files go with it, deleted
    while this prune holds them; so do those of a folder another prune removed meanwhile (every
    worker of a machine installs, and prunes, at once), which this one may have made again."""
    used, lock = _lock_file(entry, "inuse"), _lock_file(entry, "lock")
    folder_time = entry.lstat().st_mtime
    if not used.exists():  # a folder no process has held since pruning began: its own time
        with contextlib.suppress(FileExistsError):
            used.open("x").close()  # made here, to lock; one a hold made meanwhile keeps its time
            os.utime(used, (folder_time, folder_time))
    if now - used.stat().st_mtime <= keep_s:
        return False
    stale = None
    try:
        with open(lock, "a") as placing, open(used, "a") as in_use:
            try:
                fcntl.flock(placing, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(in_use, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # being placed, or imported from
            if not (_same_file(placing, lock) and _same_file(in_use, used)):
                return False  # another prune removed it, and deleted these, meanwhile
            gone = not os.path.lexists(entry)  # another prune removed it since the first look
            if not gone and now - used.stat().st_mtime <= keep_s:
                return False  # a process used it and ended since the first look
            if not gone:
                stale = _moved_aside(entry)
            # Deleted while locked: whoever opened them meanwhile locks again (``_locked``).
            for path in (used, lock):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
    finally:
        if stale is not None:
            _remove(stale)
    return stale is not None
