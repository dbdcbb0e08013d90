"""What a user may change on a run after it exists (tags and notes), and how lists of runs are
filtered and ordered. Shared by the service (validation, 422 details), the SDK and the CLI."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# Tags travel in URLs (`?tag=`) and CLI arguments (`+a -b`), so they keep to characters that
# need no quoting there; a leading `+`/`-` would read as an edit in `tessera tag`.
TAG_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:/=-]*$"
TAG_CHARSET = "letters, digits and _ . : / = - (not starting with . : / = -)"
MAX_TAG_LENGTH = 64
MAX_TAGS = 32
MAX_NOTES_LENGTH = 10_000



def _checked_tag(tag: str) -> str:
    problem = tag_problem(tag)
    if problem is not None:
        raise ValueError(problem)
    return tag


Tag = Annotated[str, AfterValidator(_checked_tag)]

ORDER_BY_PREFIX = "best:"


class RunUpdate(BaseModel):
    """``PATCH /api/v1/runs/{id}``: the fields given replace the stored ones; omitted fields stay.
    ``notes: ""`` clears the notes."""

    model_config = ConfigDict(extra="forbid")

    tags: list[Tag] | None = Field(None, max_length=MAX_TAGS,
                                   description=f"the run's tags (at most {MAX_TAGS}, each 1-{MAX_TAG_LENGTH} "
                                               f"characters of {TAG_CHARSET}); duplicates are dropped")
    notes: str | None = Field(None, max_length=MAX_NOTES_LENGTH,
                              description=f"free text (Markdown), at most {MAX_NOTES_LENGTH} characters")


def tag_problem(tag: str) -> str | None:
    """Why ``tag`` is not a valid tag, or None."""
    if not 1 <= len(tag) <= MAX_TAG_LENGTH:
        return f"tag {tag[:80]!r} has {len(tag)} characters; a tag has 1 to {MAX_TAG_LENGTH}"
    if re.fullmatch(TAG_PATTERN, tag) is None:
        return f"tag {tag!r} is not allowed: a tag may hold only {TAG_CHARSET}"
    return None


def apply_tag_edits(tags: list[str], edits: list[str]) -> list[str]:
    """``tags`` after ``+name`` (add) and ``-name`` (remove) edits, in order, keeping the
    first-added order: what ``tessera tag RUN +a -b`` sends as the new tag list."""
    result = list(tags)
    for edit in edits:
        sign, name = edit[:1], edit[1:]
        if sign not in ("+", "-") or not name:
            raise ValueError(f"tag edit {edit!r} must be +NAME (add) or -NAME (remove)")
        problem = tag_problem(name) if sign == "+" else None
        if problem is not None:  # said of the edit typed, not of an index into the merged list
            raise ValueError(f"tag edit {edit!r}: {problem}")
        if sign == "+" and name not in result:
            result.append(name)
        elif sign == "-" and name in result:
            result.remove(name)
    return result


def order_by_key(order_by: str) -> str:
    """The metric key of an ``order_by`` value ``best:<key>``; ValueError for anything else."""
    if not order_by.startswith(ORDER_BY_PREFIX) or not order_by[len(ORDER_BY_PREFIX):]:
        raise ValueError("order_by must be best:<metric key>, e.g. best:eval/accuracy (best first: highest "
                         "for accuracy-like keys, lowest for loss/error/perplexity/*_s keys)")
    return order_by[len(ORDER_BY_PREFIX):]


class DeletionView(BaseModel):
    """What ``DELETE /runs/{id}`` or ``DELETE /sweeps/{id}`` removed."""

    kind: str = Field(description="run or sweep")
    id: str
    project: str
    run_ids: list[str] = Field(description="the runs deleted (a sweep's trials)")
    storage_urls: list[str] = Field(description="the storage folders removed (checkpoints, logs, exports)")
