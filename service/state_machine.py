"""The one place that decides whether a run may change status.

    QUEUED → STARTING → RUNNING → COMPLETED
                        RUNNING ⇄ RESTARTING
    STARTING | RUNNING | RESTARTING → QUEUED          (re-queue by the reconciler: next attempt)
    QUEUED | STARTING | RUNNING | RESTARTING → CANCELING → CANCELED
    any non-terminal → FAILED
    FAILED | CANCELED → QUEUED                         (resume: next attempt)
    STARTING | RUNNING | RESTARTING → STOPPED          (a sweep trial ended early by its scheduler)
    STOPPED → QUEUED                                   (resume a stopped trial: next attempt)

Reports that repeat the current status (RUNNING, RESTARTING, CANCELING) change nothing and
are accepted, because workers and users retry requests whose answers they did not see.
Everything else raises ``IllegalTransition``, which the API turns into a 409.
"""

from __future__ import annotations

from api.views import TERMINAL_STATUSES, RunStatus

S = RunStatus

TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    S.QUEUED: frozenset({S.STARTING, S.CANCELING, S.FAILED}),
    S.STARTING: frozenset({S.RUNNING, S.QUEUED, S.CANCELING, S.FAILED, S.STOPPED}),
    S.RUNNING: frozenset({S.COMPLETED, S.RESTARTING, S.QUEUED, S.CANCELING, S.FAILED, S.STOPPED}),
    S.RESTARTING: frozenset({S.RUNNING, S.QUEUED, S.CANCELING, S.FAILED, S.STOPPED}),
    S.CANCELING: frozenset({S.CANCELED, S.FAILED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset({S.QUEUED}),
    S.CANCELED: frozenset({S.QUEUED}),
    S.STOPPED: frozenset({S.QUEUED}),
}

# Repeating these is an idempotent no-op: no event, no change.
IDEMPOTENT: frozenset[RunStatus] = frozenset({S.RUNNING, S.RESTARTING, S.CANCELING})

# How an attempted transition reads in an error message: "run abc is COMPLETED; cannot cancel".
_VERBS = {
    S.QUEUED: "re-queue",
    S.STARTING: "start",
    S.RUNNING: "mark it RUNNING",
    S.RESTARTING: "restart",
    S.COMPLETED: "complete",
    S.FAILED: "fail",
    S.CANCELING: "cancel",
    S.CANCELED: "mark it CANCELED",
    S.STOPPED: "stop it early",
}


class IllegalTransition(Exception):
    """A status change the state machine refuses; ``detail`` is short and stable (HTTP 409)."""

    def __init__(self, run_id: str, current: RunStatus, target: RunStatus, reason: str | None = None):
        self.run_id = run_id
        self.current = current
        self.target = target
        self.detail = reason or f"run {run_id} is {current.value}; cannot {_VERBS[target]}"
        super().__init__(self.detail)


def is_allowed(current: RunStatus, target: RunStatus) -> bool:
    """Whether ``current → target`` is a legal change (idempotent repeats excluded)."""
    return target in TRANSITIONS[current]


def decide(run_id: str, current: RunStatus, target: RunStatus) -> bool:
    """True if the run must change to ``target``; False for an idempotent repeat; else raise."""
    if current is target and target in IDEMPOTENT:
        return False
    if not is_allowed(current, target):
        raise IllegalTransition(run_id, current, target)
    return True


def starts_new_attempt(current: RunStatus, target: RunStatus) -> bool:
    """A new attempt begins when the run goes back to QUEUED (re-queue or resume: a new Ray job)
    or when Ray Train restarts its worker group (RESTARTING: the same job, new workers)."""
    return current is not target and target in (S.QUEUED, S.RESTARTING)


def starts_new_job(current: RunStatus, target: RunStatus) -> bool:
    """Going back to QUEUED means a new Ray job, whose worker gets a new token."""
    return target is S.QUEUED and current is not S.QUEUED


def is_terminal(status: RunStatus) -> bool:
    return status in TERMINAL_STATUSES
