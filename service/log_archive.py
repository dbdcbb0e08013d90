"""Copy run attempts' Ray job logs into storage, so they outlive the Ray cluster.

Each dispatcher tick, the archiver looks at the run attempts whose jobs the dispatcher follows.
While an attempt is live its log is copied every ``every_ticks`` ticks (a crash of the Ray head
then loses at most that much), but a tick copies at most ``copies_per_tick`` live logs, those
copied longest ago first: each copy is a Ray call, and a tick must not make one per run (with
1,000 live runs, each log is then copied every 100 ticks). Once the attempt is no longer
followed (its run ended, or a new attempt began) its job's final log is copied once Ray says
the job has finished. What the archiver remembers lives in memory: an attempt that ended while the service was down is copied
when someone first reads its logs (``service.routes.logs``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from service.log_store import LogStore
from service.ray_client import FINISHED_JOB_STATES, JobsClient
from service.repository import Repository
from service.job_kinds import RUN_JOBS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attempt:
    run_id: str
    attempt: int
    job_id: str
    project: str


def archive_final_log(jobs: JobsClient, store: LogStore, attempt: Attempt, text: str | None = None) -> bool:
    """Store the attempt's final log once Ray says its job has finished; True once there is
    nothing left to wait for (stored, or Ray has no such job). ``text``: the log, if already read."""
    state = jobs.status(attempt.job_id)
    if state is not None and state not in FINISHED_JOB_STATES:
        return False  # still stopping: copy once it has ended
    text = jobs.job_logs(attempt.job_id) if text is None else text
    if text is not None:
        store.save(attempt.run_id, attempt.attempt, text, project=attempt.project)
    return True


class LogArchiver:
    """Copies followed attempts' logs to a ``LogStore``; ``tick`` is called by the dispatcher."""

    def __init__(self, repo: Repository, jobs: JobsClient, store: LogStore, *, every_ticks: int = 10,
                 copies_per_tick: int = 10):
        self.repo = repo
        self.jobs = jobs
        self.store = store
        self.every_ticks = every_ticks
        self.copies_per_tick = copies_per_tick
        self._ticks = 0
        self._copied_at: dict[Attempt, int] = {}  # live attempts: the tick of their last copy (0: none yet)
        self._watched: set[Attempt] = set()
        self._stalled = False

    def tick(self, runs: list[Any] | None = None) -> None:
        """Copy each live attempt's log once every ``every_ticks`` ticks, and ended attempts' final
        logs. ``runs``: every run in a followed status, as the dispatcher read them this tick
        (None: read them here)."""
        self._ticks += 1
        self._stalled = False  # a hung store or Ray: one timeout per tick, not one per attempt
        if runs is None:
            runs = self.repo.snapshots(RUN_JOBS.policy.followed)
        live = {Attempt(run.id, run.attempt, run.ray_job_id, run.project)
                for run in runs if RUN_JOBS.owns(run) and run.ray_job_id}
        self._copied_at = {attempt: self._copied_at.get(attempt, 0) for attempt in live}
        due = [attempt for attempt, tick in self._copied_at.items() if tick == 0 or self._ticks - tick >= self.every_ticks]
        for attempt in sorted(due, key=self._copied_at.__getitem__)[:self.copies_per_tick]:
            if not self._stalled and self._copy(attempt, final=False):
                self._copied_at[attempt] = self._ticks
        for attempt in self._watched - live:
            if not self._stalled and self._copy(attempt, final=True):
                self._watched.discard(attempt)
        self._watched |= live

    def _copy(self, attempt: Attempt, *, final: bool) -> bool:
        """Copy one attempt's log; True once there is nothing left to wait for (final copy made,
        or Ray has no such job). A Ray or storage error is logged and retried next tick."""
        try:
            if final:
                return archive_final_log(self.jobs, self.store, attempt)
            text = self.jobs.job_logs(attempt.job_id)
            if text is not None:
                self.store.save(attempt.run_id, attempt.attempt, text, project=attempt.project)
            return True
        except Exception as exc:
            log.warning("could not copy the log of %s; will retry", attempt.job_id, exc_info=True)
            self._stalled = isinstance(exc, OSError)  # StorageTimeout and RayUnavailable both are
            return False
