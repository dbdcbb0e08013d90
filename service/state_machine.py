"""The transition tables of runs and sweeps: the one place that says which status changes are legal.

Runs::

    QUEUED → STARTING → RUNNING → COMPLETED
                        RUNNING ⇄ RESTARTING
    STARTING | RUNNING | RESTARTING → QUEUED          (re-queue by the job follower: next attempt)
    QUEUED | STARTING | RUNNING | RESTARTING → CANCELING → CANCELED
    any non-terminal → FAILED
    FAILED | CANCELED → QUEUED                         (resume: next attempt)
    STARTING | RUNNING | RESTARTING → STOPPED          (a sweep trial ended early by its scheduler)
    STOPPED → QUEUED                                   (resume a stopped trial: next attempt)
    COMPLETED → QUEUED                                 (continue to a longer max_duration: next
                                                        attempt; only ``service.lineage`` asks)

Sweeps::

    QUEUED → STARTING → RUNNING → COMPLETED | FAILED
    STARTING → COMPLETED | FAILED                      (a driver that ends before reporting RUNNING)
    STARTING | RUNNING → QUEUED                        (the driver job died: next driver attempt)
    QUEUED | STARTING | RUNNING → CANCELING → CANCELED
    RUNNING → CANCELED                                 (an external driver: nothing to stop)

Reports that repeat the current status (a run's RUNNING, RESTARTING, CANCELING; a sweep's
RUNNING, CANCELING) change nothing and are accepted, because workers, drivers and users retry
requests whose answers they did not see. Everything else raises ``IllegalTransition`` (a 409).
"""

from __future__ import annotations

from api.views import TERMINAL_STATUSES, RunStatus, SweepStatus
from service.lifecycle import IllegalTransition, TransitionTable

__all__ = ["RUN_TRANSITIONS", "SWEEP_TRANSITIONS", "IllegalTransition", "decide", "is_terminal",
           "starts_new_attempt", "starts_new_job"]

RUN_TRANSITIONS: TransitionTable[RunStatus] = TransitionTable(
    noun="run",
    allowed={
        RunStatus.QUEUED: frozenset({RunStatus.STARTING, RunStatus.CANCELING, RunStatus.FAILED}),
        RunStatus.STARTING: frozenset({RunStatus.RUNNING, RunStatus.QUEUED, RunStatus.CANCELING, RunStatus.FAILED,
                                       RunStatus.STOPPED}),
        RunStatus.RUNNING: frozenset({RunStatus.COMPLETED, RunStatus.RESTARTING, RunStatus.QUEUED,
                                      RunStatus.CANCELING, RunStatus.FAILED, RunStatus.STOPPED}),
        RunStatus.RESTARTING: frozenset({RunStatus.RUNNING, RunStatus.QUEUED, RunStatus.CANCELING,
                                         RunStatus.FAILED, RunStatus.STOPPED}),
        RunStatus.CANCELING: frozenset({RunStatus.CANCELED, RunStatus.FAILED}),
        # Continue (POST /runs/{id}/continue) alone takes a COMPLETED run back to QUEUED: resume
        # and the sweep driver refuse COMPLETED runs before asking this table.
        RunStatus.COMPLETED: frozenset({RunStatus.QUEUED}),
        RunStatus.FAILED: frozenset({RunStatus.QUEUED}),
        RunStatus.CANCELED: frozenset({RunStatus.QUEUED}),
        RunStatus.STOPPED: frozenset({RunStatus.QUEUED}),
    },
    idempotent=frozenset({RunStatus.RUNNING, RunStatus.RESTARTING, RunStatus.CANCELING}),
    # How a refused change reads: "run abc is COMPLETED; cannot cancel".
    verbs={
        RunStatus.QUEUED: "re-queue",
        RunStatus.STARTING: "start",
        RunStatus.RUNNING: "mark it RUNNING",
        RunStatus.RESTARTING: "restart",
        RunStatus.COMPLETED: "complete",
        RunStatus.FAILED: "fail",
        RunStatus.CANCELING: "cancel",
        RunStatus.CANCELED: "mark it CANCELED",
        RunStatus.STOPPED: "stop it early",
    },
)

SWEEP_TRANSITIONS: TransitionTable[SweepStatus] = TransitionTable(
    noun="sweep",
    allowed={
        SweepStatus.QUEUED: frozenset({SweepStatus.STARTING, SweepStatus.CANCELING, SweepStatus.FAILED}),
        SweepStatus.STARTING: frozenset({SweepStatus.RUNNING, SweepStatus.COMPLETED, SweepStatus.FAILED,
                                         SweepStatus.QUEUED, SweepStatus.CANCELING}),
        SweepStatus.RUNNING: frozenset({SweepStatus.COMPLETED, SweepStatus.FAILED, SweepStatus.QUEUED,
                                        SweepStatus.CANCELING, SweepStatus.CANCELED}),
        SweepStatus.CANCELING: frozenset({SweepStatus.CANCELED, SweepStatus.FAILED}),
        SweepStatus.COMPLETED: frozenset(),
        SweepStatus.FAILED: frozenset(),
        SweepStatus.CANCELED: frozenset(),
    },
    idempotent=frozenset({SweepStatus.RUNNING, SweepStatus.CANCELING}),
)


def decide(run_id: str, current: RunStatus, target: RunStatus) -> bool:
    """True if the run must change to ``target``; False for an idempotent repeat; else raise."""
    return RUN_TRANSITIONS.check(run_id, current, target)


def starts_new_attempt(current: RunStatus, target: RunStatus) -> bool:
    """A new attempt begins when the run goes back to QUEUED (re-queue or resume: a new Ray job)
    or when Ray Train restarts its worker group (RESTARTING: the same job, new workers)."""
    return current is not target and target in (RunStatus.QUEUED, RunStatus.RESTARTING)


def starts_new_job(current: RunStatus, target: RunStatus) -> bool:
    """Going back to QUEUED means a new Ray job, whose worker gets a new token."""
    return target is RunStatus.QUEUED and current is not RunStatus.QUEUED


def is_terminal(status: RunStatus) -> bool:
    return status in TERMINAL_STATUSES
