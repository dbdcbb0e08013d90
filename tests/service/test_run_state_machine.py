"""The state machine accepts exactly the transitions of the design and refuses the rest."""

from __future__ import annotations

import itertools

import pytest

from api.views import RunStatus
from service.state_machine import IllegalTransition, decide

S = RunStatus

# Written out from the design, independently of service.state_machine.TRANSITIONS.
LEGAL = {
    (S.QUEUED, S.STARTING), (S.STARTING, S.RUNNING), (S.RUNNING, S.COMPLETED),
    (S.RUNNING, S.RESTARTING), (S.RESTARTING, S.RUNNING),
    (S.STARTING, S.QUEUED), (S.RUNNING, S.QUEUED), (S.RESTARTING, S.QUEUED),
    (S.QUEUED, S.CANCELING), (S.STARTING, S.CANCELING), (S.RUNNING, S.CANCELING), (S.RESTARTING, S.CANCELING),
    (S.CANCELING, S.CANCELED),
    (S.QUEUED, S.FAILED), (S.STARTING, S.FAILED), (S.RUNNING, S.FAILED), (S.RESTARTING, S.FAILED),
    (S.CANCELING, S.FAILED),
    (S.FAILED, S.QUEUED), (S.CANCELED, S.QUEUED),
    # a sweep trial that its scheduler ended early, and resuming it
    (S.STARTING, S.STOPPED), (S.RUNNING, S.STOPPED), (S.RESTARTING, S.STOPPED), (S.STOPPED, S.QUEUED),
    # continuing a completed run to a longer max_duration
    (S.COMPLETED, S.QUEUED),
}
# Repeats that workers and users may retry without harm: accepted, but change nothing.
IDEMPOTENT = {(S.RUNNING, S.RUNNING), (S.RESTARTING, S.RESTARTING), (S.CANCELING, S.CANCELING)}
GRID = list(itertools.product(RunStatus, RunStatus))


@pytest.mark.parametrize(("current", "target"), sorted(LEGAL, key=str), ids=lambda s: s.value)
def test_legal_transition_is_accepted_as_a_change(current, target):
    assert decide("r1", current, target) is True


@pytest.mark.parametrize(("current", "target"), sorted(IDEMPOTENT, key=str), ids=lambda s: s.value)
def test_repeating_a_live_status_is_an_accepted_no_op(current, target):
    assert decide("r1", current, target) is False


@pytest.mark.parametrize(("current", "target"), [pair for pair in GRID if pair not in LEGAL | IDEMPOTENT],
                         ids=lambda s: s.value)
def test_every_other_transition_is_refused_with_a_stable_message(current, target):
    with pytest.raises(IllegalTransition) as info:
        decide("r1", current, target)
    assert info.value.current is current and info.value.target is target
    assert info.value.detail.startswith(f"run r1 is {current.value}; cannot ")


def test_cancel_of_a_completed_run_says_so_in_few_words():
    with pytest.raises(IllegalTransition, match=r"^run abc is COMPLETED; cannot cancel$"):
        decide("abc", S.COMPLETED, S.CANCELING)


def test_terminal_statuses_never_move_except_to_resume_or_continue():
    for terminal in (S.COMPLETED, S.FAILED, S.CANCELED):
        reachable = {target for target in RunStatus if (terminal, target) in LEGAL}
        assert reachable <= {S.QUEUED}
