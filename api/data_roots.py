"""Where a run may read local data from: its data sets' ``root`` folders and local WebDataset
``urls`` must lie under the configured data directories (``TESSERA_DATA_DIRS``), or be the data
set's built-in default.

Without this, a spec could point ``root`` at any folder of a worker (``/etc``, another run's
checkpoints) and read it into training. The service checks every spec at submit (a 422 naming
the field); the worker checks again, with symlinks resolved and ``urls`` brace-expanded, before
it opens anything. A ``urls`` pattern is checked whole at submit, so its brace groups may only be
numeric ranges (``{000000..000019}``, what ``tessera data pack`` writes) or alternatives of plain
names (``{train,extra}``): none can expand to ``..``. fsspec's chained URLs (``a::b``, which open
the outer path locally whatever the inner one is) are refused. Remote roots (``s3://…`` and other
non-file URLs) are not local paths and are left to storage credentials.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel

# A data set's fields that name where it reads from: a folder, or a brace pattern of shard URLs.
ROOT_FIELDS = ("root", "urls")


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# The brace groups a local pattern may hold: a numeric range, or alternatives of plain names.
_BRACE_GROUP = re.compile(r"\{(?:[0-9]+\.\.[0-9]+|[A-Za-z0-9_\-]+(?:,[A-Za-z0-9_\-]+)+)\}")


def _local_path(root: str) -> str | None:
    """The local path ``root`` names, or None for a remote URL (its scheme leads it)."""
    match = _SCHEME.match(root)
    if match is None:
        return root
    return root[match.end():] if match[1] == "file" else None


def root_problem(root: str, default: Any, data_dirs: Iterable[str], *, resolve: bool = False) -> str | None:
    """Why a data set may not read ``root``, or None. ``default``: the spec's built-in root
    (always allowed). ``resolve``: follow symlinks (on a worker, where the path exists)."""
    if "::" in root:
        return "fsspec's chained URLs ('::') are not allowed in a data root"
    path = _local_path(root)
    if path is None or root == default:
        return None
    if not os.path.isabs(path):
        return "a local data root must be an absolute path"
    if "{" in path or "}" in path:
        rest = _BRACE_GROUP.sub("", path)
        if "{" in rest or "}" in rest:
            return ("a local brace pattern's groups may be numeric ranges ({000000..000019}) or alternatives of "
                    "letters, digits, _ and - ({train,extra})")
    dirs = [str(d) for d in data_dirs]
    normal = os.path.realpath(path) if resolve else os.path.normpath(path)
    for folder in dirs:
        base = os.path.realpath(folder) if resolve else os.path.normpath(folder)
        if normal == base or normal.startswith(base.rstrip(os.sep) + os.sep):
            return None
    allowed = ", ".join(dirs) if dirs else "none configured"
    return (f"local data roots must lie under the data directories (TESSERA_DATA_DIRS: {allowed})"
            + (f" or be the data set's default {default!r}" if default is not None else ""))


def default_root(dataset: BaseModel, field: str) -> str | None:
    """The data set's built-in value of ``field`` (always allowed), or None where it has none."""
    default = type(dataset).model_fields[field].default
    return default if isinstance(default, str) else None


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
            problem = root_problem(root, default_root(dataset, name), dirs, resolve=resolve)
            if problem:
                yield f"{prefix}data.{part}.{name}", root, problem
