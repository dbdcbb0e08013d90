"""Keyset pages for the list routes (``GET /runs``, ``GET /sweeps``): their opaque cursors and
the newest-first order they share.

A cursor is URL-safe base64 (unpadded) of the JSON ``[order, position, id]``: the order it was
handed out for, the last listed row's position in that order and its id. A page resumes strictly
after that row, ties on the position going by id, so no row is skipped or repeated across pages.
A cursor of another order (another list's, or another sort of the same list) is refused, as is
one this service could not have made: ``InvalidCursor``, which the API answers with a 422 naming
``cursor`` (``service.errors``).
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime, timezone
from typing import Any, Callable

from sqlalchemy import Select, and_, or_

from service.db.session import is_possible_id


class InvalidCursor(ValueError):
    """A ``cursor`` that this service did not hand out (or one from another order)."""


def encode_cursor(order: str, position: Any, row_id: str) -> str:
    """The opaque cursor after the row ``row_id`` at ``position`` (JSON) in ``order``."""
    raw = json.dumps([order, position, row_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, order: str, *, untagged: str | None = None) -> tuple[Any, str]:
    """The position and row id of a cursor handed out for ``order``; ``untagged``: the order a
    two-field ``[position, id]`` cursor stands for (one handed out before cursors named their
    order), None to refuse such cursors."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        fields = json.loads(raw)
        if isinstance(fields, list) and len(fields) == 2 and untagged is not None:
            fields = [untagged, *fields]
        cursor_order, position, row_id = fields
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise invalid_cursor() from exc
    if cursor_order != order or not isinstance(row_id, str) or not is_possible_id(row_id):
        raise invalid_cursor()
    return position, row_id


def newest_first(query: Select, model: Any, cursor: str | None, order: str, *, untagged: str | None = None) -> Select:
    """``query`` (over ``model``, a table with ``created_at`` and ``id``) newest first, ties by
    larger id first (the order of a ``(created_at, id)`` index read backwards), after
    ``cursor``'s row; the cursor must be one of ``order`` (``decode_cursor``)."""
    query = query.order_by(model.created_at.desc(), model.id.desc())
    if cursor is not None:
        position, row_id = decode_cursor(cursor, order, untagged=untagged)
        created_at = _utc(position)
        query = query.where(or_(model.created_at < created_at, and_(model.created_at == created_at, model.id < row_id)))
    return query


def newest_cursor(last: Any, order: str) -> str:
    """The cursor after ``last`` (a row with ``created_at`` and ``id``) in a newest-first ``order``."""
    return encode_cursor(order, last.created_at.isoformat(), last.id)


def _utc(created_at: Any) -> datetime:
    try:
        when = datetime.fromisoformat(created_at)
        # In UTC, where the database compares it: an offset that moves it out of the years
        # 1..9999 raises OverflowError here instead of a database error later.
        return when.astimezone(timezone.utc) if when.tzinfo is not None else when
    except (ValueError, TypeError, OverflowError) as exc:
        raise invalid_cursor() from exc


def one_page(session: Any, query: Select, limit: int, cursor_of: Callable[[Any], str]) -> tuple[list[Any], str | None]:
    """Up to ``limit`` rows of ``query``, and the cursor after the last (``cursor_of(row)``), or
    None when no row follows: one row more is read to know."""
    rows = list(session.execute(query.limit(limit + 1)).scalars())
    return rows[:limit], (cursor_of(rows[limit - 1]) if len(rows) > limit else None)


def invalid_cursor() -> InvalidCursor:
    """The error for a cursor this service did not hand out for the order asked for."""
    return InvalidCursor("cursor is not one this service returned for this order; pass next_cursor from a previous "
                         "page of the same query, or omit it for the first page")
