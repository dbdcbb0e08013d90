"""What the service returns, and what workers report. Separate from the specs and the tables."""

from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from api.limits import INT32_MAX, INT64_MAX, ReportedTime
from api.lineage import ForkInfo


class NamedStatus:
    """``of``, for the status enums (``RunStatus``, ``SweepStatus``): a member named in any case."""

    @classmethod
    def of(cls, value: enum.Enum | str) -> Self:
        """The status named ``value`` in any case (``completed``); ValueError names the value and lists the statuses."""
        name = str(value.value if isinstance(value, enum.Enum) else value).upper()
        if name not in cls.__members__:
            what = cls.__name__.removesuffix("Status").lower()  # "run", "sweep"
            raise ValueError(f"{value!r} is not a {what} status; one of {', '.join(cls.__members__)}")
        return cls[name]


class RunStatus(NamedStatus, str, enum.Enum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELING = "CANCELING"
    CANCELED = "CANCELED"
    STOPPED = "STOPPED"  # a sweep trial that the scheduler (ASHA) ended early: not a failure

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELED, RunStatus.STOPPED})
ACTIVE_STATUSES = frozenset({RunStatus.STARTING, RunStatus.RUNNING, RunStatus.RESTARTING, RunStatus.CANCELING})


# Why a FAILED run failed, as the worker or the dispatcher that recorded it knew (never read from
# the error's text): whether a resume is worth it.
RunFailure = Literal["machine", "code"]
RUN_FAILURE_DOC = ("once FAILED, why: 'machine' when what ran it was lost (a node or worker process died, Ray lost "
                   "or never made its job), so another attempt may pass; 'code' when the training raised (its code, "
                   "spec or data), which a resume would repeat; None when neither is known (a limit such as "
                   "max_wall_time, a job Ray refused or one stopped outside Tessera, a worker older than this field, "
                   "a run that failed before it)")


class QueueInfo(BaseModel):
    """Where a QUEUED run stands: ``position`` 1 is admitted next; ``reason`` says what it waits
    for: ``quota`` (its project's), ``resources`` (the cluster's CPUs/GPUs), ``priority``
    (runs ahead of it go first)."""

    position: int
    reason: Literal["quota", "resources", "priority"]
    detail: str | None = None


