"""The lifecycle mechanism that runs and sweep drivers share, as pure data and pure functions.

Two questions decide every status change of a run or a sweep, and both are answered here
without touching the database or Ray:

* ``TransitionTable.check``: may a record in status A move to status B? (Users, workers and
  drivers ask this through the repositories; a refusal is an ``IllegalTransition``, HTTP 409.)
* ``decide``: given the record's status, the state Ray reports for its job and how many
  restarts it has left, which ``Fix`` brings the database in line with Ray? (The job follower
  asks this every dispatcher tick and once at startup, then applies the answer.)

The tables and policies of each kind live in ``service.state_machine`` and
``service.job_kinds``; this module knows nothing about which kind it serves.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from service.ray_client import LIVE_JOB_STATES

Status = TypeVar("Status", bound=enum.Enum)


class IllegalTransition(Exception):
    """A status change a transition table refuses; ``detail`` is short and stable (HTTP 409)."""

    def __init__(self, record_id: str, current: enum.Enum, target: enum.Enum, reason: str | None = None):
        self.record_id = record_id
        self.current = current
        self.target = target
        self.detail = reason or f"{record_id} is {current.value}; cannot make it {target.value}"
        super().__init__(self.detail)


@dataclass(frozen=True)
class TransitionTable(Generic[Status]):
    """Which status changes a kind of record allows.

    ``allowed[a]`` is every status reachable from ``a``; repeating a status in ``idempotent``
    is accepted and changes nothing, because clients retry requests whose answers they did not
    see. ``verbs`` words a refused target in the error ("run abc is COMPLETED; cannot cancel");
    without one the error says "cannot make it <TARGET>".
    """

    noun: str
    allowed: Mapping[Status, frozenset[Status]]
    idempotent: frozenset[Status] = frozenset()
    verbs: Mapping[Status, str] = field(default_factory=dict)

    def is_allowed(self, current: Status, target: Status) -> bool:
        """Whether ``current → target`` is a legal change (idempotent repeats excluded)."""
        return target in self.allowed[current]

    def check(self, record_id: str, current: Status, target: Status) -> bool:
        """True if the record must change to ``target``; False for an idempotent repeat; else
        raise ``IllegalTransition``."""
        if current is target and target in self.idempotent:
            return False
        if not self.is_allowed(current, target):
            raise self.refusal(record_id, current, target)
        return True

    def require_snapshot(self, record_id: str, current: Status, target: Status, *, stored_attempt: int,
                         only_from: Iterable[Status] | None, attempt: int | None) -> None:
        """The compare-and-set of a loop that decided on an older snapshot: raise
        ``IllegalTransition`` if the record has left ``only_from`` or moved past ``attempt``."""
        if only_from is not None and current not in set(only_from):
            raise self.refusal(record_id, current, target,
                               f"{self.noun} {record_id} is {current.value}; it changed before it could be updated")
        if attempt is not None and stored_attempt != attempt:
            raise self.refusal(record_id, current, target,
                               f"{self.noun} {record_id} is on attempt {stored_attempt}, not {attempt}")

    def refusal(self, record_id: str, current: Status, target: Status, reason: str | None = None
                ) -> IllegalTransition:
        """The ``IllegalTransition`` for ``current → target``, with ``reason`` or the table's wording."""
        verb = self.verbs.get(target, f"make it {target.value}")
        return IllegalTransition(record_id, current, target,
                                 reason or f"{self.noun} {record_id} is {current.value}; cannot {verb}")


class Verdict(enum.Enum):
    """What the follower does about a job that Ray reports."""

    CANCEL_DONE = "the job stopped: finish the cancel"
    REQUEUE = "the job is gone or died: queue the next attempt"
    FAIL = "the job ended without the record ending: fail it"
    GIVE_UP = "the job died again with no restarts left: fail it"


@dataclass(frozen=True)
class Fix:
    verdict: Verdict
    job_state: str | None  # what Ray said: STOPPED, SUCCEEDED or FAILED, or None for "no such job"


@dataclass(frozen=True)
class FollowPolicy(Generic[Status]):
    """How a kind's records follow their Ray jobs.

    ``followed``: the statuses in which a record's job is compared with Ray; ``canceling``: the
    one in which the job is being stopped; ``retry_on``: the job outcomes (None: Ray has no such
    job) that queue the next attempt while restarts are left.
    """

    followed: frozenset[Status]
    canceling: Status
    retry_on: frozenset[str | None]


def decide(status: Status, job_state: str | None, restarts_left: int | None,
           policy: FollowPolicy[Status]) -> Fix | None:
    """The fix that Ray's ``job_state`` calls for, or None when the record is as it should be.

    ``restarts_left`` None means unlimited. Pure: the caller asked Ray (and, while canceling,
    asked it to stop the job first) and applies the answer.
    """
    if status not in policy.followed or job_state in LIVE_JOB_STATES:
        return None
    if status is policy.canceling:
        return Fix(Verdict.CANCEL_DONE, job_state)
    if job_state in policy.retry_on:
        may_retry = restarts_left is None or restarts_left > 0
        return Fix(Verdict.REQUEUE if may_retry else Verdict.GIVE_UP, job_state)
    return Fix(Verdict.FAIL, job_state)
