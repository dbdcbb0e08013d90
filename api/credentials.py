"""Where clients find their API key without configuration.

In order: the ``TESSERA_API_KEY`` environment variable (set but empty counts as unset), then
the credentials file ``$TESSERA_HOME/credentials``, which the service writes, mode 0600, when it
starts for the first time with an empty database. ``TESSERA_HOME`` defaults to ``.tessera`` in
the folder the service started in; a client without ``TESSERA_HOME`` looks for ``.tessera/credentials`` in its current
folder and then in each folder above it, as git finds ``.git``, so a notebook or a shell in a
subfolder of the checkout finds the key of the ``make serve`` started at its root. A file found
that way counts only if this user owns it: a ``/tmp/.tessera/credentials`` planted by another
user must not decide which service and project a client works in. The file holds
``TESSERA_API_KEY=tsk_...`` and ``TESSERA_URL=http://...`` lines (so a shell can ``source`` it)
and ``#`` comments.

The service URL comes the same way: ``TESSERA_URL``, else the URL in the credentials file found
above (if this user owns it). The service writes the URL a client on its machine reaches it at
(``Settings.local_url``: its host and port, 0.0.0.0 read as 127.0.0.1) on its first start and
rewrites it on every later start, so a ``make serve PORT=8123`` is found on its port by the CLI
and a notebook in the checkout.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

KEY_VARIABLE = "TESSERA_API_KEY"
URL_VARIABLE = "TESSERA_URL"


def credentials_path(home: str | os.PathLike[str] | None = None) -> Path:
    """``{home}/credentials``; ``home`` defaults to ``$TESSERA_HOME`` or ``.tessera``."""
    return Path(home or os.environ.get("TESSERA_HOME") or ".tessera").expanduser() / "credentials"


def read_credentials(path: Path, name: str = KEY_VARIABLE) -> str | None:
    """The value of ``name`` (the key by default) in a credentials file, or None if the file is
    missing or names none."""
    try:
        text = path.read_text()
    except OSError:  # missing, a folder, not readable
        return None
    return _value_in(text, name)


def _value_in(text: str, name: str) -> str | None:
    """The value of ``name`` in a credentials file's ``text``; None if it names none."""
    for line in text.splitlines():
        found, _, value = line.strip().partition("=")
        if found.strip() == name and value.strip():
            return value.strip()
    return None


def find_credentials(home: str | os.PathLike[str] | None = None) -> Path | None:
    """The credentials file a client reads: ``{home}/credentials`` (``home`` defaults to
    ``$TESSERA_HOME``) if it exists, else, without either, the nearest ``.tessera/credentials``
    this user owns in this folder or one above; None if there is none."""
    if home or os.environ.get("TESSERA_HOME"):
        path = credentials_path(home)
        return path if path.is_file() else None
    try:
        here = Path.cwd()
    except OSError:  # the current folder was deleted
        return None
    for folder in (here, *here.parents):
        path = credentials_path(folder / ".tessera")
        try:
            if path.stat().st_uid == os.getuid() and read_credentials(path) is not None:
                return path
        except OSError:
            continue
    return None


def find_api_key(home: str | os.PathLike[str] | None = None) -> str | None:
    """``TESSERA_API_KEY``, else the key in the credentials file (``find_credentials``), else None.
    An empty ``TESSERA_API_KEY=`` counts as unset: the file's key (an admin's, if the service
    wrote it) is used, as ``tessera --help`` and the README say."""
    if os.environ.get(KEY_VARIABLE):
        return os.environ[KEY_VARIABLE]
    path = find_credentials(home)
    return read_credentials(path) if path is not None else None


def find_service_url(home: str | os.PathLike[str] | None = None) -> str | None:
    """``TESSERA_URL``, else the service URL in the credentials file (``find_credentials``) if this
    user owns it, else None. Owned, also under ``TESSERA_HOME``: a file another user wrote must
    not decide where this user's key (``TESSERA_API_KEY`` too) is sent."""
    if os.environ.get(URL_VARIABLE):
        return os.environ[URL_VARIABLE]
    path = find_credentials(home)
    try:
        owned = path is not None and path.stat().st_uid == os.getuid()
    except OSError:
        return None
    return read_credentials(path, URL_VARIABLE) if owned else None


def write_credentials(path: Path, key: str, *, url: str | None = None) -> None:
    """Write ``key`` (and the service's ``url``) to ``path``, readable by its owner only (0600
    from the first byte)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# Tessera API key: an admin of every project, made on the service's first start.",
             "# Clients (tessera CLI, api.client.Client, notebooks) read it from here or from TESSERA_API_KEY,",
             "# and the service's URL from here or from TESSERA_URL (the service rewrites it on each start)."]
    if url:
        lines.append(f"{URL_VARIABLE}={url}")
    lines.append(f"{KEY_VARIABLE}={key}")
    _write_private(path, "\n".join(lines) + "\n")


def record_service_url(path: Path, url: str) -> bool:
    """Put ``url`` in the credentials file at ``path`` (through a link, in the file it names) in
    place of the one it holds, keeping the rest; True if the file changed. A missing file, one
    without a key or one another user owns is left alone (False): the service started elsewhere,
    or its key was made another way. A file that cannot be written is logged and left as it was
    (False): the service starts anyway, and clients find it with ``--url``."""
    try:
        path = path.resolve()
        if path.stat().st_uid != os.getuid():
            return False
        text = path.read_text()
    except OSError:
        return False
    if _value_in(text, KEY_VARIABLE) is None or _value_in(text, URL_VARIABLE) == url:
        return False
    # An earlier version wrote the URL as a "# service: URL" comment: one URL per file.
    lines = [line for line in text.splitlines()
             if line.strip().partition("=")[0].strip() != URL_VARIABLE and not line.startswith("# service: ")]
    at = next(i for i, line in enumerate(lines) if line.strip().partition("=")[0].strip() == KEY_VARIABLE)
    lines.insert(at, f"{URL_VARIABLE}={url}")
    # Written beside it and renamed over it: a client reading at that moment sees one whole file.
    fresh = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        _write_private(fresh, "\n".join(lines) + "\n")
        os.replace(fresh, path)
    except OSError as exc:
        log.warning("could not write the service's URL %s into %s (%s); clients there need --url or TESSERA_URL",
                    url, path, exc)
        fresh.unlink(missing_ok=True)
        return False
    return True


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the file may have existed with wider permissions
        os.write(fd, text.encode())
    finally:
        os.close(fd)
