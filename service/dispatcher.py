"""The dispatcher: submits queued runs and sweeps to Ray and follows their jobs until they end.

It drives two ``JobFollower``s, one per ``JobKind``: run attempts and sweep drivers.
``tick()`` does one pass over both and is what the tests drive; ``start()`` runs it every
``dispatch_interval_s`` on a background thread for the app's lifetime, and at once after
``wake()`` (a submit, a cancel, an ended run: ``service.dispatch_wake``); ``reconcile()`` makes
the database agree with Ray once at startup, before anything new is submitted.

Served by several processes (``TESSERA_WORKERS``), every process has a dispatcher but only the
one holding the ``lease`` (``service.dispatch_lease``) ticks; it reconciles when it takes the
lease. The others' threads try to take it each interval, and pass their wakes on to it. On a
Ray cluster the service did not start, the dispatching process also has the head node's warm
driver interpreter started once Ray answers (``service.driver_warmup``).

A tick never waits on Ray without a bound: it starts with one bounded call (the job list);
if Ray cannot be asked, the rest of the tick's Ray work is skipped and ``ray_error`` says
why, and the followers stop asking Ray as soon as one call fails. ``last_tick_at`` is what
``/healthz/live`` reads: a thread that stops ticking is a wedged service.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from api.views import QueueInfo
from service.access import AccessStore
from service import wall_clock
from service.admission import Admission
from service.dispatch_lease import DispatchLease, SoleLease
from service.driver_warmup import DriverWarmup
from service.job_follower import JobFollower
from service.job_kinds import RUN_JOBS, sweep_driver_jobs
from service.export_jobs import ExportOutcomes
from service.log_archive import LogArchiver
from service.log_store import LogStore
from service.ray_client import JobsClient
from service.repository import Repository
from service.settings import Settings
from service.sweep_repository import SweepRepository

log = logging.getLogger(__name__)

# How often a process that does not dispatch plans the queue (for the ``queue`` of its answers)
# while its answers read the plan, and reads the cluster's size: each plan reads every active run.
FOLLOWER_PLAN_S = 2.0
# How long the leader shows its last plan: ticks plan every interval, unless they cannot ask Ray.
LEADER_PLAN_SHOWN_S = 10.0
FOLLOWER_CAPACITY_READ_S = 10.0


class Dispatcher:
    """Moves runs and sweeps between the database and Ray; see the module docstring."""

    def __init__(self, repo: Repository, jobs: JobsClient, settings: Settings, lease: DispatchLease | None = None):
        self.repo = repo
        self.lease = lease or SoleLease()
        self.leading = False  # whether this process holds the lease (and has reconciled)
        self._planned_at = self._capacity_read_at = float("-inf")  # when this process last did
        self._plan_error: str | None = None  # why its last plan of the queue failed
        self._plan_read = False  # whether an answer read the plan since this process last made one
        self._plan_lock = threading.Lock()  # one plan at a time (``Admission`` keeps one plan's state)
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
        self.log_archiver = LogArchiver(
            [(f.kind, f.store) for f in self.followers], jobs,
            LogStore(settings.storage_url, timeout_s=settings.storage_timeout_s),
            exports=ExportOutcomes(settings.storage_url, jobs, repo.job_owners, timeout_s=settings.storage_timeout_s),
            # Far longer than an export request takes from its job's mark to its submit (a request
            # file's write, then the submit): a job is listed by Ray at the latest that much later.
            stray_marks_after_s=max(600.0, 2 * (settings.storage_timeout_s + settings.ray_timeout_s)))
        self.warmup = DriverWarmup(jobs, settings)  # a cluster's node gets a warm driver interpreter
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_tick_at = time.monotonic()  # when the loop last finished a tick (ok or not)
        self.ray_error: str | None = None  # why the last tick could not ask Ray; None: it could

    def tick(self) -> None:
        """One pass: submit every QUEUED run and sweep, and follow every active one's job."""
        started = time.perf_counter()
        listed_at = self.log_archiver.clock()  # every job submitted before this is in the list
        try:
            listed = [self.followers[0].job_states_now()]  # one list_jobs per tick, shared
        except OSError as exc:  # Ray down or hung: this tick costs one timeout, and does no Ray work
            self._ray_unreachable(exc)
            self.warmup.ray_lost()
        else:
            down, read = False, {}
            with self._plan_lock:  # the run follower plans the queue
                for follower in self.followers:
                    follower.ray_down = False
                    if not down:  # once Ray failed a call this tick, the next follower waits too
                        read[follower.kind.name] = follower.tick(lambda: listed[0])
                        down = follower.ray_down
                self._planned_at = time.monotonic()
            self.ray_error = "a call to Ray failed during the last tick" if down else None
            if down:
                self.warmup.ray_lost()
            else:
                self.warmup.tick(listed[0])
                # The followers' reads of the followed runs and sweeps, from the start of this tick,
                # serve the log archiver and (runs) the wall-clock check too: every active record is
                # read once a tick. One the followers just submitted or ended is seen on the next.
                self.log_archiver.offer(read, listed[0], listed_at)  # its copies run on its own thread, when started
                projects = {p.name: p for p in self.access.list_projects()}
                for run_id in wall_clock.enforce(self.repo, self.jobs, projects, active=read["run"]):
                    log.info("run %s: stopped at its wall-clock limit", run_id)
        for listener in self.tick_listeners:
            listener(time.perf_counter() - started)

    def _ray_unreachable(self, exc: OSError) -> None:
        if self.ray_error is None:
            log.warning("Ray cannot be asked; skipping Ray work until it answers: %s", exc)
        self.ray_error = str(exc)

    def reconcile(self) -> list[str]:
        """Compare every active run and sweep with Ray once (at startup); return the fixes made."""
        return [fix for follower in self.followers for fix in follower.reconcile()]

    def take_lead(self) -> bool:
        """Whether this process dispatches: it holds the lease, and reconciled when it took it."""
        held = self.lease.held()
        if held and not self.leading:
            # The runs and sweeps whose jobs ended while no process dispatched: once reconciled, their
            # final logs are copied and their jobs forgotten by Ray, as if this process had seen them live.
            followed = {f.kind.name: f.store.snapshots(f.kind.policy.followed) for f in self.followers}
            self.log_archiver.watch(followed)
            self.log_archiver.sweep_leftovers()  # and those of attempts that ended before
            for fix in self.reconcile():
                log.info("reconciled %s", fix)
            self.leading = True
            if not isinstance(self.lease, SoleLease):
                log.info("this process (pid %d) dispatches now", os.getpid())
        elif not held and self.leading:
            log.warning("this process (pid %d) no longer dispatches", os.getpid())
            self.leading = False
        return held

    # --- background thread ---------------------------------------------------------------
    def start(self) -> None:
        """Run ``tick()`` every ``dispatch_interval_s`` on a daemon thread until ``stop()``."""
        if self._thread is not None:
            return
        self._stop.clear()
        self.last_tick_at = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="tessera-dispatcher", daemon=True)
        self.log_archiver.start()
        self._thread.start()
        self.lease.listen(self._woken_by_another_process)

    @property
    def running(self) -> bool:
        """Whether the background thread was started (and not stopped)."""
        return self._thread is not None

    def wake(self) -> None:
        """Run the next tick now instead of at the end of the interval (no-op without the thread)."""
        self._wake.set()

    def queue_of(self, record_id: str) -> QueueInfo | None:
        """Where a QUEUED run or sweep stands in the last plan of the queue, and why it waits
        (None: not in it, or no plan to show). The leader plans every tick, and shows no plan
        older than ``LEADER_PLAN_SHOWN_S`` (ticks that cannot ask Ray do not plan). Another
        process plans only while its answers read the plan, so a burst of submits costs it no
        plans: in its dispatcher thread every ``FOLLOWER_PLAN_S`` while they do (``_plan_queue``),
        and here, on the request, when its plan is older than that (the first read after a quiet
        spell). A request never waits for a plan another thread is making: it reads the last."""
        now = time.monotonic()
        if self.leading:
            return self.admission.waiting.get(record_id) if now - self._planned_at <= LEADER_PLAN_SHOWN_S else None
        self._plan_read = True
        if now - self._planned_at >= FOLLOWER_PLAN_S:
            self._plan_now(now, wait=False)
        return self.admission.waiting.get(record_id)

    def _plan_queue(self, now: float) -> None:
        """In a process that does not dispatch: every ``FOLLOWER_PLAN_S`` while its answers read
        the plan (``queue_of``), plan the queue; every ``FOLLOWER_CAPACITY_READ_S``, read the
        cluster's size first: submits here are checked against it (``submit_problems``), and only
        the leader's ticks read it otherwise."""
        if now - self._capacity_read_at >= FOLLOWER_CAPACITY_READ_S:
            self._capacity_read_at = now
            self.admission.read_capacity()
        if self._plan_read and now - self._planned_at >= FOLLOWER_PLAN_S:
            self._plan_now(now)

    def _plan_now(self, now: float, *, wait: bool = True) -> None:
        """Plan the queue as the leader's tick does, without submitting; ticks and plans take
        turns (one ``Admission``). Without ``wait``, nothing happens while another thread plans
        or ticks. A failed plan leaves no places to show; the next try comes ``FOLLOWER_PLAN_S``
        later."""
        if not self._plan_lock.acquire(blocking=wait):
            return
        try:
            if now < self._planned_at:  # planned while this one waited for the lock
                return
            self._planned_at, self._plan_read = now, False
            runs = self.followers[0]
            try:
                self.admission(runs.owned([runs.kind.status.QUEUED]), fresh_capacity=False)
            except Exception as exc:  # the database is away: say so once, not every plan
                self.admission.waiting = {}
                if self._plan_error is None:
                    log.warning("cannot plan the queue (answers will not say why a run waits): %s", exc)
                self._plan_error = str(exc)
            else:
                self._plan_error = None
        finally:
            self._plan_lock.release()

    def _woken_by_another_process(self) -> None:
        if self.leading:
            self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self.log_archiver.stop(timeout_s)
        self.lease.close()

    def _loop(self) -> None:
        interval = self.settings.dispatch_interval_s
        while not self._stop.is_set():
            self._wake.clear()  # a wake during this tick makes the next one start early
            started = time.monotonic()
            try:
                if self.take_lead():
                    self.tick()
                else:
                    self._plan_queue(started)
            except Exception:  # e.g. the database is briefly unreachable
                log.exception("dispatcher tick failed; retrying in %.1fs", interval)
            self.last_tick_at = time.monotonic()
            took = self.last_tick_at - started
            # A woken tick still waits as long as the last one took: a burst of submits, each
            # waking it, leaves the request threads at least half of the time (and the GIL).
            if self._stop.wait(min(took, interval)):
                return
            if self._wake.wait(max(0.0, interval - took)) and not self.leading and not self._stop.is_set():
                self.lease.notify()  # a write this process answered: the leading process acts on it
