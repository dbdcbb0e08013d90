"""What the service returns, and what workers report. Separate from the specs and the tables."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class RunStatus(str, enum.Enum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELING = "CANCELING"
    CANCELED = "CANCELED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELED})
ACTIVE_STATUSES = frozenset({RunStatus.STARTING, RunStatus.RUNNING, RunStatus.RESTARTING, RunStatus.CANCELING})


class RunView(BaseModel):
    id: str
    name: str
    status: RunStatus
    attempt: int
    spec: dict[str, Any]
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    summary: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    tags: list[str] = Field(default_factory=list)


class RunsPage(BaseModel):
    data: list[RunView]
    next_cursor: str | None = None


class RunEventView(BaseModel):
    seq: int
    from_status: RunStatus | None
    to_status: RunStatus
    attempt: int
    time: datetime
    message: str | None = None


class RunEventsPage(BaseModel):
    data: list[RunEventView]


class MetricPoint(BaseModel):
    seq: int
    step: int
    key: str
    value: float
    time: datetime


class MetricsPage(BaseModel):
    data: list[MetricPoint]
    last_seq: int


class CheckpointView(BaseModel):
    """One checkpoint of a run. ``url`` is the fsspec URL of its folder (``file:///...`` or
    ``s3://...``), loadable with ``torch.distributed.checkpoint``; only committed ones are usable."""

    step: int
    epoch: int
    attempt: int
    time: datetime
    bytes: int
    committed: bool
    url: str
    world_size: int
    error: str | None = None


class CheckpointsPage(BaseModel):
    data: list[CheckpointView]


class ResumeRequest(BaseModel):
    """``POST /runs/{id}/resume``: optionally run the resumed attempt on a different number of workers."""

    model_config = ConfigDict(extra="forbid")
    num_workers: int | None = Field(None, ge=1, le=1024)


class CatalogEntry(BaseModel):
    """A model, data set or algorithm: its metadata plus the JSON schema of its spec."""

    model_config = ConfigDict(extra="allow")
    name: str
    params_schema: dict[str, Any]


class CatalogPage(BaseModel):
    data: list[CatalogEntry]


# --- worker -> service reports (authenticated with the per-attempt run token) -------------

class ReportedMetric(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: int = Field(..., ge=0)
    key: str = Field(..., min_length=1, max_length=128)
    value: float
    time: datetime


class MetricsReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    points: list[ReportedMetric] = Field(..., max_length=10_000)


class StatusReport(BaseModel):
    """A worker's word on its run: RUNNING once training starts, RESTARTING when Ray restarts the
    worker group, COMPLETED or FAILED (with the error's message) at the end."""

    model_config = ConfigDict(extra="forbid")
    status: RunStatus
    error: str | None = Field(None, max_length=20_000)
    message: str | None = Field(None, max_length=2_000)


class CheckpointReport(BaseModel):
    """A worker's word on one checkpoint: committed (its marker is written), or failed with why."""

    model_config = ConfigDict(extra="forbid")
    step: int = Field(..., ge=0)
    epoch: int = Field(..., ge=0)
    time: datetime
    bytes: int = Field(0, ge=0)
    committed: bool
    url: str = Field(..., min_length=1, max_length=2_000)
    world_size: int = Field(..., ge=1)
    error: str | None = Field(None, max_length=20_000)
