"""``Idempotency-Key`` on ``POST /api/v1/runs`` and ``POST /api/v1/sweeps``: a client that
retries a submit whose answer it did not see gets what its first request made, not a second
run or sweep.

The key is the client's (the SDK makes one per ``create_run``/``create_sweep`` call and repeats
it on its own retries). It is stored on the run or sweep, unique per project (migrations 0005
and 0009), so two concurrent requests with one key make one on PostgreSQL too: the loser's
insert hits the unique index, and it answers with the winner's (``created_once``).
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from pydantic import BaseModel
from sqlalchemy.exc import IntegrityError

from api.validation_errors import field_error

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 128

Made = TypeVar("Made")


def key_problem(key: str) -> dict[str, Any] | None:
    """The 422 item for a malformed key, or None: 1 to 128 printable ASCII characters."""
    if 1 <= len(key) <= MAX_KEY_LENGTH and all(" " <= ch <= "~" for ch in key):
        return None
    return field_error(HEADER, ["header", HEADER],
                       f"must be 1 to {MAX_KEY_LENGTH} printable ASCII characters (got {len(key)} characters"
                       f"{'' if key.isascii() and key.isprintable() else ', some not printable ASCII'})",
                       key[:MAX_KEY_LENGTH])


def replay_problem(key: str, stored_spec: dict[str, Any], spec: BaseModel, *, what: str = "run",
                   differs: str | None = None) -> dict[str, Any] | None:
    """The 422 item when ``key`` already made a ``what`` (run, sweep) of a different spec, or one
    that ``differs`` otherwise (a sweep's driver), or None if the request is the same."""
    if differs is None and spec.model_dump(mode="json") == stored_spec:
        return None
    return field_error(HEADER, ["header", HEADER],
                       f"this key was already used in this project for a {what} with a different "
                       f"{differs or 'spec'}; use a new key for a new {what}", key)


def created_once(find: Callable[[], Made | None], create: Callable[[], Made]) -> tuple[Made, bool]:
    """What ``create`` makes and True, or what ``find`` finds (an earlier request's) and False.
    Two concurrent calls make one: ``create``'s insert of the loser hits the unique index on
    (project, key), and the loser reads the winner's with ``find``."""
    existing = find()
    if existing is not None:
        return existing, False
    try:
        return create(), True
    except IntegrityError:
        winner = find()
        if winner is None:
            raise
        return winner, False
