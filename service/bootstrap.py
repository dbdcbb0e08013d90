"""The embedded default stays two commands: on a first start (a database without API keys)
the service makes an admin key for every project and writes it to ``$TESSERA_HOME/credentials``
(mode 0600), where the CLI, the SDK and notebooks find it, with the service's URL. Later starts
keep the key and rewrite the URL, so a client finds a service restarted on another port.
"""

from __future__ import annotations

import re

from api.credentials import credentials_path, record_service_url, write_credentials
from service.access import EVERY_PROJECT, KEY_PREFIX, MAX_KEY_CHARS, AccessStore, Role
from service.settings import Settings


def ensure_admin_key(access: AccessStore, settings: Settings) -> str | None:
    """Make the first admin key if the database has none; return the credentials file's path
    then, else None (the keys already made stay as they are, and the URL in an existing
    credentials file becomes this start's)."""
    if access.has_keys():
        record_service_url(credentials_path(settings.home), settings.local_url)
        return None
    # Stripped: a Secret made from a file usually ends in a newline, which no request could send.
    secret = settings.bootstrap_api_key.strip() if settings.bootstrap_api_key is not None else None
    if secret is not None and not re.fullmatch(rf"{KEY_PREFIX}[A-Za-z0-9_\-]{{1,{MAX_KEY_CHARS - len(KEY_PREFIX)}}}", secret):
        raise ValueError(f"TESSERA_BOOTSTRAP_API_KEY must be {KEY_PREFIX!r} and then letters, digits, '_' or '-', at "
                         f"most {MAX_KEY_CHARS} characters in all (got {len(secret)} characters)")
    _record, secret = access.create_key(name="first admin", roles={EVERY_PROJECT: Role.ADMIN}, secret=secret)
    path = credentials_path(settings.home)
    write_credentials(path, secret, url=settings.local_url)
    # Printed, not logged: a log line and a print said it twice, and the log may not reach the
    # console (the processes of --workers N log as they were told).
    print(f"Tessera: created an admin API key for {settings.local_url}; it is in {path}, with the URL "
          "(the CLI, the SDK and notebooks read both from there)", flush=True)
    return str(path)
