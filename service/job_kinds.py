"""The two kinds of Ray job the service submits and follows: a run's attempt and a sweep's driver.

Both go through the same ``JobFollower``; a ``JobKind`` holds everything that differs: what
the job runs, its environment, which statuses are followed, which job outcomes queue the next
attempt, and how the fixes read in event messages.

* A run attempt (``python -m workers.launch --run-id ID``, Ray job ``run-{id}-attempt-{n}``)
  whose job Ray no longer knows is re-queued as the next attempt, without limit: its job was
  lost (a Ray restart), not its code. A job that failed or was stopped fails the run.
* A sweep driver (``python -m workers.tune --sweep-id ID``, Ray job ``sweep-{id}-attempt-{n}``)
  that died without reporting an end (lost, failed or stopped) is re-queued as the next attempt,
  which restores the Tune experiment, up to ``settings.sweep_driver_restarts`` times; then the
  sweep fails with the job's log tail. Only ``driver="service"`` sweeps have a driver job.

Trials are runs whose jobs are their sweep's driver's, so the run kind leaves them alone.
"""

from __future__ import annotations

import enum
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from api.views import ACTIVE_SWEEP_STATUSES, RunStatus, SweepStatus
from service.lifecycle import FollowPolicy
from service.ray_head import common_job_env
from service.settings import Settings
from service.storage_paths import project_storage_url

STOPPED_OUTSIDE = "Ray job was stopped outside Tessera"
ENDED_WITHOUT_RESULT = "Ray job ended without reporting a result"
DRIVER_ENDED_WITHOUT_RESULT = "the sweep driver's Ray job ended without reporting a result"
# A trainer that cannot get its workers must fail fast so Tune retries it, not wait forever.
DEFAULT_WORKER_GROUP_START_TIMEOUT_S = "30"


@dataclass(frozen=True)
class JobKind:
    """One kind of record (run or sweep) that owns a Ray job per attempt."""

    name: str  # "run" | "sweep": in flags (--run-id), env names (TESSERA_RUN_ID) and logs
    status: type[enum.Enum]  # RunStatus | SweepStatus: both have QUEUED, STARTING, FAILED, CANCELED
    policy: FollowPolicy
    owns: Callable[[Any], bool]  # whether a record's job is this kind's to submit and follow
    module: str  # the job runs `python -m <module> --<name>-id <id>` (through workers.fork_exec)
    job_noun: str  # how the job is named in event messages
    attempt_noun: str
    ended_without_result: str  # the error when the job SUCCEEDED but the record never ended
    stopped_outside: str | None = None  # the error when Ray reports STOPPED and that fails the record
    lost_at_startup: str = "not found"  # how "Ray has no such job" reads in the startup reconcile
    env_defaults: Mapping[str, str] = field(default_factory=dict)  # unless the service's env sets them
    restart_limit: int | None = None  # re-queues after the first attempt; None: unlimited
    give_up: str = ""  # the error once restarts are spent: {attempt}, {limit}, {last}
    # Whether every attempt has a job of its own (a sweep driver's), so that a job's log is
    # exactly its attempt's; a run's worker-group restart moves it to a new attempt on the same job.
    job_per_attempt: bool = False

    def entrypoint(self, settings: Settings, record_id: str) -> str:
        # workers.fork_exec forks the driver from a warm interpreter on the node when one is
        # there (it saves the driver's ~2 s of imports), else runs `python -m <module>` itself.
        return (f"{shlex.quote(settings.worker_python)} -m workers.fork_exec {self.module} "
                f"--{self.name}-id {shlex.quote(record_id)}")

    def job_env(self, settings: Settings, record: Any, token: str) -> dict[str, str]:
        """Environment of one attempt's job: where to report, with which token, where to store."""
        env = common_job_env()
        for name, value in self.env_defaults.items():
            env.setdefault(name, value)
        prefix = f"TESSERA_{self.name.upper()}"
        env.update({
            "TESSERA_SERVICE_URL": settings.public_url,
            f"{prefix}_TOKEN": token,
            f"{prefix}_ID": record.id,
            "TESSERA_ATTEMPT": str(record.attempt),
            "TESSERA_STORAGE_URL": project_storage_url(settings.storage_url, record.project),
            "TESSERA_DATA_DIRS": ":".join(str(d) for d in settings.data_dirs),  # workers check roots again
        })
        return env

    def restarts_left(self, attempt: int) -> int | None:
        """Re-queues still allowed for a record on ``attempt``; None: unlimited."""
        return None if self.restart_limit is None else self.restart_limit - attempt + 1


RUN_JOBS = JobKind(
    name="run",
    status=RunStatus,
    policy=FollowPolicy(
        followed=frozenset({RunStatus.STARTING, RunStatus.RUNNING, RunStatus.RESTARTING, RunStatus.CANCELING}),
        canceling=RunStatus.CANCELING,
        retry_on=frozenset({None})),
    owns=lambda run: not run.driven_by_sweep,  # a trial's job is its sweep driver's
    module="workers.launch",
    job_noun="Ray job",
    attempt_noun="attempt",
    ended_without_result=ENDED_WITHOUT_RESULT,
    stopped_outside=STOPPED_OUTSIDE,
    lost_at_startup="not found after a service restart",
)


def sweep_driver_jobs(settings: Settings) -> JobKind:
    """The sweep driver kind, with ``settings.sweep_driver_restarts`` as its restart limit."""
    return JobKind(
        name="sweep",
        status=SweepStatus,
        policy=FollowPolicy(
            followed=ACTIVE_SWEEP_STATUSES,
            canceling=SweepStatus.CANCELING,
            retry_on=frozenset({None, "FAILED", "STOPPED"})),
        owns=lambda sweep: sweep.driver == "service",  # an external driver runs outside Ray's Jobs API
        module="workers.tune",
        job_noun="driver job",
        attempt_noun="driver attempt",
        ended_without_result=DRIVER_ENDED_WITHOUT_RESULT,
        env_defaults={"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": DEFAULT_WORKER_GROUP_START_TIMEOUT_S},
        restart_limit=settings.sweep_driver_restarts,
        job_per_attempt=True,
        give_up="the sweep driver died {attempt} time(s), more than sweep_driver_restarts={limit} allows; "
                "last: {last}",
    )
