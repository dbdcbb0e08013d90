"""A code package's pip requirements (``code.requirements``), installed once per machine.

    code: {digest: <sha256>, requirements: ["einops==0.8.1"]}

Before a worker imports the run's code, ``install_requirements`` makes the requirements
importable: ``pip install --prefix`` into a folder of the code cache (``$TESSERA_CODE_CACHE``)
named by a hash of the requirements, where pip looks (``PIP_INDEX_URL``, ...), this Python and
the packages the worker has; then that folder's site-packages goes on ``sys.path`` after the
worker's own (its ``.pth`` files are read, so they run). Later runs on the machine with the same
requirements reuse the folder (placed and trusted as code packages are: ``code_cache.place``),
so a range (``timm>=1.0``) is resolved once per machine: pin exact versions for runs that must
match across machines.

What the worker has wins. pip runs with a constraint for every installed distribution at its
installed version, so a requirement is satisfied by what is installed (torch, numpy, ... are
not installed again into the folder) and one that would need another version of an installed
package fails, with pip's reason in the run's ``error``, instead of replacing it. A
distribution of another name that provides an installed module (``pillow-simd`` beside
Pillow) installs but is not what ``import PIL`` finds. Console scripts land in the folder's
``bin``, not on ``PATH``. pip reads its index from its own configuration and environment
(``PIP_INDEX_URL``, ``PIP_FIND_LINKS``, ``PIP_NO_INDEX``, a ``pip.conf``): set them in the
workers' environment for a private index or a cluster without internet.

Why not Ray's ``runtime_env`` (``pip``): each node's runtime-env agent installs it, and that
agent does not see the job's ``env_vars`` (measured for ``py_modules``, see ``user_code``), so a
``PIP_INDEX_URL`` handed to the job would not reach it, and a failure is a
``RuntimeEnvSetupError`` before any Tessera code runs. Here pip runs in the worker's own
environment and a failure ends the run with pip's own words.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import re
import site
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from workers.models.code_cache import UserCodeError, code_cache_dir, hold, own_cache, place

log = logging.getLogger(__name__)

# pip resolving against an index can take long on a slow network; a run should still end.
PIP_TIMEOUT_ENV = "TESSERA_PIP_TIMEOUT_S"
DEFAULT_PIP_TIMEOUT_S = 900
ERROR_TAIL_LINES = 15
# How long a failed install is answered with its error rather than tried again (every rank of a
# machine asks in turn; a run that fixes its requirements gets a new key and is not affected).
FAILURE_REUSED_S = 300
# Where pip looks for packages decides what it installs: part of the cache key.
PIP_SOURCE_ENV = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_CONFIG_FILE")


class RequirementsError(UserCodeError):
    """``code.requirements`` could not be installed (pip's reason in the message)."""


# The requirement folders on this process's sys.path: one set at a time (``_use``).
_in_use: list[str] = []


def installed_versions(cache: Path) -> dict[str, str]:
    """Every distribution this Python can import, by normalised name: its version; not those
    installed into ``cache`` (earlier requirements: they would change the key they were
    installed under). Names that are not valid distribution names are left out (they would be
    written into pip's constraints file)."""
    versions: dict[str, str] = {}
    for dist in importlib.metadata.distributions():  # the first of a name on sys.path is the one imported
        name = dist.metadata["Name"]
        if not name or not _NAME.fullmatch(name) or not isinstance(dist.version, str) or "\n" in dist.version:
            continue
        if Path(str(dist.locate_file(""))).resolve().is_relative_to(cache.resolve()):
            continue
        versions.setdefault(canonicalize_name(name), dist.version)
    return versions


_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def _pin(name: str, version: str) -> str:
    """A constraint that holds ``name`` at its installed ``version``: ``==`` for a PEP 440
    version, ``===`` (arbitrary equality) for any other, so none can be replaced."""
    try:
        Version(version)
    except InvalidVersion:
        return f"{name}==={version}"
    return f"{name}=={version}"


def requirements_key(requirements: list[str], installed: dict[str, str]) -> str:
    """The cache folder's name: what was asked, where pip looks, for which Python, beside which packages."""
    basis = {"requirements": sorted(requirements), "python": sys.version, "platform": platform.platform(),
             "installed": sorted(installed.items()), "pip": {k: os.environ.get(k) for k in PIP_SOURCE_ENV}}
    return "requirements-" + hashlib.sha256(json.dumps(basis).encode()).hexdigest()[:32]


def site_dirs(prefix: Path) -> list[Path]:
    """Where ``pip install --prefix`` puts packages for this Python (pure Python, then
    platform-specific), by its preferred scheme (Debian's own Python: ``local/.../dist-packages``)."""
    paths = {"base": str(prefix), "platbase": str(prefix)}
    scheme = sysconfig.get_preferred_scheme("prefix")
    return list(dict.fromkeys(Path(sysconfig.get_path(kind, scheme, vars=paths)) for kind in ("purelib", "platlib")))


def importable_dirs(target: Path) -> list[str]:
    """``target``'s site folders that pip made (what goes on an import path)."""
    return [str(folder) for folder in site_dirs(target) if folder.is_dir()]


def install_requirements(requirements: list[str]) -> Path | None:
    """Make ``requirements`` importable in this process (after what is installed); returns the
    folder they are installed under, or None when there are none. ``RequirementsError`` with
    pip's reason when they cannot be installed."""
    if not requirements:
        _use(None)
        return None
    cache = own_cache(code_cache_dir())
    installed = installed_versions(cache)
    target = cache / requirements_key(requirements, installed)
    hold(target)  # before placing: see install_code
    try:
        place(target, lambda staging: _install_once(requirements, staging, installed, target))
    except OSError as exc:
        raise RequirementsError(f"code.requirements {requirements}: cannot install them under {target.parent}: "
                                f"{exc}") from None
    _use(target)
    return target


def _use(target: Path | None) -> None:
    """Put ``target``'s site folders on ``sys.path`` (after what is installed; their ``.pth``
    files read) in place of another set's: a process that loads a second run's requirements
    (``load_model`` twice in a notebook) must not import the first run's versions."""
    folders = importable_dirs(target) if target is not None else []
    if folders == _in_use:
        return
    for old in _in_use:
        if old in sys.path:
            sys.path.remove(old)
        for name, module in list(sys.modules.items()):
            if (getattr(module, "__file__", None) or "").startswith(old + os.sep):
                del sys.modules[name]
    _in_use[:] = folders
    for folder in folders:
        site.addsitedir(folder)  # appended
    importlib.invalidate_caches()


def _install_once(requirements: list[str], staging: Path, installed: dict[str, str], target: Path) -> None:
    """``_pip_install`` into ``staging`` (``place`` holds ``target``'s lock), unless it failed for
    ``target`` within ``FAILURE_REUSED_S``: the ranks of a machine wait on that lock one after
    another, and each would otherwise run (and wait for) the same failing pip again."""
    failed = target.with_name(f".{target.name}.failed")
    if failed.is_file() and time.time() - failed.stat().st_mtime < FAILURE_REUSED_S:  # written under this lock
        raise RequirementsError(failed.read_text())
    # In the run's log: pip may take minutes, during which the run stays STARTING.
    log.info("installing code.requirements %s with pip (once per machine: later runs with the same requirements "
             "reuse them)", requirements)
    started = time.monotonic()
    try:
        _pip_install(requirements, staging, installed)
    except RequirementsError as exc:
        failed.write_text(str(exc))
        raise
    failed.unlink(missing_ok=True)
    log.info("installed code.requirements %s in %.1f s", requirements, time.monotonic() - started)


def _pip_install(requirements: list[str], prefix: Path, installed: dict[str, str]) -> None:
    if importlib.util.find_spec("pip") is None:
        raise RequirementsError(f"code.requirements {requirements}: pip is not installed in the workers' Python "
                                f"({sys.executable}); install it there, or drop code.requirements")
    constraints = prefix / "installed-constraints.txt"  # inside the folder: it records what was kept
    constraints.write_text("".join(f"{_pin(name, version)}\n" for name, version in sorted(installed.items())))
    command = [sys.executable, "-m", "pip", "install", "--prefix", str(prefix), "--constraint", str(constraints),
               "--disable-pip-version-check", "--no-input", "--no-warn-script-location", *requirements]
    timeout = float(os.environ.get(PIP_TIMEOUT_ENV) or DEFAULT_PIP_TIMEOUT_S)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RequirementsError(f"code.requirements {requirements}: pip did not finish in {timeout:.0f}s "
                                f"(set {PIP_TIMEOUT_ENV} on the workers for a slow index)") from None
    if done.returncode != 0:
        # pip says why in both streams ("The conflict is caused by:" on stdout, ERROR lines on stderr).
        lines = [line for line in (done.stdout + "\n" + done.stderr).splitlines() if line.strip()]
        tail = "\n".join(lines[-ERROR_TAIL_LINES:])
        why = (" (a requirement that needs another version of a package the workers have fails rather than "
               "replace it)" if "(constraint)" in tail else "")
        raise RequirementsError(f"code.requirements {requirements}: pip could not install them{why}:\n{tail}")
    folders = site_dirs(prefix)
    unplaced = [str(p.relative_to(prefix)) for p in prefix.rglob("*.dist-info") if p.parent not in folders]
    if unplaced:  # pip used another layout than this Python's: nothing would be importable
        raise RequirementsError(f"code.requirements {requirements}: pip installed {unplaced} outside "
                                f"{[str(f.relative_to(prefix)) for f in folders]}, where this Python "
                                "would not find them")
