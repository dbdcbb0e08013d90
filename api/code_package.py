"""Code packages: a folder of your Python code as a deterministic, content-addressed zip.

``pack_directory("./my_project")`` is what ``tessera submit --code`` and
``Client.create_run(spec, code=...)`` send; ``inspect_package(data)`` is what the service checks
before storing one (it never imports or runs the code) and what workers check before unpacking.

Layout: a folder with an ``__init__.py`` is one package, stored as ``my_project/...``; any
other folder is a root of packages and modules, stored as they lie. The zip's root goes on the
workers' ``sys.path``, so ``model.import: "my_project.nets:build"`` imports ``my_project/nets.py``.

Deterministic: entries sorted, timestamps fixed (1980-01-01), permissions fixed, so the same
files give the same bytes and the same sha256 (``digest``), and an unchanged folder is never
uploaded twice.

Left out: ``.git``, ``__pycache__``, ``*.pyc``/``*.pyo``, and what the folder's top-level
``.gitignore`` names. Supported ``.gitignore`` forms: ``name`` and globs (``*.ckpt``, ``data*``)
matched against every path component, ``dir/`` (folders only), and patterns with a ``/``
(``/build``, ``docs/*.md``) matched against the path from the folder. Negations (``!keep``)
and nested ``.gitignore`` files are not read. Symbolic links to files inside the folder are
stored as files; links to folders inside it are skipped; a link pointing outside it is
refused (it would ship files from elsewhere).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel

MAX_PACKAGE_BYTES = 20 * 1024 * 1024        # the zip, as uploaded
MAX_UNPACKED_BYTES = 100 * 1024 * 1024      # its files, unpacked (zip bombs)
MAX_FILES = 10_000
ALWAYS_SKIPPED_DIRS = frozenset({".git", "__pycache__", ".hg", ".svn", ".mypy_cache", ".pytest_cache"})
ALWAYS_SKIPPED_FILES = ("*.pyc", "*.pyo", ".DS_Store")
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)


class CodePackageError(ValueError):
    """A folder that cannot be packed, or bytes that are not an acceptable package; says why."""


class CodeView(BaseModel):
    """A stored code package: ``POST /api/v1/code`` and ``GET /api/v1/code/{digest}``."""

    digest: str
    size: int
    num_files: int
    top_level: list[str]
    created: bool = False


@dataclass(frozen=True)
class CodePackage:
    """A packed folder: the zip's bytes, their sha256 and the stored file names."""

    data: bytes
    digest: str
    files: list[str] = field(default_factory=list)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- packing ---------------------------------------------------------------------------

def with_code_digest(run_body: dict[str, Any], digest: str) -> dict[str, Any]:
    """A copy of ``run_body`` (a RunSpec's dict) whose ``code.digest`` is ``digest``; the rest of
    its ``code`` (``requirements``) is kept. What ``--code DIR`` and ``code=`` do to a spec."""
    code = run_body.get("code")
    if code is not None and not isinstance(code, dict):
        return run_body  # left as written: the spec's validation names ``code``
    return {**run_body, "code": {**(code or {}), "digest": digest}}


