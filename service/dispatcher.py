"""The dispatcher: submits queued runs and sweeps to Ray and follows their jobs until they end.

It drives two ``JobFollower``s, one per ``JobKind``: run attempts and sweep drivers.
``tick()`` does one pass over both and is what the tests drive; ``start()`` runs it every
``dispatch_interval_s`` on a background thread for the app's lifetime; ``reconcile()`` makes
the database agree with Ray once at startup, before anything new is submitted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from service.access import AccessStore
from service import wall_clock
from service.admission import Admission
from service.job_follower import JobFollower
from service.job_kinds import RUN_JOBS, sweep_driver_jobs
from service.log_archive import LogArchiver
from service.log_store import LogStore
from service.ray_client import JobsClient
from service.repository import Repository
from service.settings import Settings
from service.sweep_repository import SweepRepository

log = logging.getLogger(__name__)


class Dispatcher:
    """Moves runs and sweeps between the database and Ray; see the module docstring."""

    def __init__(self, repo: Repository, jobs: JobsClient, settings: Settings):
        self.repo = repo
        self.sweeps = SweepRepository(repo)
        self.jobs = jobs
        self.settings = settings
        self.access = AccessStore(repo.db)
        # Runs and sweep drivers go to Ray through one admission queue, planned once per tick by
        # the run follower (which ticks first); the sweep follower takes the sweeps it admitted.
        self.admission = Admission(repo, jobs, self.access, sweeps=self.sweeps, autoscaler=settings.autoscaler)
        self.followers = (
            JobFollower(RUN_JOBS, repo, jobs, settings, admit=self.admission),
            JobFollower(sweep_driver_jobs(settings), self.sweeps, jobs, settings, admit=self.admission.admit_sweeps),
        )
        self.tick_listeners: list[Callable[[float], None]] = []  # each gets a tick's duration (s)
        self.log_archiver = LogArchiver(repo, jobs, LogStore(settings.storage_url))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        """One pass: submit every QUEUED run and sweep, and follow every active one's job."""
        started = time.perf_counter()
        listed: list[dict[str, str] | None] = []

        def job_states() -> dict[str, str] | None:  # at most one list_jobs per tick, shared
            if not listed:
                listed.append(self.followers[0].job_states_now())
            return listed[0]

        for follower in self.followers:
            follower.tick(job_states)
        self.log_archiver.tick()
        projects = {p.name: p for p in self.access.list_projects()}
        for run_id in wall_clock.enforce(self.repo, self.jobs, projects):
            log.info("run %s: stopped at its wall-clock limit", run_id)
        for listener in self.tick_listeners:
            listener(time.perf_counter() - started)

    def reconcile(self) -> list[str]:
        """Compare every active run and sweep with Ray once (at startup); return the fixes made."""
        return [fix for follower in self.followers for fix in follower.reconcile()]

    # --- background thread ---------------------------------------------------------------
    def start(self) -> None:
        """Run ``tick()`` every ``dispatch_interval_s`` on a daemon thread until ``stop()``."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="tessera-dispatcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # e.g. the database is briefly unreachable
                log.exception("dispatcher tick failed; retrying in %.1fs", self.settings.dispatch_interval_s)
            self._stop.wait(self.settings.dispatch_interval_s)
