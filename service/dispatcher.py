"""The dispatcher: submits queued runs and sweeps to Ray and follows them until they end.

``tick()`` does one pass and is what the tests drive; ``start()`` runs it every
``dispatch_interval_s`` on a background thread for the app's lifetime. Each run is handled on
its own, so one run's problem is logged and never stops the loop. Sweep trials are runs whose
jobs belong to their sweep's driver: they are neither submitted nor synced here
(``service.sweep_dispatch`` follows the driver job instead).
"""

from __future__ import annotations

import logging
import secrets
import shlex
import threading

from api.views import RunStatus
from service.ray_jobs import JobsClient, forwarded_env
from service.reconciler import SYNCED_STATUSES, sync_run
from service.repository import Repository, RunRecord
from service.settings import Settings
from service.state_machine import IllegalTransition
from service.sweep_dispatch import tick_sweeps
from service.sweep_repository import SweepRepository

log = logging.getLogger(__name__)



def worker_entrypoint(settings: Settings, run_id: str) -> str:
    return f"{shlex.quote(settings.worker_python)} -m workers.launch --run-id {shlex.quote(run_id)}"


def job_env(settings: Settings, run: RunRecord, token: str) -> dict[str, str]:
    """Environment of one attempt's Ray job: where to report, with which token, where to store."""
    env = forwarded_env()
    env.update({
        "TESSERA_SERVICE_URL": settings.public_url,
        "TESSERA_RUN_TOKEN": token,
        "TESSERA_RUN_ID": run.id,
        "TESSERA_ATTEMPT": str(run.attempt),
        "TESSERA_STORAGE_URL": settings.storage_url,
    })
    return env


class Dispatcher:
    """Moves runs between the database and Ray; see the module docstring."""

    def __init__(self, repo: Repository, jobs: JobsClient, settings: Settings):
        self.repo = repo
        self.sweeps = SweepRepository(repo)
        self.jobs = jobs
        self.settings = settings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        """One pass: submit every QUEUED run, sync every active or canceling run with Ray, then
        do the same for sweep driver jobs."""
        queued = self.repo.runs_with_status([RunStatus.QUEUED])
        for run in queued:
            self._guarded(self._submit, run)
        # A run submitted a moment ago is looked at from the next tick on: a submission whose
        # answer was lost may not be visible in Ray yet, and must not read as "job gone".
        just_submitted = {run.id for run in queued}
        for run in self.repo.runs_with_status(SYNCED_STATUSES):
            if run.id not in just_submitted and not run.driven_by_sweep:
                self._guarded(sync_run, self.repo, self.jobs, run)
        tick_sweeps(self.sweeps, self.jobs, self.settings)

    def _guarded(self, action, *args) -> None:
        run = args[-1]
        try:
            action(*args)
        except IllegalTransition as exc:  # a user or worker changed the run first; theirs stands
            log.debug("run %s: %s", run.id, exc.detail)
        except Exception:
            log.exception("dispatcher: run %s (%s) could not be handled; will retry", run.id, run.status.value)

    def _submit(self, run: RunRecord) -> None:
        token = secrets.token_urlsafe(32)
        started = self.repo.begin_attempt(run.id, token=token,
                                          message=f"submitting attempt {run.attempt} to Ray")
        try:
            self.jobs.submit(started.ray_job_id, worker_entrypoint(self.settings, run.id),
                             job_env(self.settings, started, token))
        except OSError:
            # Ray unreachable: the attempt stays STARTING. Once Ray answers again and has no
            # such job, sync_run re-queues the run, so no attempt is lost or run twice.
            log.warning("dispatcher: Ray unreachable while submitting %s; will retry", started.ray_job_id)
            return
        except Exception as exc:
            self.repo.transition(run.id, RunStatus.FAILED, error=f"Ray refused job {started.ray_job_id}: {exc}",
                                 only_from=[RunStatus.STARTING], attempt=started.attempt)
            log.warning("dispatcher: Ray refused %s: %s", started.ray_job_id, exc)
            return
        log.info("run %s: submitted Ray job %s", run.id, started.ray_job_id)

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