class RunView(BaseModel):
    id: str
    name: str
    status: RunStatus
    attempt: int
    spec: dict[str, Any]
    created_at: datetime
    started_at: datetime | None = Field(None, description="when the run first began training: the attempt_started_at "
                                                          "of its first attempt that reached RUNNING")
    attempt_started_at: datetime | None = Field(
        None, description="when the current attempt began training (its RUNNING, by the worker's clock, kept between "
                          "the attempt's submission and the report's arrival; the submission if that report was lost); "
                          "until then, when it was submitted (after a worker-group restart: the previous attempt's "
                          "start). None while QUEUED, and for runs that ended before this field")
    finished_at: datetime | None = None
    trained_seconds: float | None = Field(
        None, description="how long the run trained (held a worker group), in seconds, over its attempts that have "
                          "ended: each from when it began training (its RUNNING) to its end. Time queued or starting "
                          "between attempts is left out, which the wall-clock span from started_at to finished_at "
                          "counts. The attempt training now is not in it: add now - training_since while that is set "
                          "(RunView.trained_seconds_at does; the answer stays the same while the run trains, so a "
                          "poller's ETag holds). A worker-group restart inside a job counts as training (when the old "
                          "group stopped is not known); an attempt whose Ray job ended without the worker's report ends "
                          "when Ray saw the job end, and one whose job was lost when the service last heard of the "
                          "run; one that ended before it began training counts nothing. None from a "
                          "service older than this field")
    training_since: datetime | None = Field(
        None, description="while an attempt trains (RUNNING, RESTARTING, or CANCELING after it began training): when "
                          "it began, its attempt_started_at; None otherwise. trained_seconds + (now - training_since) "
                          "is how long the run has trained up to now")
    summary: dict[str, float] = Field(default_factory=dict, description="last reported value of each metric")
    best: dict[str, float] = Field(default_factory=dict,
                                   description="best reported value of each metric (see api.views.metric_mode)")
    error: str | None = None
    tags: list[str] = Field(default_factory=list)
    sweep_id: str | None = Field(None, description="the sweep this run is a trial of")
    driven_by_sweep: bool = Field(False, description="a trial whose attempts its sweep's driver owns: it is canceled "
                                                     "with its sweep (a trial resumed by hand is a run of its own)")
    trial_id: str | None = Field(None, description="the trial's id within its sweep (Ray Tune's)")
    project: str = Field("default", description="the project the run belongs to")
    queue: QueueInfo | None = Field(None, description="while QUEUED: its place in the queue and why it waits")
    replayed: bool | None = Field(None, description="only in the answer to a create: true when an earlier request "
                                                    "with this Idempotency-Key made it (nothing new was queued)")
    notes: str | None = Field(None, description="free text a member wrote about the run (PATCH /runs/{id})")
    archived_at: datetime | None = Field(None, description="when the run was archived (hidden from default lists)")
    final_checkpoint: Literal["saved", "missing"] | None = Field(
        None, description="once ended: whether the final weights were checkpointed (None: the run saves no "
                          "checkpoints); 'missing' means the final save failed after its retries")
    parent_id: str | None = Field(None, description="the run this one was forked from (its children: "
                                                    "GET /api/v1/runs/{id}/children)")
    fork: ForkInfo | None = Field(None, description="how it was forked: from, patch, and the checkpoint loaded")
    failure: RunFailure | None = Field(None, description=RUN_FAILURE_DOC)

    @property
    def restarts(self) -> int:
        """Attempts after the first: re-queues, resumes and worker-group restarts."""
        return self.attempt - 1

    def trained_seconds_at(self, now: datetime | None = None) -> float | None:
        """How long the run has trained up to ``now`` (default: this instant), its waits between
        attempts left out: ``trained_seconds`` and the attempt training now. None from a service
        older than the field (``span_seconds_at`` is then all there is)."""
        if self.trained_seconds is None:
            return None
        return trained_up_to(self.trained_seconds, self.training_since, now or datetime.now(timezone.utc))

    def span_seconds_at(self, now: datetime | None = None) -> float | None:
        """The wall-clock time from the run's first start to its end, or to ``now`` (default: this
        instant) while it has not ended: waits between attempts included. None before it first began."""
        if self.started_at is None:
            return None
        end = self.finished_at or now or datetime.now(timezone.utc)
        return max(0.0, (end - self.started_at).total_seconds())


def trained_up_to(trained_seconds: float, training_since: datetime | None, now: datetime) -> float:
    """Seconds a run trained up to ``now``: its ended attempts' (``trained_seconds``) and, while
    an attempt trains (``training_since`` set), the time since that attempt began (none if the
    clock reads before it)."""
    if training_since is None:
        return trained_seconds
    return trained_seconds + max(0.0, (now - training_since).total_seconds())


def metric_mode(key: str) -> Literal["min", "max"]:
    """Which way is better for a metric key: losses, perplexities, errors and durations (``*_s``)
    go down; everything else (accuracy, throughput) goes up."""
    lowered = key.lower()
    return "min" if any(w in lowered for w in ("loss", "perplexity", "error")) or lowered.endswith("_s") else "max"


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
    attempt: int | None = Field(None, description="the run's attempt that reported it (None: stored before "
                                                  "attempts were kept)")
    superseded: bool = Field(False, description="a later attempt resumed from an earlier step and reported this "
                                                "step again; listed only with all_attempts=true")


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


class ExportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int = Field(..., ge=0, le=2**63 - 1, description="a committed checkpoint's step (GET .../checkpoints)")


class ExportView(BaseModel):
    """A model export of one step: READY to download (``GET /runs/{id}/model?step=``), PENDING
    while a Ray job consolidates the checkpoint, or FAILED with the job's error."""

    step: int
    status: Literal["READY", "PENDING", "FAILED"]
    formats: list[Literal["safetensors", "torch"]] = Field(default_factory=list)
    job_id: str | None = None
    error: str | None = None


