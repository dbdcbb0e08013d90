"""``Idempotency-Key`` on ``POST /api/v1/runs``: a client that retries a submit whose answer it
did not see gets the run its first request made, not a second run.

The key is the client's (the SDK makes one per ``submit`` call and repeats it on its own
retries). It is stored on the run, unique per project (migration 0005), so two concurrent
requests with one key make one run on PostgreSQL too: the loser's insert hits the unique
index, and it answers with the winner's run (``Repository.create_run_once``).
"""

from __future__ import annotations

from typing import Any

from api.specs import RunSpec
from api.validation_errors import field_error

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 128


def key_problem(key: str) -> dict[str, Any] | None:
    """The 422 item for a malformed key, or None: 1 to 128 printable ASCII characters."""
    if 1 <= len(key) <= MAX_KEY_LENGTH and all(" " <= ch <= "~" for ch in key):
        return None
    return field_error(HEADER, ["header", HEADER],
                       f"must be 1 to {MAX_KEY_LENGTH} printable ASCII characters (got {len(key)} characters"
                       f"{'' if key.isascii() and key.isprintable() else ', some not printable ASCII'})",
                       key[:MAX_KEY_LENGTH])


def replay_problem(key: str, stored_spec: dict[str, Any], spec: RunSpec) -> dict[str, Any] | None:
    """The 422 item when ``key`` already made a run of a different spec, or None if it is the same."""
    if spec.model_dump(mode="json") == stored_spec:
        return None
    return field_error(HEADER, ["header", HEADER],
                       "this key was already used in this project for a run with a different spec; "
                       "use a new key for a new run", key)
