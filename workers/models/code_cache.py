"""The code cache: folders of a worker's machine that hold what a run's code needs (its
unpacked code package, its installed pip requirements), shared by the runs on the machine.

The cache is ``$TESSERA_CODE_CACHE``, default ``/tmp/tessera-code-{uid}``. It is trusted only as
far as this user alone can change it: a cache folder another user owns or can write to is
refused (a shared ``/tmp`` lets anyone make a folder first), a missing one is made private
(0700), and a folder in it counts only if it is private and holds the marker written once its
content was complete (``place``); any other is made again.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Callable


class UserCodeError(RuntimeError):
    """The run's code could not be fetched, imported or called; the message says which and
    ends with the traceback's tail. One string, so it pickles across Ray."""


# In a placed folder: the folder's own name (a package's digest), written once its content is complete.
VERIFIED_MARKER = ".tessera-sha256"


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
    with open(target.parent / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if verified(target):
            return  # another worker's copy: the same content
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name[:12]}-", dir=target.parent))
        try:
            fill(staging)
            (staging / VERIFIED_MARKER).write_text(target.name)
            if os.path.lexists(target):
                stale = target.with_name(f".stale-{target.name[:12]}-{os.getpid()}-{time.monotonic_ns()}")
                target.rename(stale)
                if stale.is_symlink() or not stale.is_dir():
                    stale.unlink()
                else:
                    shutil.rmtree(stale, ignore_errors=True)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
