"""Copy the Ray job logs of run attempts and sweep driver attempts into storage, so they
outlive the Ray cluster, then have Ray forget the finished jobs.

Each dispatcher tick hands the archiver the run attempts and sweep driver attempts whose jobs
the dispatcher follows, and the archiver makes one pass over them (both kinds alike: below,
"attempt" and "run" stand for either). While an attempt is live its log is copied every
``every_ticks`` passes (a crash of the Ray head then loses at most that much; a pass a tick, 5 s,
while the archiver keeps up, longer when a slow Ray or storage makes passes outlast ticks), but a pass copies
at most ``copies_per_tick`` live logs, those copied longest ago first: each copy is a Ray call
and a storage write, and a pass must not make one per run (with 1,000 live runs, each log is
then copied every 100 passes). Once the attempt is no longer followed (its run ended, or a new
attempt began) its job's final log is copied once Ray says the job has finished (two Ray calls;
these are not capped: a run ends once).

Then Ray is told to forget the job (one more call), ``forget_after_s`` later. Ray lists every job
it was not told to forget, and each dispatcher tick reads that list: left there, finished jobs
made a tick's one Ray call grow with every run the cluster ever ran (``bench/ray_job_list.py``).
The wait is Ray's: its job manager watches each job's supervisor actor once a second, and if it
finds the actor gone and the job's record deleted, it writes the record again as a FAILED job
("Job supervisor actor died"), which no one would delete. In a check here, a job deleted as
soon as it finished came back that way and one deleted 10 s after did not; a loaded head may
need longer.

What the archiver remembers lives in memory. As a process takes over dispatching, it ``watch``es
the runs then active, so those whose jobs ended while no process dispatched have their final
logs copied and their jobs forgotten once the reconciler ends them. It also sweeps Ray's list
once (``sweep_leftovers``): a finished attempt job that Ray still lists, that no watched
attempt owns and whose run has ended (its attempt ended shortly before the restart, with its
final copy or its delete not yet made, or it ended before any archiver deleted jobs) is handled
like an attempt that just ended: final log copied if it is the job the run ended on, then
forgotten. Those join the watched attempts ``copies_per_tick`` a pass, so a backlog of thousands
does not hold up the live copies. Left in Ray's list are jobs Ray refused to delete
``FORGET_TRIES`` times, jobs of runs still queued or followed, and jobs whose run this database
does not hold (another service's, on a shared cluster). A sweep's trials have no jobs of their
own: a trial's log is its sweep driver's, read from the stored copy once Ray has forgotten the
driver's job (``service.routes.logs``).

Model exports' jobs (``service.export_jobs``) are followed by no record: each pass looks for
finished ones in the tick's job list (read for the followers anyway), has their outcome stored
(``ExportOutcomes``: a failed export's error, which until then was read back from Ray; nothing
for one whose file is there) and has Ray forget them ``forget_after_s`` later, at most
``copies_per_tick`` a pass. So a process that takes the lead finds those left from before in its
first pass. An export job is this service's if it was marked so when submitted (its mark goes once
Ray has forgotten it) or its run is in this database: left in Ray's list are others (another
service's, on a shared cluster), and all of them when the Jobs client cannot list jobs. Every
``stray_marks_after_s`` or so a pass also lists the marks, and removes those whose job Ray
listed at neither this look nor the last (``_remove_stray_marks``).

In the service the passes run on the archiver's own thread (``start``), so a tick never waits
for Ray's log reads or the storage's writes (each a network call against a real Ray and S3;
in a profile with local files and a fake Ray they were still about a third of a tick with
1,000 live runs). A tick only hands over its runs (``offer``); when a pass takes longer than a
tick, the ticks that came meanwhile fold into the next pass, which also watches the attempts
that were live only in them (so one that started and ended during a pass still has its final
log copied). Without the thread (tests that call ``Dispatcher.tick`` themselves), ``offer``
makes the pass at once.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.attempt_store import AttemptStore, parse_attempt_job_id
from service.export_jobs import ExportOutcomes, parse_export_job_id
from service.job_kinds import JobKind
from service.log_store import LogStore
from service.ray_client import FINISHED_JOB_STATES, JobsClient, job_states

log = logging.getLogger(__name__)

FORGET_TRIES = 3  # deletes of one finished job before it is left in Ray's list
SWEEP_TRIES = 3  # passes that try to read Ray's list for ``sweep_leftovers`` before it gives up

Records = Mapping[str, Sequence[Any]]  # what a tick read of each kind's followed records, by kind name
JobStates = Mapping[str, str]  # Ray's job list as a tick read it: {job id: state}


@dataclass(frozen=True)
class Attempt:
    record_id: str  # the run's id, or the sweep's
    attempt: int
    job_id: str
    project: str
    kind: str = "run"  # JobKind.name: "run" or "sweep"


def archive_final_log(jobs: JobsClient, store: LogStore, attempt: Attempt, text: str | None = None) -> bool:
    """Store the attempt's final log once Ray says its job has finished; True once there is
    nothing left to wait for (stored, or Ray has no such job). ``text``: the log, if already read."""
    state = jobs.status(attempt.job_id)
    if state is not None and state not in FINISHED_JOB_STATES:
        return False  # still stopping: copy once it has ended
    text = jobs.job_logs(attempt.job_id) if text is None else text
    save_log(store, attempt, text, final=state is not None)
    return True


def save_log(store: LogStore, attempt: Attempt, text: str | None, *, final: bool) -> None:
    """Store the attempt's log (``final``: its finished job's whole log, marked so); an empty
    answer (Ray lost the file) never replaces a stored copy."""
    if text:
        store.save(attempt.record_id, attempt.attempt, text, project=attempt.project, kind=attempt.kind,
                   final=final)


class LogArchiver:
    """Copies followed attempts' logs to a ``LogStore``; the dispatcher ``offer``s it each tick's
    records. ``sources``: each kind of job with the store of its records (runs, sweeps);
    ``exports``: where finished export jobs' outcomes are stored (None: their jobs are left)."""

    def __init__(self, sources: Sequence[tuple[JobKind, AttemptStore]], jobs: JobsClient, store: LogStore, *,
                 exports: ExportOutcomes | None = None, every_ticks: int = 10, copies_per_tick: int = 10,
                 forget_after_s: float = 10.0, stray_marks_after_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic):
        self.sources = list(sources)
        self.jobs = jobs
        self.store = store
        self.exports = exports
        self.every_ticks = every_ticks
        self.copies_per_tick = copies_per_tick
        self.forget_after_s = forget_after_s
        self.stray_marks_after_s = stray_marks_after_s
        self.clock = clock  # when forgets are due
        self.passes = 0  # made so far
        # Live attempts: (the pass their next copy is due, a count that breaks ties first come, first served)
        self._due_at: dict[Attempt, tuple[int, int]] = {}
        self._turns = itertools.count()
        self._watched: set[Attempt] = set()
        # Finished jobs whose final logs are stored: when to delete each, and the tries left
        self._forget_at: dict[str, tuple[float, int]] = {}
        # Export jobs done with while Ray's list holds them: outcome stored (to be forgotten), or
        # of a run this database does not hold (left); and the pass each failed one is tried again
        self._settled: set[str] = set()
        self._export_retry: dict[str, int] = {}
        # Marked export jobs Ray did not list at the last look for stray marks, and when that
        # look's listing of the marks ended (None: no look yet, the next pass with a job list makes one)
        self._unlisted_marks: set[str] = set()
        self._marks_seen_at: float | None = None
        self._stalled = False
        # The last tick's records and job list, waiting for the thread's next pass
        self._offered: tuple[Records, JobStates | None, float | None] | None = None
        # Live in a replaced offer, or handed to ``watch``: watched from the next pass on
        self._folded: set[Attempt] = set()
        self._sweep_due = False  # ``sweep_leftovers`` was called: the next pass reads Ray's list
        self._sweep_tries = 0  # failed reads of the list since
        self._leftovers: list[Attempt] = []  # ended attempts found by the sweep, not watched yet
        self._changed = threading.Condition()
        self._stopping = False
        self._started = False  # once started, offers go to the thread (dropped once it stops), never inline
        self._serving = False  # a thread is in its loop; it clears this, under the lock, as it ends
        self._thread: threading.Thread | None = None

    # --- the archiver's thread -----------------------------------------------------------
    def start(self) -> None:
        """Make the passes on a daemon thread from now on, until ``stop()``."""
        with self._changed:
            self._stopping, self._started = False, True
            if self._serving:
                return  # one a stop left running (its join timed out) goes on serving
            self._serving = True
            self._thread = threading.Thread(target=self._loop, name="tessera-log-archiver", daemon=True)
            self._thread.start()

    def offer(self, records: Records, states: JobStates | None = None, listed_at: float | None = None) -> None:
        """A tick's records and Ray's job list (as ``tick`` takes them): the thread's next pass,
        or a pass now if ``start()`` was never called."""
        with self._changed:
            inline = not self._started
            # Once stopping, a tick that outlasted the dispatcher's stop: no pass takes its runs.
            if self._started and not self._stopping:
                if self._offered is not None:
                    # Not taken yet: the newest runs replace it. An attempt live only in the replaced
                    # offer (it started and ended during one pass) is still watched, so the next
                    # pass copies its final log.
                    self._folded |= self._live(self._offered[0])
                self._offered = (records, states, listed_at)
                self._changed.notify()
        if inline:
            with self._changed:
                folded, self._folded = self._folded, set()
            self.tick(records, folded, states, listed_at)

    def watch(self, records: Records) -> None:
        """Watch the live attempts of ``records`` (as ``tick`` takes them) as if a pass had seen them:
        once no longer followed, their final logs are copied and their jobs forgotten. The
        dispatcher calls this as it takes the lead, before the reconciler ends the runs whose jobs
        ended while no process dispatched (this archiver never saw them live)."""
        with self._changed:
            self._folded |= self._live(records)

    def sweep_leftovers(self) -> None:
        """At the next pass, read Ray's job list once and handle every finished attempt job
        in it that no watched attempt owns as an attempt that just ended (final log, then
        forgotten). The dispatcher calls this as it takes the lead."""
        with self._changed:
            self._sweep_due, self._sweep_tries = True, 0

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the thread once it has made its current pass and the one offered last, if any (a
        pass waits on Ray's and the storage's timeouts at most). A thread still busy after
        ``timeout_s`` is left to end by itself (a daemon; it takes no more offers)."""
        with self._changed:
            self._stopping = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if not self._thread.is_alive():
                self._thread = None

    def _loop(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._stopping or self._offered is not None)
                if self._offered is None:  # stopping, with every offer taken
                    self._serving = False  # in the same hold as the check: a start() now makes a new thread
                    return
                (records, states, listed_at), folded = self._offered, self._folded
                self._offered, self._folded = None, set()
            try:
                self.tick(records, folded, states, listed_at)
            except Exception:  # e.g. a bug: logged, and the next tick's records get their pass
                log.exception("the log archiver's pass failed")

    # --- one pass ------------------------------------------------------------------------
    def tick(self, records: Records | None = None, folded: set[Attempt] | frozenset[Attempt] = frozenset(),
             states: JobStates | None = None, listed_at: float | None = None) -> None:
        """One pass: copy each live attempt's log once every ``every_ticks`` passes, and ended
        attempts' final logs; store finished export jobs' outcomes. ``records``: by kind name,
        the records in a followed status, as a tick read them (None: read them here);
        ``folded``: attempts that were live in ticks this pass stands for, besides the last;
        ``states``: Ray's job list as the tick read it (None: no export jobs are looked for);
        ``listed_at``: ``clock()`` as the tick began reading it (None: now)."""
        self.passes += 1
        self._stalled = False  # a hung store or Ray: one timeout per pass, not one per attempt
        if records is None:
            records = {kind.name: store.snapshots(kind.policy.followed) for kind, store in self.sources}
        live = self._live(records)
        # A new attempt is due at once; after each try, every_ticks later. Those due longest ago go
        # first, so under the cap every live log gets its turn. A failed try counts as a turn: a
        # log that cannot be copied is tried again at its next one and never holds the others back.
        self._due_at = {attempt: self._due_at.get(attempt) or (self.passes, next(self._turns)) for attempt in live}
        due = sorted((when, attempt) for attempt, when in self._due_at.items() if when[0] <= self.passes)
        for _, attempt in due[:self.copies_per_tick]:
            if self._stalled:
                break
            self._copy(attempt, final=False)
            self._due_at[attempt] = (self.passes + self.every_ticks, next(self._turns))
        self._watched |= folded
        if self._sweep_due and not self._stalled:
            self._leftovers += self._find_leftovers(live)
        # At most copies_per_tick of them a pass: each is three Ray calls and a storage write.
        self._watched.update(self._leftovers[:self.copies_per_tick])
        del self._leftovers[:self.copies_per_tick]
        for attempt in self._watched - live:
            if not self._stalled and self._copy(attempt, final=True):
                self._watched.discard(attempt)
                self._forget_at[attempt.job_id] = (self.clock() + self.forget_after_s, FORGET_TRIES)
        self._watched |= live
        now = self.clock()
        for job_id in [job_id for job_id, (due, _) in self._forget_at.items() if due <= now]:
            if not self._stalled:
                self._forget(job_id, now)
        if states is not None and self.exports is not None and not self._stalled:
            self._settle_exports(states)
            if not self._stalled:
                self._remove_stray_marks(states, self.clock() if listed_at is None else listed_at)

    def _find_leftovers(self, live: set[Attempt]) -> list[Attempt]:
        """Finished attempt jobs in Ray's list that no attempt watched, live, waiting or being
        forgotten owns, of records this database holds (one Ray call, one query per kind):
        - the job an ended record ended on gets its final copy, under the record's last attempt
          (a worker-group restart moves a run to a new attempt on the same job);
        - a job of an earlier attempt of a sweep (re-queued when its driver failed; the sweep may
          be queued or running again, or have ended since) gets its final copy under its own
          attempt: the process that saw it end may have stopped before copying it. (A queued
          attempt's own job, submitted by a process that lost the answer, is left: the next
          submit of the attempt must find it, so that the attempt never runs twice);
        - an earlier job of an ended run had its final copy when its attempt ended (runs are
          re-queued only when their job is lost), and is only forgotten.
        On a Ray or database error, none, and the next pass tries again, ``SWEEP_TRIES`` passes
        in all."""
        try:
            states = job_states(self.jobs)
            if states is None:  # a Jobs client that cannot list: nothing to sweep
                self._sweep_due = False
                return []
            known = {a.job_id for a in self._watched | live | set(self._leftovers)} | set(self._forget_at)
            finished = [job_id for job_id, state in states.items()
                        if state in FINISHED_JOB_STATES and job_id not in known]
            ended, owners = {}, {}  # by kind name: {job id: (record id, attempt)}, and the records' owners
            for kind, store in self.sources:
                ended[kind.name] = {job_id: parsed for job_id in finished
                                    if (parsed := parse_attempt_job_id(store.stored.job_prefix, job_id)) is not None}
                owners[kind.name] = store.job_owners(record_id for record_id, _ in ended[kind.name].values())
        except Exception as exc:
            self._sweep_tries += 1
            self._sweep_due = self._sweep_tries < SWEEP_TRIES
            self._stalled = isinstance(exc, OSError)
            log.warning("could not look for finished jobs left in Ray's list (%s): %s",
                        "will retry" if self._sweep_due else "gave up", exc)
            return []
        self._sweep_due = False
        found, forget = [], []
        for kind, _ in self.sources:
            terminal = {status.value for status in kind.status if status.is_terminal}  # as the database stores them
            for job_id, (record_id, job_attempt) in sorted(ended[kind.name].items()):
                if record_id not in owners[kind.name]:
                    continue  # not a record of this database: another service's, on a shared cluster
                project, status, attempt, ray_job_id = owners[kind.name][record_id]
                if job_id == ray_job_id:
                    if status in terminal:  # else followed: the dispatcher still reads this job
                        found.append(Attempt(record_id, attempt, job_id, project, kind.name))
                elif kind.job_per_attempt and job_attempt < attempt:  # not a queued attempt's own
                    found.append(Attempt(record_id, job_attempt, job_id, project, kind.name))
                elif status in terminal:  # else queued or followed: left as it was
                    forget.append(job_id)
        now = self.clock()
        for job_id in forget:
            self._forget_at[job_id] = (now + self.forget_after_s, FORGET_TRIES)
        if found or forget:
            log.info("finished jobs left in Ray's list: %d to store the final log of, then forget; "
                     "%d to forget", len(found), len(forget))
        return found

    def _settle_exports(self, states: JobStates) -> None:
        """Store the outcomes of up to ``copies_per_tick`` finished export jobs of ``states``, each
        to be forgotten by Ray ``forget_after_s`` later; another service's are left in Ray's
        list, and not looked at again while it lists them. A job whose outcome
        could not be stored waits ``every_ticks`` passes for its next try, so that one that keeps
        failing holds none of the others back."""
        self._settled &= states.keys()  # a job Ray no longer lists is done with
        self._export_retry = {job_id: at for job_id, at in self._export_retry.items() if job_id in states}
        due = sorted(job_id for job_id, state in states.items()
                     if state in FINISHED_JOB_STATES and job_id not in self._settled
                     and job_id not in self._forget_at and self._export_retry.get(job_id, 0) <= self.passes
                     and parse_export_job_id(job_id) is not None)[:self.copies_per_tick]
        if not due:
            return
        try:
            projects = self.exports.owners_of(due)
        except Exception as exc:  # the database: the next pass tries again
            self._stalled = isinstance(exc, OSError)
            log.warning("could not read the runs of finished export jobs; will retry: %s", exc)
            return
        for job_id in due:
            if self._stalled:
                break
            try:
                forget = self.exports.settle(job_id, states[job_id], projects)
            except Exception as exc:
                self._stalled = isinstance(exc, OSError)  # a timeout: no more storage or Ray calls this pass
                self._export_retry[job_id] = self.passes + self.every_ticks
                log.warning("could not store the outcome of the finished export job %s; will retry: %s", job_id, exc)
                continue
            self._settled.add(job_id)
            if forget:
                self._forget_at[job_id] = (self.clock() + self.forget_after_s, FORGET_TRIES)

    def _remove_stray_marks(self, states: JobStates, listed_at: float) -> None:
        """List the export jobs' marks (one storage call) and remove those whose job Ray listed
        neither now (``states``, read from ``listed_at`` on) nor at the last look: Ray never got
        the job (the service stopped between marking and submitting it, or a submit whose answer
        was lost never reached Ray), or forgot it while the mark's removal failed. Each mark is
        only a file, but nothing else would ever remove these.

        A look is due once Ray's list was read ``stray_marks_after_s`` after the last look's
        listing ended: every mark it found was made by then, and its job submitted
        ``stray_marks_after_s`` later at most (the dispatcher makes that longer than a request
        takes from its mark to its submit), so a job whose mark the last look found is in any
        list read since, until Ray forgets it and the mark goes. A failed listing or removal
        waits for the next look; the marks of the last good look are kept meanwhile."""
        if self._marks_seen_at is not None and listed_at < self._marks_seen_at + self.stray_marks_after_s:
            return
        try:
            marked = self.exports.marked()
        except Exception as exc:
            self._stalled = isinstance(exc, OSError)
            self._marks_seen_at = self.clock()  # later than the kept marks were seen: only safer
            log.warning("could not list the export jobs' marks; will look again later: %s", exc)
            return
        unlisted = marked - states.keys()
        stray = unlisted & self._unlisted_marks
        # One whose removal fails stays unlisted, and is tried again at the next look
        self._unlisted_marks, self._marks_seen_at = unlisted, self.clock()
        removed = 0
        for job_id in sorted(stray):
            if self._stalled:
                break
            try:
                self.exports.unmark(job_id)
                removed += 1
            except Exception as exc:
                self._stalled = isinstance(exc, OSError)
                log.warning("could not remove the stray mark of the export job %s: %s", job_id, exc)
        if removed:
            log.info("removed the marks of %d export jobs that Ray never had or has forgotten", removed)

    def _live(self, records: Records) -> set[Attempt]:
        return {Attempt(record.id, record.attempt, record.ray_job_id, record.project, kind.name)
                for kind, _ in self.sources for record in records.get(kind.name, ())
                if kind.owns(record) and record.ray_job_id}

    def _forget(self, job_id: str, now: float) -> None:
        """Have Ray forget a finished job (a 404 is no error). A failed delete is tried again
        ``forget_after_s`` later, up to ``FORGET_TRIES`` times in all, then left in Ray's list:
        Ray answers a job it will not delete with a 500, which is also how it answers a passing
        fault, and one such job must not hold back the others' deletes pass after pass."""
        _, tries = self._forget_at.pop(job_id)
        try:
            self.jobs.delete(job_id)
            # Should Ray write it again (see above), a later list shows it finished: settled anew
            self._settled.discard(job_id)
        except Exception as exc:
            self._stalled = isinstance(exc, OSError)
            if tries > 1:
                self._forget_at[job_id] = (now + self.forget_after_s, tries - 1)
            log.warning("could not have Ray forget the finished job %s (%s): %s", job_id,
                        "will retry" if tries > 1 else "left in Ray's job list", exc)
            return
        if self.exports is not None and parse_export_job_id(job_id) is not None:
            try:
                self.exports.unmark(job_id)  # its mark as this service's job goes
            except Exception as exc:  # a mark left behind is only a file
                self._stalled = isinstance(exc, OSError)
                log.warning("could not remove the mark of the forgotten export job %s: %s", job_id, exc)

    def _copy(self, attempt: Attempt, *, final: bool) -> bool:
        """Copy one attempt's log; True once there is nothing left to wait for (final copy made,
        or Ray has no such job). A Ray or storage error is logged and tried again later (a final
        copy on the next pass, a live one at its next turn)."""
        try:
            if final:
                return archive_final_log(self.jobs, self.store, attempt)
            text = self.jobs.job_logs(attempt.job_id)
            if text is not None:
                self.store.save(attempt.record_id, attempt.attempt, text, project=attempt.project, kind=attempt.kind)
            return True
        except Exception as exc:
            log.warning("could not copy the log of %s; will retry", attempt.job_id, exc_info=True)
            self._stalled = isinstance(exc, OSError)  # StorageTimeout and RayUnavailable both are
            return False