def pack_directory(folder: str | Path, *, max_bytes: int = MAX_PACKAGE_BYTES) -> CodePackage:
    """Zip ``folder`` (see the module docstring for layout, exclusions and links)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise CodePackageError(f"--code {folder}: not a folder")
    root = root.resolve()
    prefix = ""
    if (root / "__init__.py").is_file():
        if not root.name.isidentifier():
            raise CodePackageError(f"--code {folder}: a package folder's name must be a Python identifier, "
                                   f"not {root.name!r}")
        prefix = root.name + "/"
    ignore = GitIgnore.read(root / ".gitignore")
    files = sorted(_walk(root, ignore))
    if len(files) > MAX_FILES:
        raise CodePackageError(f"--code {folder}: {len(files)} files, more than {MAX_FILES}; list what to leave out "
                               "in its .gitignore")
    if not any(name.endswith(".py") for name, _ in files):
        raise CodePackageError(f"--code {folder}: no Python file in it")
    unpacked = sum(path.stat().st_size for _, path in files)
    if unpacked > MAX_UNPACKED_BYTES:
        biggest = sorted(files, key=lambda item: -item[1].stat().st_size)[:3]
        raise CodePackageError(f"--code {folder}: {unpacked / 2**20:.1f} MiB of files, more than "
                               f"{MAX_UNPACKED_BYTES / 2**20:.0f} MiB; the largest: "
                               f"{', '.join(name for name, _ in biggest)} (leave data and checkpoints out with "
                               ".gitignore)")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, path in files:
            info = zipfile.ZipInfo(prefix + name, date_time=_FIXED_TIME)
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            info.create_system = 3  # unix, whatever packed it
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes(), compresslevel=6)
    data = buffer.getvalue()
    if len(data) > max_bytes:
        raise CodePackageError(f"--code {folder}: the package is {len(data) / 2**20:.1f} MiB, more than "
                               f"{max_bytes / 2**20:.0f} MiB; leave data and checkpoints out with .gitignore")
    return CodePackage(data=data, digest=sha256_hex(data), files=[prefix + name for name, _ in files])


def _walk(root: Path, ignore: "GitIgnore") -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        kept = []
        for name in sorted(dirnames):
            rel = f"{rel_dir}/{name}" if rel_dir != "." else name
            path = here / name
            if path.is_symlink():
                _inside_or_refuse(root, path, rel)
                continue  # its files are in the tree already (or loop back into it)
            if name not in ALWAYS_SKIPPED_DIRS and not ignore.ignored(rel, is_dir=True):
                kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = f"{rel_dir}/{name}" if rel_dir != "." else name
            path = here / name
            if any(fnmatch.fnmatch(name, pattern) for pattern in ALWAYS_SKIPPED_FILES) or ignore.ignored(rel):
                continue
            if path.is_symlink():
                target = _inside_or_refuse(root, path, rel)
                if not target.is_file():
                    continue
            found.append((rel, path))
    return found


def _inside_or_refuse(root: Path, link: Path, rel: str) -> Path:
    target = link.resolve()
    if target != root and root not in target.parents:
        raise CodePackageError(f"{rel} is a symbolic link to {target}, outside {root}; copy the file in or "
                               "leave the link out with .gitignore")
    return target


class GitIgnore:
    """The simple ``.gitignore`` forms listed in the module docstring."""

    def __init__(self, patterns: list[str]):
        self.patterns = patterns

    @classmethod
    def read(cls, path: Path) -> "GitIgnore":
        if not path.is_file():
            return cls([])
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
        return cls([line for line in lines if line and not line.startswith(("#", "!"))])

    def ignored(self, rel: str, *, is_dir: bool = False) -> bool:
        parts = rel.split("/")
        for pattern in self.patterns:
            dir_only = pattern.endswith("/")
            pattern = pattern.rstrip("/")
            if dir_only and not is_dir:
                continue
            if "/" in pattern:  # anchored at the folder
                if fnmatch.fnmatchcase(rel, pattern.lstrip("/")):
                    return True
            elif fnmatch.fnmatchcase(parts[-1], pattern):  # parent folders were pruned by the walk
                return True
        return False


# --- checking --------------------------------------------------------------------------

def inspect_package(data: bytes) -> CodeView:
    """Check that ``data`` is an acceptable package and describe it, without running anything:
    a zip, only relative paths without ``..``, no links, within the size caps, with at least one
    top-level package (a folder with ``__init__.py``) or module (``*.py``)."""
    if len(data) > MAX_PACKAGE_BYTES:
        raise CodePackageError(f"the package is {len(data)} bytes, more than {MAX_PACKAGE_BYTES}")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise CodePackageError(f"not a zip archive ({exc})") from None
    names: set[str] = set()
    unpacked = 0
    for info in infos:
        _check_entry_name(info.filename)
        if stat.S_ISLNK(info.external_attr >> 16):
            raise CodePackageError(f"entry {info.filename!r} is a symbolic link; packages hold plain files only")
        if info.filename in names:
            raise CodePackageError(f"entry {info.filename!r} appears twice")
        names.add(info.filename)
        unpacked += info.file_size
    if len(infos) > MAX_FILES:
        raise CodePackageError(f"{len(infos)} entries, more than {MAX_FILES}")
    if unpacked > MAX_UNPACKED_BYTES:
        raise CodePackageError(f"{unpacked} bytes unpacked, more than {MAX_UNPACKED_BYTES}")
    files = sorted(n for n in names if not n.endswith("/"))
    top_level = sorted({n.split("/")[0] for n in files if n.count("/") == 1 and n.endswith("/__init__.py")}
                       | {n[:-3] for n in files if "/" not in n and n.endswith(".py")})
    if not top_level:
        raise CodePackageError("no top-level package (a folder with __init__.py) or module (*.py) in the zip; "
                               f"it holds: {', '.join(files[:5]) or 'nothing'}")
    return CodeView(digest=sha256_hex(data), size=len(data), num_files=len(files), top_level=top_level)


def _check_entry_name(name: str) -> None:
    path = PurePosixPath(name)
    if not name or name.startswith("/") or "\\" in name or (len(name) > 1 and name[1] == ":"):
        raise CodePackageError(f"entry {name!r} has an absolute or non-POSIX path; entries must be relative")
    if ".." in path.parts or "\x00" in name:
        raise CodePackageError(f"entry {name!r} leaves the package (a '..' path component)")


def safe_extract(data: bytes, target: Path) -> None:
    """Unpack a package that ``inspect_package`` accepted into the folder ``target``."""
    inspect_package(data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            destination = target / info.filename
            if info.filename.endswith("/"):
                destination.mkdir(parents=True, exist_ok=True)
                continue
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(archive.read(info))
