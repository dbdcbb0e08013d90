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
    live: bool = Field(description="the attempt is still running: poll again for more")
    source: Literal["ray", "storage", "none"] = Field(
        description="where the log was read: Ray's job log (live), the stored copy, or none yet")


class LogsPage(LogPage):
    """A page of a run attempt's worker stdout/stderr (a sweep trial's: its driver's log)."""

    run_id: str


class SweepLogsPage(LogPage):
    """A page of a sweep driver attempt's log: the Tune driver's output and every trial's."""

    sweep_id: str
