"""Where clients find their API key without configuration.

In order: the ``TESSERA_API_KEY`` environment variable, then the credentials file
``$TESSERA_HOME/credentials``, which the service writes, mode 0600, when it starts for the first
time with an empty database. ``TESSERA_HOME`` defaults to ``.tessera`` in the folder the service
started in; a client without ``TESSERA_HOME`` looks for ``.tessera/credentials`` in its current
folder and then in each folder above it, as git finds ``.git``, so a notebook or a shell in a
subfolder of the checkout finds the key of the ``make serve`` started at its root. A file found
that way counts only if this user owns it: a ``/tmp/.tessera/credentials`` planted by another
user must not decide which service and project a client works in. The file holds
``TESSERA_API_KEY=tsk_...`` lines (so a shell can ``source`` it) and ``#`` comments.
"""

from __future__ import annotations

import os
from pathlib import Path

KEY_VARIABLE = "TESSERA_API_KEY"


def credentials_path(home: str | os.PathLike[str] | None = None) -> Path:
    """``{home}/credentials``; ``home`` defaults to ``$TESSERA_HOME`` or ``.tessera``."""
    return Path(home or os.environ.get("TESSERA_HOME") or ".tessera").expanduser() / "credentials"


def read_credentials(path: Path) -> str | None:
    """The key in a credentials file, or None if the file is missing or names none."""
    try:
        text = path.read_text()
    except OSError:  # missing, a folder, not readable
        return None
    for line in text.splitlines():
        name, _, value = line.strip().partition("=")
        if name.strip() == KEY_VARIABLE and value.strip():
            return value.strip()
    return None


def find_api_key(home: str | os.PathLike[str] | None = None) -> str | None:
    """``TESSERA_API_KEY``, else the key in ``{home}/credentials`` (without ``home`` or
    ``TESSERA_HOME``: the nearest ``.tessera/credentials`` in this folder or one above), else None."""
    if os.environ.get(KEY_VARIABLE):
        return os.environ[KEY_VARIABLE]
    if home or os.environ.get("TESSERA_HOME"):
        return read_credentials(credentials_path(home))
    try:
        here = Path.cwd()
    except OSError:  # the current folder was deleted
        return None
    for folder in (here, *here.parents):
        path = credentials_path(folder / ".tessera")
        try:
            owned = path.stat().st_uid == os.getuid()
        except OSError:
            continue
        key = read_credentials(path) if owned else None
        if key is not None:
            return key
    return None


def write_credentials(path: Path, key: str, *, url: str | None = None) -> None:
    """Write ``key`` to ``path`` readable by its owner only (0600 from the first byte)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# Tessera API key: an admin of every project, made on the service's first start.",
             "# Clients (tessera CLI, api.client.Client, notebooks) read it from here or from TESSERA_API_KEY."]
    if url:
        lines.append(f"# service: {url}")
    lines.append(f"{KEY_VARIABLE}={key}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the file may have existed with wider permissions
        os.write(fd, ("\n".join(lines) + "\n").encode())
    finally:
        os.close(fd)
