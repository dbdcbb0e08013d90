"""The conditions ``GET /runs`` and ``GET /sweeps`` filter by alike: a name that contains some
text, and the archive state."""

from __future__ import annotations

from typing import Any, Literal

Archived = Literal["true", "false", "all"]


def name_contains(column: Any, text: str):
    """``column`` contains ``text``, in any case; ``%`` and ``_`` in ``text`` match themselves
    (escaped), not any characters."""
    return column.icontains(text, autoescape=True)


def archived_is(column: Any, archived: Archived):
    """``column`` (``archived_at``) set for ``true``, unset for ``false``; None (no condition) for ``all``."""
    if archived == "all":
        return None
    return column.is_not(None) if archived == "true" else column.is_(None)
