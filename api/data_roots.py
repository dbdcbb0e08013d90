"""Where a run may read local data from: its data sets' ``root`` folders must lie under the
configured data directories (``TESSERA_DATA_DIRS``), or be the data set's built-in default.

Without this, a spec could point ``root`` at any folder of a worker (``/etc``, another run's
checkpoints) and read it into training. The service checks every spec at submit (a 422 naming
the field); the worker checks again, with symlinks resolved, before it opens anything.
Remote roots (``s3://…`` and other non-file URLs) are not local paths and are left to storage
credentials.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel

ROOT_FIELDS = ("root",)


def _local_path(root: str) -> str | None:
    """The local path ``root`` names, or None for a remote URL."""
    if "://" in root:
        scheme, rest = root.split("://", 1)
        return rest if scheme == "file" else None
    return root


def root_problem(root: str, default: Any, data_dirs: Iterable[str], *, resolve: bool = False) -> str | None:
    """Why a data set may not read ``root``, or None. ``default``: the spec's built-in root
    (always allowed). ``resolve``: follow symlinks (on a worker, where the path exists)."""
    path = _local_path(root)
    if path is None or root == default:
        return None
    if not os.path.isabs(path):
        return "a local data root must be an absolute path"
    dirs = [str(d) for d in data_dirs]
    normal = os.path.realpath(path) if resolve else os.path.normpath(path)
    for folder in dirs:
        base = os.path.realpath(folder) if resolve else os.path.normpath(folder)
        if normal == base or normal.startswith(base.rstrip(os.sep) + os.sep):
            return None
    allowed = ", ".join(dirs) if dirs else "none configured"
    return (f"local data roots must lie under the data directories (TESSERA_DATA_DIRS: {allowed}) or be the "
            f"data set's default {default!r}")


def data_root_problems(spec: Any, data_dirs: Iterable[str], *, prefix: str = "",
                       resolve: bool = False) -> Iterator[tuple[str, str, str]]:
    """``(field, root, why)`` for each data set of a RunSpec whose root may not be read."""
    dirs = list(data_dirs)
    for part in ("train", "eval"):
        dataset = getattr(spec.data, part, None)
        if not isinstance(dataset, BaseModel):
            continue
        for name in ROOT_FIELDS:
            root = getattr(dataset, name, None)
            if not isinstance(root, str):
                continue
            default = type(dataset).model_fields[name].default
            problem = root_problem(root, default, dirs, resolve=resolve)
            if problem:
                yield f"{prefix}data.{part}.{name}", root, problem
