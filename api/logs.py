"""The contract of logs: one page of a run attempt's worker stdout/stderr, or of a sweep driver
attempt's log, by byte offset."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class LogPage(BaseModel):
    """Bytes ``offset``..``next_offset`` of one attempt's log, as text (what ``LogsPage`` and
    ``SweepLogsPage`` share).

    Poll again with ``after=next_offset`` for what follows; ``live`` says more may still come
    (the attempt is the record's current one and the record has not ended).
    """

    attempt: int = Field(description="the attempt this page is from")
    attempts: int = Field(description="the newest attempt; attempts 1..attempts may have logs")
    text: str = Field(description="the log's bytes from offset to next_offset, decoded as UTF-8")
    offset: int = Field(description="the byte offset this page starts at (the request's `after`)")
    next_offset: int = Field(description="pass as `after` to read on; equals offset when nothing new")
    size: int = Field(description="the log's size in bytes when it was read")
    live: bool = Field(description="more may still come: poll again (the attempt runs, and writes a log here)")
    source: Literal["ray", "storage", "none"] = Field(
        description="where the log was read: Ray's job log, the stored copy, or none yet")


# The id comes first in the JSON (a base's fields come after those of the bases listed after it).
class _RunId(BaseModel):
    run_id: str


class _SweepId(BaseModel):
    sweep_id: str


class LogsPage(LogPage, _RunId):
    """A page of a run attempt's worker stdout/stderr (a sweep trial's: its driver's log)."""


class SweepLogsPage(LogPage, _SweepId):
    """A page of a sweep driver attempt's log: the Tune driver's output and every trial's."""