class ExportsPage(BaseModel):
    data: list[ExportView]


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
    step: int = Field(..., ge=0, le=INT64_MAX)
    key: str = Field(..., min_length=1, max_length=128)
    value: float
    time: ReportedTime


class MetricsReport(BaseModel):
    """A batch of points. ``session`` (the worker reporter's random id) and ``batch`` (its batch
    number, from 1, in order) make a replayed batch idempotent: the service stores each
    (session, batch) once and acknowledges a repeat without storing it again."""

    model_config = ConfigDict(extra="forbid")
    points: list[ReportedMetric] = Field(..., max_length=10_000)
    session: str | None = Field(None, min_length=1, max_length=32, pattern=r"^[0-9a-f]+$")
    batch: int | None = Field(None, ge=1, le=INT64_MAX)


class StatusReport(BaseModel):
    """A worker's word on its run: RUNNING once training starts, with when it started; RESTARTING
    when Ray restarts the worker group; COMPLETED or FAILED (with the error's message) at the end,
    with when it ended."""

    model_config = ConfigDict(extra="forbid")
    # Fields a worker may leave out when the service predates them (it refuses a field it does not
    # know: 422, extra_forbidden; ``workers.service_reporter``): times by the worker's clock, without
    # which the service takes the report's arrival. Never a field that changes what the report says
    # happened (status, step, final_checkpoint, failure).
    omittable_for_older_services: ClassVar[frozenset[str]] = frozenset({"started_at", "ended_at"})
    status: RunStatus
    error: str | None = Field(None, max_length=20_000)
    message: str | None = Field(None, max_length=2_000)
    step: int | None = Field(None, ge=0, le=INT64_MAX,
                             description="with RUNNING: the step this attempt starts from (its checkpoint's; 0 "
                                         "for a fresh start); points of earlier attempts after it are superseded")
    final_checkpoint: Literal["saved", "missing"] | None = Field(
        None, description="with COMPLETED: whether the final weights were checkpointed")
    failure: RunFailure | None = Field(
        None, description="with FAILED: 'machine' if, inside the exception, Ray says it lost a process or node of "
                          "the attempt; 'code' if the training raised; absent: not known (the run's failure stays "
                          "empty)")
    started_at: ReportedTime | None = Field(
        None, description="with RUNNING: when the attempt began training, by the worker's clock; the run's "
                          "attempt_started_at (and, on its first start, started_at), kept between the attempt's "
                          "start as known so far (its submission; after a RESTARTING, the previous group's start) "
                          "and the report's arrival (a report retried through an outage arrives late). "
                          "Without it, the arrival")
    ended_at: ReportedTime | None = Field(
        None, description="with COMPLETED or FAILED: when the attempt ended, by the worker's clock; the run's "
                          "finished_at, kept between its attempt_started_at and the report's arrival (a report retried "
                          "through an outage arrives late). Without it, finished_at is the arrival")


class NoteReport(BaseModel):
    """A worker's note on its run that is not a status change (e.g. old checkpoints could not
    be deleted): recorded as a run event."""

    model_config = ConfigDict(extra="forbid")
    message: str = Field(..., min_length=1, max_length=2_000)


class CheckpointReport(BaseModel):
    """A worker's word on one checkpoint: committed (its marker is written), or failed with why."""

    model_config = ConfigDict(extra="forbid")
    step: int = Field(..., ge=0, le=INT64_MAX)
    epoch: int = Field(..., ge=0, le=INT32_MAX, description="stored as a 32-bit integer")
    time: ReportedTime
    bytes: int = Field(0, ge=0, le=INT64_MAX)
    committed: bool
    url: str = Field(..., min_length=1, max_length=2_000)
    world_size: int = Field(..., ge=1, le=INT32_MAX, description="stored as a 32-bit integer")
    error: str | None = Field(None, max_length=20_000)


# --- sweeps ---------------------------------------------------------------------------------

