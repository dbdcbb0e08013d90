"""The pure half of following a Ray job: which fix each (status, job state, restarts left) calls for."""

from __future__ import annotations

import pytest

from api.views import RunStatus, SweepStatus
from service.job_kinds import RUN_JOBS, sweep_driver_jobs
from service.lifecycle import Verdict, decide
from service.settings import Settings
from service.state_machine import RUN_TRANSITIONS, SWEEP_TRANSITIONS, IllegalTransition

SWEEP_JOBS = sweep_driver_jobs(Settings(sweep_driver_restarts=2))


@pytest.mark.parametrize(("status", "job_state", "expected"), [
    (RunStatus.STARTING, "PENDING", None),
    (RunStatus.RUNNING, "RUNNING", None),
    (RunStatus.RESTARTING, None, Verdict.REQUEUE),  # a lost job is always retried
    (RunStatus.RUNNING, "FAILED", Verdict.FAIL),
    (RunStatus.RUNNING, "STOPPED", Verdict.FAIL),
    (RunStatus.RUNNING, "SUCCEEDED", Verdict.FAIL),
    (RunStatus.CANCELING, "RUNNING", None),  # Ray is still stopping it
    (RunStatus.CANCELING, "STOPPED", Verdict.CANCEL_DONE),
    (RunStatus.CANCELING, None, Verdict.CANCEL_DONE),
    (RunStatus.QUEUED, None, None),  # not submitted yet: nothing to follow
    (RunStatus.COMPLETED, "SUCCEEDED", None),
])
def test_a_run_s_fix_follows_from_its_status_and_its_job_s_state(status, job_state, expected):
    fix = decide(status, job_state, RUN_JOBS.restarts_left(7), RUN_JOBS.policy)
    assert (fix.verdict if fix else None) is expected
    if fix is not None:
        assert fix.job_state == job_state


@pytest.mark.parametrize(("job_state", "restarts_left", "expected"), [
    ("RUNNING", 0, None),
    (None, 1, Verdict.REQUEUE),
    ("FAILED", 1, Verdict.REQUEUE),
    ("STOPPED", 2, Verdict.REQUEUE),
    (None, 0, Verdict.GIVE_UP),
    ("FAILED", 0, Verdict.GIVE_UP),
    ("SUCCEEDED", 2, Verdict.FAIL),  # the driver ended without saying how: no retry
])
def test_a_dead_sweep_driver_is_retried_while_restarts_are_left(job_state, restarts_left, expected):
    fix = decide(SweepStatus.RUNNING, job_state, restarts_left, SWEEP_JOBS.policy)
    assert (fix.verdict if fix else None) is expected


def test_a_canceling_sweep_finishes_its_cancel_whatever_its_driver_did():
    for job_state in (None, "FAILED", "STOPPED", "SUCCEEDED"):
        assert decide(SweepStatus.CANCELING, job_state, 0, SWEEP_JOBS.policy).verdict is Verdict.CANCEL_DONE


def test_restarts_left_count_down_from_the_limit_and_runs_have_no_limit():
    assert [SWEEP_JOBS.restarts_left(attempt) for attempt in (1, 2, 3)] == [2, 1, 0]
    assert RUN_JOBS.restarts_left(1000) is None


def test_the_compare_and_set_names_what_changed():
    with pytest.raises(IllegalTransition, match=r"^run r1 is RUNNING; it changed before it could be updated$"):
        RUN_TRANSITIONS.require_snapshot("r1", RunStatus.RUNNING, RunStatus.QUEUED, stored_attempt=1,
                                         only_from=[RunStatus.STARTING], attempt=1)
    with pytest.raises(IllegalTransition, match=r"^sweep s1 is on attempt 3, not 2$"):
        SWEEP_TRANSITIONS.require_snapshot("s1", SweepStatus.RUNNING, SweepStatus.QUEUED, stored_attempt=3,
                                           only_from=None, attempt=2)
    SWEEP_TRANSITIONS.require_snapshot("s1", SweepStatus.RUNNING, SweepStatus.QUEUED, stored_attempt=3,
                                       only_from=[SweepStatus.RUNNING], attempt=3)


def test_a_refused_sweep_change_says_what_was_asked():
    with pytest.raises(IllegalTransition, match=r"^sweep s1 is COMPLETED; cannot make it RUNNING$"):
        SWEEP_TRANSITIONS.check("s1", SweepStatus.COMPLETED, SweepStatus.RUNNING)
    assert SWEEP_TRANSITIONS.check("s1", SweepStatus.RUNNING, SweepStatus.RUNNING) is False
