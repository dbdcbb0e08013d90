"""A code package's pip requirements (``code.requirements``), installed once per machine.

    code: {digest: <sha256>, requirements: ["einops==0.8.1"]}

Before a worker imports the run's code, ``install_requirements`` makes the requirements
importable: ``pip install --prefix`` into a folder of the code cache (``$TESSERA_CODE_CACHE``)
named by a hash of the requirements, this Python and the packages the worker has, then that
folder's site-packages goes on ``sys.path`` after the worker's own. Later runs on the machine with
the same requirements reuse the folder (placed and trusted as code packages are:
``user_code.place``).

What the worker has wins. pip runs with a constraint for every installed distribution at its
installed version, so a requirement is satisfied by what is installed (torch, numpy, ... are
not installed again into the folder) and one that would need another version of an installed
package fails, with pip's reason in the run's ``error``, instead of replacing it. pip reads its
index from its own configuration and environment (``PIP_INDEX_URL``, ``PIP_FIND_LINKS``,
``PIP_NO_INDEX``, a ``pip.conf``): set them in the workers' environment for a private index or a
cluster without internet.

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
import json
import os
import platform
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from workers.models.code_cache import UserCodeError, code_cache_dir, own_cache, place

# pip resolving against an index can take long on a slow network; a run should still end.
PIP_TIMEOUT_ENV = "TESSERA_PIP_TIMEOUT_S"
DEFAULT_PIP_TIMEOUT_S = 900
ERROR_TAIL_LINES = 15


def installed_versions(cache: Path) -> dict[str, str]:
    """Every distribution this Python can import, by normalised name: its version; not those
    installed into ``cache`` (earlier requirements: they would change the key they were
    installed under). One whose version is not PEP 440 (a source checkout's, say) is left out:
    pip would refuse the whole constraints file over it."""
    versions: dict[str, str] = {}
    for dist in importlib.metadata.distributions():  # the first of a name on sys.path is the one imported
        name = dist.metadata["Name"]
        if not name or Path(str(dist.locate_file(""))).resolve().is_relative_to(cache.resolve()):
            continue
        try:
            Version(dist.version)
        except (InvalidVersion, TypeError):
            continue
        versions.setdefault(canonicalize_name(name), dist.version)
    return versions


def requirements_key(requirements: list[str], installed: dict[str, str]) -> str:
    """The cache folder's name: what was asked, for which Python, beside which packages."""
    basis = {"requirements": sorted(requirements), "python": sys.version, "platform": platform.platform(),
             "installed": sorted(installed.items())}
    return "requirements-" + hashlib.sha256(json.dumps(basis).encode()).hexdigest()[:32]


def site_dirs(prefix: Path) -> list[Path]:
    """Where ``pip install --prefix`` puts packages (pure Python, then platform-specific)."""
    paths = {"base": str(prefix), "platbase": str(prefix)}
    return list(dict.fromkeys(Path(sysconfig.get_path(kind, "posix_prefix", vars=paths))
                              for kind in ("purelib", "platlib")))


def install_requirements(requirements: list[str]) -> Path | None:
    """Make ``requirements`` importable in this process (after what is installed); returns the
    folder they are installed under, or None when there are none. ``UserCodeError`` with
    pip's reason when they cannot be installed."""
    if not requirements:
        return None
    cache = own_cache(code_cache_dir())
    installed = installed_versions(cache)
    target = cache / requirements_key(requirements, installed)
    try:
        place(target, lambda staging: _pip_install(requirements, staging, installed))
    except OSError as exc:
        raise UserCodeError(f"code.requirements {requirements}: cannot install them under {target.parent}: "
                            f"{exc}") from None
    for folder in site_dirs(target):
        if folder.is_dir() and str(folder) not in sys.path:
            site.addsitedir(str(folder))  # appended, and its .pth files read
    importlib.invalidate_caches()
    return target


def _pip_install(requirements: list[str], prefix: Path, installed: dict[str, str]) -> None:
    constraints = prefix / "installed-constraints.txt"  # inside the folder: it records what was kept
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(installed.items())))
    command = [sys.executable, "-m", "pip", "install", "--prefix", str(prefix), "--constraint", str(constraints),
               "--disable-pip-version-check", "--no-input", "--no-warn-script-location", *requirements]
    timeout = float(os.environ.get(PIP_TIMEOUT_ENV) or DEFAULT_PIP_TIMEOUT_S)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UserCodeError(f"code.requirements {requirements}: pip did not finish in {timeout:.0f}s "
                            f"(set {PIP_TIMEOUT_ENV} on the workers for a slow index)") from None
    if done.returncode != 0:
        # pip says why in both streams ("The conflict is caused by:" on stdout, ERROR lines on stderr).
        lines = [line for line in (done.stdout + "\n" + done.stderr).splitlines() if line.strip()]
        tail = "\n".join(lines[-ERROR_TAIL_LINES:])
        raise UserCodeError(f"code.requirements {requirements}: pip could not install them (a requirement that "
                            f"needs another version of a package the workers have fails rather than replace it):"
                            f"\n{tail}")
