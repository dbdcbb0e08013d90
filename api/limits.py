"""Values a database column can hold: the checks every request passes before it is stored.

PostgreSQL refuses a NUL character in any text (``text``, ``varchar``, ``jsonb``) and an integer
outside a signed 64-bit ``BIGINT``; SQLite is laxer, so without these checks the same request is
stored on one database and a 500 on the other. ``db_value_problems`` walks a decoded JSON body
(or a list of query/path parameters) and names each value no column could hold, so the service
answers a 422 that says which field and why, before any route or database sees the request.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import AfterValidator

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1  # an INTEGER column (epochs, world sizes, attempts)
MAX_DEPTH = 64  # nested JSON deeper than this is refused: no spec is this deep, a recursion bomb is


def _in_utc_years(value: datetime) -> datetime:
    if value.tzinfo is not None and value.year in (1, 9999):  # only an offset can push it past them
        try:
            value.astimezone(timezone.utc)
        except OverflowError:
            raise ValueError("the time must fall in the years 1 to 9999 once in UTC") from None
    return value


# A time a worker reports (a metric point's, a checkpoint's). Its instant in UTC must lie in the
# years 1..9999, the range a Python datetime holds: PostgreSQL would store an instant outside it
# (a timestamptz spans 4713 BC to 294276 AD) that no read could return. A naive time is UTC.
ReportedTime = Annotated[datetime, AfterValidator(_in_utc_years)]


def _show(value: Any) -> Any:
    """The bad value, shortened so an error never echoes a megabyte back."""
    if isinstance(value, str) and len(value) > 200:
        return value[:200] + "…"
    return value


def value_problem(value: Any, *, text: bool = True) -> str | None:
    """Why one scalar cannot be stored, or None if it can. ``text=False``: check only numbers."""
    if text and isinstance(value, str) and "\x00" in value:
        return "text must not contain NUL (\\u0000) characters"
    if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        return f"integers must lie between {INT64_MIN} and {INT64_MAX} (a signed 64-bit integer)"
    return None


def db_value_problems(data: Any, loc: tuple[Any, ...] = (), *,
                      text: bool = True) -> Iterator[tuple[tuple[Any, ...], str, Any]]:
    """Every ``(loc, message, value)`` in ``data`` (dicts, lists, scalars) that no column can
    hold: integers outside 64 bits, nesting past ``MAX_DEPTH`` and, with ``text``, text with NUL
    characters (keys included)."""
    if len(loc) > MAX_DEPTH:
        yield loc, f"JSON nested deeper than {MAX_DEPTH} levels", None
        return
    if isinstance(data, dict):
        for key, item in data.items():
            problem = value_problem(key, text=text)
            if problem:
                yield (*loc, key), f"field name: {problem}", _show(key)
            yield from db_value_problems(item, (*loc, key), text=text)
    elif isinstance(data, list):
        for index, item in enumerate(data):
            yield from db_value_problems(item, (*loc, index), text=text)
    else:
        problem = value_problem(data, text=text)
        if problem:
            yield loc, problem, _show(data)
