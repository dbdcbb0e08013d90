"""Bearer tokens of workers and sweep drivers: made, stored (as a hash) and checked here only.

Each attempt's Ray job gets a fresh token; only its sha256 is stored, and starting a new
attempt revokes it, so a worker or driver left over from an earlier attempt cannot report.
Requests carry it as ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets


def new_token() -> str:
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, stored_hash: str | None) -> bool:
    """Whether ``token`` hashes to ``stored_hash`` (False when none is stored).

    Compares digests in constant time, and hashes even when nothing is stored, to keep the
    timing flat."""
    candidate = hash_token(token)
    return hmac.compare_digest(candidate, stored_hash or "") and stored_hash is not None


def bearer_token(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None for any other."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None
