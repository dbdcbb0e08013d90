"""The contract of a run's logs: one page of an attempt's worker stdout/stderr, by byte offset."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class LogsPage(BaseModel):
    """Bytes ``offset``..``next_offset`` of one attempt's log, as text.

    Poll again with ``after=next_offset`` for what follows; ``live`` says more may still come
    (the attempt is the run's current one and the run has not ended).
    """

    run_id: str
    attempt: int = Field(description="the attempt this page is from")
    attempts: int = Field(description="the run's newest attempt; attempts 1..attempts may have logs")
    text: str = Field(description="the log's bytes from offset to next_offset, decoded as UTF-8")
    offset: int = Field(description="the byte offset this page starts at (the request's `after`)")
    next_offset: int = Field(description="pass as `after` to read on; equals offset when nothing new")
    size: int = Field(description="the log's size in bytes when it was read")
    live: bool = Field(description="the attempt is still running: poll again for more")
    source: Literal["ray", "storage", "none"] = Field(
        description="where the log was read: Ray's job log (live), the stored copy, or none yet")
