"""One job follower for runs and sweep drivers: submit each attempt's Ray job, then follow it.

Following is decide, then apply, as Ray Train's controller does with its worker group: ask
Ray for the job's state (while canceling, ask it to stop the job first), let the pure
``service.lifecycle.decide`` pick the fix, and apply that fix as one compare-and-set transition
whose event message says why. Only an answer from Ray leads to a fix: when Ray cannot be asked,
the record is left as it is and looked at again on the next tick.

Submitting is careful about answers that were lost (docs/outages-service.md). A submit Ray
may have received without the service seeing the answer (a timeout, a reset, a 5xx) leaves
the attempt STARTING and remembered in ``pending``; the next tick asks Ray for the job by its
deterministic id: if Ray has it, the attempt proceeds; if Ray answers "no such job", the same
job is submitted again (Ray refuses a second job with one id, so this never runs it twice), up
to ``settings.ray_submit_retries`` times before the record fails with the last reason. Only a
definite refusal (a 4xx) fails it at once. A re-queued attempt is submitted only once its
previous attempt's job is stopped or gone, so two attempts of one record never train at once.
A tick stops asking Ray as soon as Ray cannot be asked, so a hung Ray costs one timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from service.attempt_store import AttemptStore
from service.job_kinds import JobKind
from service.lifecycle import Fix, IllegalTransition, Verdict, decide
from service.ray_client import (LIVE_JOB_STATES, JobsClient, RayRefused, failure_from_logs, job_ended_at,
                                job_states, stop_and_check)
from service.settings import Settings
from service.tokens import new_token

log = logging.getLogger(__name__)

# Records started in one transaction (``AttemptStore.begin_attempts``) before their jobs are sent:
# a burst of submits reaches Ray in batches, not after the whole queue is written.
SUBMIT_BATCH = 100

# A run's failure (``RunView.failure``) when what ran it was lost, not its code.
MACHINE = "machine"

# How Ray's answer reads in event messages: "Ray job X failed", "driver job X was stopped".
WHAT_HAPPENED = {None: "not found", "FAILED": "failed", "STOPPED": "was stopped",
                 "SUCCEEDED": "succeeded without a result"}


@dataclass(frozen=True)
class PendingSubmit:
    """A submit whose answer was lost: what to send again, and how often it was sent."""

    job_id: str
    attempt: int
    entrypoint: str
    env: dict[str, str]
    sends: int
    last_error: str


class JobFollower:
    """Submits and follows the jobs of one ``JobKind``; ``tick`` and ``reconcile`` are its loops."""

    def __init__(self, kind: JobKind, store: AttemptStore, jobs: JobsClient, settings: Settings,
                 admit: Callable[[list[Any], list[Any]], list[Any]] | None = None):
        self.kind = kind
        self.store = store
        self.jobs = jobs
        self.settings = settings
        # Picks which QUEUED records to submit (the run queue), given every record in a followed
        # status as this tick read them; None: all.
        self.admit = admit
        # Submits whose answer was lost, by record id. In memory: after a service restart the
        # follower's "no such job" path re-queues such an attempt instead, which is also safe.
        self.pending: dict[str, PendingSubmit] = {}
        self.ray_down = False  # set when Ray could not be asked this tick: ask no more until the next

    def owned(self, statuses: Iterable[Any]) -> list[Any]:
        """This kind's records in one of ``statuses`` whose jobs it submits and follows, oldest first."""
        return [record for record in self.store.snapshots(statuses) if self.kind.owns(record)]

    def tick(self, job_states: Callable[[], dict[str, str] | None] | None = None) -> list[Any]:
        """One pass: submit every QUEUED record, then follow every other active one.
        ``job_states``: where to read every job's state (the dispatcher shares one list per
        tick between its followers); default: this follower's own ``job_states_now``.
        Returns the followed records as read at the start of the pass (the dispatcher's log
        archiver and wall-clock check reuse them: one read of the active runs per tick)."""
        self.ray_down = False
        everyone = self.store.snapshots(self.kind.policy.followed)  # a sweep's trials too: they hold resources
        active = [record for record in everyone if self.kind.owns(record)]
        self._forget_settled(active)
        unsettled = set(self.pending)  # asked about or sent again this tick: not in the job list yet
        for record in active:  # submits whose answer was lost, first: they are the oldest
            if record.id in self.pending and not self.ray_down:
                self._guarded(self.resolve_pending, record)
        queued = self.owned([self.kind.status.QUEUED])
        admitted = self.admit(queued, everyone) if self.admit is not None else queued
        # The first goes alone: when Ray cannot take it, every other record stays QUEUED.
        for batch in [admitted[:1]] + [admitted[i:i + SUBMIT_BATCH] for i in range(1, len(admitted), SUBMIT_BATCH)]:
            if not self.ray_down:
                self.submit(batch)
        # A job submitted a moment ago is looked at from the next tick on: a submission whose
        # answer was lost may not be visible in Ray yet, and must not read as "job gone".
        just_submitted = {record.id for record in admitted} | unsettled | set(self.pending)
        followed = [r for r in active if r.id not in just_submitted]
        if not followed or self.ray_down:
            return active
        try:
            states = (job_states or self.job_states_now)()
        except Exception as exc:  # Ray cannot be asked: "unknown" never reads as "gone"
            log.warning("could not list Ray's jobs; following again next tick: %s", exc)
            self.ray_down = isinstance(exc, OSError)
            return active
        for record in followed:
            if not self.ray_down:
                self._guarded(self.follow, record, states=states)
        return active

    def job_states_now(self) -> dict[str, str] | None:
        """Every job's state in one call, if the Jobs client can list them; None: ask per job."""
        return job_states(self.jobs)

    def reconcile(self) -> list[str]:
        """Follow every active record once, before anything is submitted (at startup); return
        the fixes made. A record whose job is PENDING or RUNNING is left alone: its worker
        still holds the token stored in the database and keeps reporting."""
        fixes = []
        self.ray_down = False
        for record in self.owned(self.kind.policy.followed):
            if self.ray_down:  # a hung Ray costs the startup one timeout; the ticks catch up later
                break
            fix = self._guarded(self.follow, record, context="reconciler")
            if fix is not None:
                fixes.append(f"{self.kind.name} {record.id}: {fix}")
        return fixes

    def _guarded(self, action: Callable[..., Any], record: Any, **kwargs: Any) -> Any:
        # Each record is handled on its own: one record's problem is logged and never stops the loop.
        # Returns what ``action`` returned, or None when it raised.
        try:
            return action(record, **kwargs)
        except IllegalTransition as exc:  # a user, worker or driver changed the record first; theirs stands
            log.debug("%s %s: %s", self.kind.name, record.id, exc.detail)
        except OSError as exc:  # Ray (or the database) cannot be asked: skip Ray for the rest of this tick
            self.ray_down = True
            log.warning("%s %s: Ray could not be asked; looking again next tick: %s", self.kind.name, record.id, exc)
        except Exception:
            log.exception("%s %s (%s) could not be handled; will retry", self.kind.name, record.id,
                          record.status.value)
        return None

    def submit(self, queued: list[Any]) -> None:
        """QUEUED → STARTING with a fresh token for each of ``queued`` (in one transaction), and
        submit each attempt's job; a re-queued record waits (stays QUEUED) until its previous
        attempt's job is stopped or gone. If Ray stops answering partway, the rest of the batch's
        jobs wait in ``pending`` unsent (``sends=0``), and the next tick sends them."""
        ready = [record for record in queued if not self.ray_down and self._guarded(self._previous_job_gone, record)]
        if not ready or self.ray_down:  # Ray failed while being asked about a previous job: all stay QUEUED
            return
        tokens = {record.id: new_token() for record in ready}
        for record in self._begin(ready, tokens):
            self._guarded(self._send_first, record, token=tokens[record.id])

    def _begin(self, ready: list[Any], tokens: dict[str, str]) -> list[Any]:
        """``store.begin_attempts`` for ``ready``; if the batch fails, each record on its own, so
        one record's problem holds back only that record (it stays QUEUED, tried again next tick)."""
        noun = self.kind.attempt_noun

        def message(attempt: int) -> str:
            return f"submitting {noun} {attempt} to Ray"

        try:
            return self.store.begin_attempts(ready, tokens, message)
        except Exception:
            log.warning("could not start %d %s(s) at once; starting them one by one", len(ready), self.kind.name,
                        exc_info=True)
        started = [self._guarded(lambda record: self.store.begin_attempts([record], tokens, message), record)
                   for record in ready]
        return [record for one in started if one for record in one]

    def _send_first(self, record: Any, *, token: str) -> None:
        entrypoint, env = self.kind.entrypoint(self.settings, record.id), self.kind.job_env(self.settings, record, token)
        if self.ray_down:
            self.pending[record.id] = PendingSubmit(record.ray_job_id, record.attempt, entrypoint, env, sends=0,
                                                    last_error="not sent: Ray stopped answering during this tick")
        else:
            self._send(record, entrypoint, env, sends=1)

    def _send(self, record: Any, entrypoint: str, env: dict[str, str], *, sends: int) -> None:
        """Submit ``record``'s current job; a lost answer leaves it in ``pending``, a refusal fails it."""
        job_id = record.ray_job_id
        try:
            self.jobs.submit(job_id, entrypoint, env)
        except RayRefused as exc:
            self._fail(record, f"Ray refused job {job_id}: {exc}")
            return
        except OSError as exc:  # unreachable, timed out, reset or 5xx: Ray may or may not have the job
            self.pending[record.id] = PendingSubmit(job_id, record.attempt, entrypoint, env, sends, str(exc))
            self.ray_down = True
            log.warning("submit of %s got no clear answer (%s); will ask Ray for it next tick", job_id, exc)
            return
        except Exception as exc:  # anything else a Jobs client raises is Ray saying no
            self._fail(record, f"Ray refused job {job_id}: {exc}")
            return
        self.pending.pop(record.id, None)
        log.info("%s %s: submitted %s %s", self.kind.name, record.id, self.kind.job_noun, job_id)

    def resolve_pending(self, record: Any) -> None:
        """Ask Ray for the job of a submit whose answer was lost: proceed if Ray has it, send it
        again if Ray does not (while sends are left), else fail the record with the reason."""
        pending = self.pending[record.id]
        if pending.sends == 0:  # never sent: there is nothing to ask Ray about
            self._send(record, pending.entrypoint, pending.env, sends=1)
            return
        state = self.jobs.status(pending.job_id)  # raises while Ray cannot be asked: keep waiting
        if state is not None:
            del self.pending[record.id]
            log.info("%s %s: Ray has %s (%s) after all; proceeding", self.kind.name, record.id, pending.job_id, state)
        elif pending.sends > self.settings.ray_submit_retries:
            del self.pending[record.id]
            self._fail(record, f"Ray did not create job {pending.job_id} after {pending.sends} submit(s); "
                               f"last answer: {pending.last_error}", failure=MACHINE)
        else:
            self._send(record, pending.entrypoint, pending.env, sends=pending.sends + 1)

    def _fail(self, record: Any, error: str, failure: str | None = None) -> None:
        self.store.transition(record.id, self.kind.status.FAILED, error=error, failure=failure,
                              only_from=[self.kind.status.STARTING], attempt=record.attempt)
        log.warning("%s %s: %s", self.kind.name, record.id, error)

    def _forget_settled(self, active: list[Any]) -> None:
        # A pending submit matters only while its attempt is STARTING; a cancel or a report wins.
        starting = {r.id: r.attempt for r in active if r.status is self.kind.status.STARTING}
        for record_id, pending in list(self.pending.items()):
            if starting.get(record_id) != pending.attempt:
                del self.pending[record_id]

    def _previous_job_gone(self, record: Any) -> bool:
        """Whether the job of ``record``'s previous attempt is stopped or gone; asks Ray to stop
        it while it is still PENDING or RUNNING (a trial's job is its sweep driver's: not ours)."""
        previous = record.ray_job_id
        if previous is None or not previous.startswith(f"{self.kind.name}-{record.id}-"):
            return True
        state = stop_and_check(self.jobs, previous)
        if state in LIVE_JOB_STATES:
            log.info("%s %s: waiting for %s of the previous attempt to stop before submitting attempt %d",
                     self.kind.name, record.id, previous, record.attempt)
            return False
        return True

    def follow(self, record: Any, *, context: str = "dispatcher", states: dict[str, str] | None = None
               ) -> str | None:
        """Apply the fix that Ray's view of ``record``'s job calls for; return what it did, or None.

        Raises what the Jobs client raises when Ray cannot be asked (the record stays as it is),
        and ``IllegalTransition`` when the record changed since it was read (nothing is written).
        """
        policy = self.kind.policy
        if record.status not in policy.followed:
            return None
        job_id = record.ray_job_id
        if record.status is policy.canceling:
            state = stop_and_check(self.jobs, job_id)
        elif states is not None:  # one list_jobs per tick: a job missing from it is gone
            state = states.get(job_id) if job_id else None
        else:
            state = self.jobs.status(job_id) if job_id else None
        fix = decide(record.status, state, self.kind.restarts_left(record.attempt), policy)
        if fix is None:
            return None
        target, message, error, failure = self._explain(fix, record, context)
        # A job that ended without its worker saying when (it crashed, was stopped, or ended while
        # the service was down) ended when Ray saw it end, not when this tick learned of it.
        ended_at = None
        if fix.job_state is not None and fix.verdict is not Verdict.REQUEUE:  # the record ends
            ended_at = job_ended_at(self.jobs, job_id)
        # Compare-and-set on the snapshot we decided from: a report may have landed since.
        self.store.transition(record.id, target, message=message, error=error, only_from=[record.status],
                              attempt=record.attempt, failure=failure, job_lost=fix.job_state is None,
                              ended_at=ended_at)
        log.info("%s %s: %s", self.kind.name, record.id, message)
        return error or message

    def _explain(self, fix: Fix, record: Any, context: str) -> tuple[Any, str, str | None, str | None]:
        """The status, event message, error and failure (``MACHINE`` or None: not known) that
        carry out ``fix``. A job that FAILED without its worker's report is not known to be the
        machine's: its worker also fails its job when the report itself could not be delivered
        (the service was gone past its patience), whatever ended the training."""
        kind, job_id, state = self.kind, record.ray_job_id, fix.job_state
        what = kind.lost_at_startup if state is None and context == "reconciler" else WHAT_HAPPENED[state]
        job = f"{context}: {kind.job_noun} {job_id}"
        if fix.verdict is Verdict.CANCEL_DONE:
            return kind.status.CANCELED, f"{job} is {state or 'gone'}; cancel complete", None, None
        if fix.verdict is Verdict.REQUEUE:
            return kind.status.QUEUED, f"{job} {what}; re-queued as attempt {record.attempt + 1}", None, None
        if fix.verdict is Verdict.GIVE_UP:
            last = failure_from_logs(self.jobs, job_id) if state is not None else f"{kind.job_noun} {job_id} {what}"
            error = kind.give_up.format(attempt=record.attempt, limit=kind.restart_limit, last=last)
            return kind.status.FAILED, f"{job} {what}; giving up", error, MACHINE
        failure = None
        if state == "FAILED":
            error = record.error or failure_from_logs(self.jobs, job_id)
        elif state == "STOPPED":
            error = kind.stopped_outside
        else:  # SUCCEEDED, but the worker or driver never said how it ended: nothing it trained raised
            error, failure = kind.ended_without_result, MACHINE
        return kind.status.FAILED, f"{job} {what}", error, failure