class SweepStatus(NamedStatus, str, enum.Enum):
    """QUEUED → STARTING → RUNNING → COMPLETED | FAILED; CANCELING → CANCELED. A sweep whose
    driver job dies is re-queued (``attempt`` + 1) and its driver restores the Tune experiment."""

    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELING = "CANCELING"
    CANCELED = "CANCELED"

    @property
    def is_terminal(self) -> bool:
        return self in (SweepStatus.COMPLETED, SweepStatus.FAILED, SweepStatus.CANCELED)


# A sweep with a driver at work: the statuses the service follows its driver job in, and in which
# it holds a run of its project's max_running_runs (service.job_kinds, service.admission).
ACTIVE_SWEEP_STATUSES = frozenset({SweepStatus.STARTING, SweepStatus.RUNNING, SweepStatus.CANCELING})


class SkippedSet(BaseModel):
    """An algorithm set of the search that breaks a compatibility rule, with why; never run."""

    algorithms: list[str]
    reason: str


class TrialView(BaseModel):
    """One trial of a sweep: a Tessera run with the searched values that made it."""

    run_id: str
    trial_id: str
    name: str
    status: RunStatus  # STOPPED: ended early by the scheduler
    attempt: int
    algorithms: list[str]
    params: dict[str, Any] = Field(default_factory=dict)
    metric: float | None = Field(None, description="best value of the sweep's metric (by its mode)")
    last_metric: float | None = None
    wall_time_s: float | None = Field(None, description="the time it trained (up to now while it trains), its "
                                                           "waits between attempts left out; None before it first ran")
    progress: float | None = Field(None, description="fraction of max_duration trained (time/progress)")


class SweepView(BaseModel):
    id: str
    name: str
    status: SweepStatus
    attempt: int
    driver: Literal["service", "external"]
    spec: dict[str, Any]
    project: str = "default"
    metric: str
    mode: Literal["max", "min"]
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    message: str | None = None
    trials: list[TrialView] = Field(default_factory=list)
    skipped: list[SkippedSet] = Field(default_factory=list)
    pareto: list[str] = Field(default_factory=list,
                              description="run ids of the COMPLETED trials not dominated on (metric, wall time), "
                                          "fastest first")
    best_run_id: str | None = None
    counts: dict[str, int] = Field(default_factory=dict, description="trials per status")
    driver_token: str | None = Field(None, description="only in the answer to creating an external-driver sweep "
                                                        "(a replay of its Idempotency-Key gets a new one)")
    queue: QueueInfo | None = Field(None, description="while QUEUED: its place in the queue and why it waits")
    replayed: bool | None = Field(None, description="only in the answer to a create: true when an earlier request "
                                                    "with this Idempotency-Key made it (nothing new was queued)")
    archived_at: datetime | None = Field(None, description="when the sweep was archived (hidden from default lists)")


class SweepsPage(BaseModel):
    data: list[SweepView]
    next_cursor: str | None = None


class SweepStatusReport(BaseModel):
    """The sweep driver's word: RUNNING once Tune starts, COMPLETED or FAILED at the end."""

    model_config = ConfigDict(extra="forbid")
    status: SweepStatus
    message: str | None = Field(None, max_length=2_000)
    error: str | None = Field(None, max_length=20_000)


class TrialRegistration(BaseModel):
    """The driver registers a trial before training it: the first time this creates the trial's
    run; again (Tune restarted it) it starts a new attempt of the same run, which resumes from
    the run's newest committed checkpoint."""

    model_config = ConfigDict(extra="forbid")
    trial_id: str = Field(..., min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    spec: dict[str, Any]
    params: dict[str, Any] = Field(default_factory=dict)


class TrialTicket(BaseModel):
    """What a registered trial trains as: its run, that attempt's bearer token, the attempt."""

    run_id: str
    token: str
    attempt: int


class TrialEnd(BaseModel):
    """The driver's word on a trial Tune has finished with. ``stopped``: the scheduler ended it
    early (run → STOPPED); ``failed``: it errored (run → FAILED). Ignored if the run already ended."""

    model_config = ConfigDict(extra="forbid")
    outcome: Literal["stopped", "failed"]
    message: str | None = Field(None, max_length=2_000)
    error: str | None = Field(None, max_length=20_000)
