"""Sweep storage on SQLite and PostgreSQL: lifecycle, trial registration, trial ends, extrema."""

from __future__ import annotations

import copy
import math
import threading
from datetime import datetime, timezone

import pytest
from sqlalchemy.exc import IntegrityError

from api.sweeps import SweepSpec
from api.views import ReportedMetric, RunStatus, SweepStatus
from service.db.models import Run, utcnow
from service.state_machine import IllegalTransition
from service.sweep_repository import TRIAL_OUTLIVED_SWEEP, SweepNotFound, SweepRepository, TrialNotFound

S, SS = RunStatus, SweepStatus


@pytest.fixture
def sweeps(repo) -> SweepRepository:
    return SweepRepository(repo)


@pytest.fixture
def sweep_spec(example_body) -> SweepSpec:
    return SweepSpec.model_validate({
        "name": "digits-sweep", "base": example_body,
        "search": {"algorithms": {"sets": [[], ["channels_last"], ["ema", "swa"]]}}})


@pytest.fixture
def trial_spec(example_spec):
    return example_spec.model_copy(update={"name": "trial"})


def _running_sweep(sweeps, sweep_spec, token="driver-1"):
    sweep = sweeps.create_sweep(sweep_spec)
    sweeps.begin_attempt(sweep.id, token=token)
    return sweeps.transition(sweep.id, SS.RUNNING, message="Tune started")


def _points(key, values):
    now = datetime(2026, 11, 29, tzinfo=timezone.utc)
    return [ReportedMetric(step=i, key=key, value=v, time=now) for i, v in enumerate(values)]


def test_a_created_sweep_is_queued_on_attempt_one_with_its_skipped_sets(sweeps, sweep_spec):
    sweep = sweeps.create_sweep(sweep_spec)
    assert (sweep.status, sweep.attempt, sweep.driver, sweep.ray_job_id) == (SS.QUEUED, 1, "service", None)
    view = sweeps.sweep_view(sweep.id)
    assert [s.algorithms for s in view.skipped] == [["ema", "swa"]]
    assert view.spec == sweep_spec.model_dump(mode="json") and view.trials == []
    assert not sweeps.check_token(sweep.id, "anything")


def test_an_external_sweep_is_running_at_once_and_accepts_only_its_token(sweeps, sweep_spec):
    sweep = sweeps.create_sweep(sweep_spec, driver="external", token="secret")
    assert sweep.status is SS.RUNNING and sweeps.sweep_view(sweep.id).started_at is not None
    assert sweeps.check_token(sweep.id, "secret") and not sweeps.check_token(sweep.id, "secret2")
    assert not sweeps.check_token("nope", "secret")


def test_sweeps_are_listed_newest_first_and_unknown_ones_are_not_found(sweeps, sweep_spec):
    ids = [sweeps.create_sweep(sweep_spec).id for _ in range(3)]
    page, cursor = sweeps.list_sweep_views(limit=2)
    assert [v.id for v in page] == ids[::-1][:2] and cursor is not None
    assert [s.id for s in sweeps.sweeps_with_status([SS.QUEUED])] == ids
    for read in (sweeps.get_sweep, sweeps.sweep_view, sweeps.cancel):
        with pytest.raises(SweepNotFound):
            read("nope\x00")


def test_each_attempt_has_its_job_id_and_token_and_a_requeue_revokes_the_old_one(sweeps, sweep_spec):
    sweep = sweeps.create_sweep(sweep_spec)
    started = sweeps.begin_attempt(sweep.id, token="t1")
    assert (started.status, started.ray_job_id) == (SS.STARTING, f"sweep-{sweep.id}-attempt-1")
    assert sweeps.check_token(sweep.id, "t1")
    requeued = sweeps.transition(sweep.id, SS.QUEUED, message="driver lost")
    assert (requeued.status, requeued.attempt, requeued.message) == (SS.QUEUED, 2, "driver lost")
    assert not sweeps.check_token(sweep.id, "t1")
    second = sweeps.begin_attempt(sweep.id, token="t2")
    assert second.ray_job_id == f"sweep-{sweep.id}-attempt-2" and sweeps.check_token(sweep.id, "t2")


def test_sweep_transitions_are_checked_and_compare_and_set(sweeps, sweep_spec):
    sweep = _running_sweep(sweeps, sweep_spec)
    with pytest.raises(IllegalTransition):
        sweeps.transition(sweep.id, SS.STARTING)
    with pytest.raises(IllegalTransition):
        sweeps.transition(sweep.id, SS.FAILED, only_from=[SS.STARTING])
    with pytest.raises(IllegalTransition):
        sweeps.transition(sweep.id, SS.FAILED, attempt=2)
    assert sweeps.transition(sweep.id, SS.RUNNING).status is SS.RUNNING  # a repeat is a no-op
    done = sweeps.transition(sweep.id, SS.COMPLETED)
    assert done.status is SS.COMPLETED and sweeps.sweep_view(sweep.id).finished_at is not None
    with pytest.raises(IllegalTransition):
        sweeps.cancel(sweep.id)


def test_a_trial_is_created_starting_in_one_go_and_restarted_as_a_new_attempt(repo, sweeps, sweep_spec, trial_spec):
    sweep = _running_sweep(sweeps, sweep_spec)
    run = sweeps.register_trial(sweep.id, trial_id="t_1", spec=trial_spec, params={"optimizer.lr": 0.1}, token="r1")
    assert (run.status, run.attempt, run.sweep_id, run.trial_id, run.trial_params) == (
        S.STARTING, 1, sweep.id, "t_1", {"optimizer.lr": 0.1})
    assert run.ray_job_id == f"sweep-{sweep.id}-attempt-1" and run.driven_by_sweep and repo.check_token(run.id, "r1")
    repo.transition(run.id, S.RUNNING)
    again = sweeps.register_trial(sweep.id, trial_id="t_1", spec=trial_spec, params={}, token="r2")
    assert (again.id, again.status, again.attempt) == (run.id, S.STARTING, 2)
    assert repo.check_token(run.id, "r2") and not repo.check_token(run.id, "r1")
    assert [(e.to_status, e.attempt) for e in repo.events(run.id)] == [
        (S.QUEUED, 1), (S.STARTING, 1), (S.RUNNING, 1), (S.QUEUED, 2), (S.STARTING, 2)]


def test_the_same_trial_registered_at_once_twice_is_one_run_with_two_attempts(sweeps, sweep_spec, trial_spec):
    sweep = _running_sweep(sweeps, sweep_spec)
    results, errors = [], []

    def register(token):
        try:
            results.append(sweeps.register_trial(sweep.id, trial_id="t", spec=trial_spec, params={}, token=token))
        except Exception as exc:  # pragma: no cover - the assertion below shows it
            errors.append(exc)

    threads = [threading.Thread(target=register, args=(f"tok{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len({r.id for r in results}) == 1 and sorted(r.attempt for r in results) == [1, 2]


def test_the_database_refuses_two_runs_for_one_trial(repo, sweeps, sweep_spec, trial_spec):
    sweep = _running_sweep(sweeps, sweep_spec)
    sweeps.register_trial(sweep.id, trial_id="t", spec=trial_spec, params={}, token="r")
    now = utcnow()
    with pytest.raises(IntegrityError), repo.db.write() as session:
        session.add(Run(id="dup", name="dup", status="QUEUED", attempt=1, spec={}, summary={}, extrema={}, tags=[],
                        sweep_id=sweep.id, trial_id="t", created_at=now, updated_at=now))


def test_completed_trials_and_ended_sweeps_take_no_registration(repo, sweeps, sweep_spec, trial_spec):
    sweep = _running_sweep(sweeps, sweep_spec)
    run = sweeps.register_trial(sweep.id, trial_id="t", spec=trial_spec, params={}, token="r")
    repo.transition(run.id, S.RUNNING)
    repo.transition(run.id, S.COMPLETED)
    with pytest.raises(IllegalTransition, match="COMPLETED"):
        sweeps.register_trial(sweep.id, trial_id="t", spec=trial_spec, params={}, token="r2")
    sweeps.transition(sweep.id, SS.COMPLETED)
    with pytest.raises(IllegalTransition, match="takes no new trials"):
        sweeps.register_trial(sweep.id, trial_id="u", spec=trial_spec, params={}, token="r3")


def test_end_trial_stops_or_fails_active_trials_and_ignores_ended_ones(repo, sweeps, sweep_spec, trial_spec):
    sweep = _running_sweep(sweeps, sweep_spec)
    runs = {t: sweeps.register_trial(sweep.id, trial_id=t, spec=trial_spec, params={}, token=t) for t in "sfc"}
    repo.transition(runs["c"].id, S.RUNNING)
    repo.transition(runs["c"].id, S.COMPLETED)
    assert sweeps.end_trial(sweep.id, "s", outcome="stopped").status is S.STOPPED
    failed = sweeps.end_trial(sweep.id, "f", outcome="failed", error="OOM")
    assert (failed.status, failed.error) == (S.FAILED, "OOM")
    assert sweeps.end_trial(sweep.id, "c", outcome="stopped").status is S.COMPLETED
    with pytest.raises(TrialNotFound):
        sweeps.end_trial(sweep.id, "nope", outcome="failed")


@pytest.mark.parametrize(("end", "trial_status"), [(SS.COMPLETED, S.FAILED), (SS.FAILED, S.FAILED)])
def test_a_sweep_that_ends_fails_its_unfinished_trials(repo, sweeps, sweep_spec, trial_spec, end, trial_status):
    sweep = _running_sweep(sweeps, sweep_spec)
    open_run = sweeps.register_trial(sweep.id, trial_id="open", spec=trial_spec, params={}, token="a")
    done = sweeps.register_trial(sweep.id, trial_id="done", spec=trial_spec, params={}, token="b")
    repo.transition(done.id, S.RUNNING)
    repo.transition(done.id, S.COMPLETED)
    sweeps.transition(sweep.id, end, error="Tune crashed" if end is SS.FAILED else None)
    ended = repo.get_run(open_run.id)
    assert (ended.status, ended.error) == (trial_status, TRIAL_OUTLIVED_SWEEP)
    assert repo.get_run(done.id).status is S.COMPLETED


def test_a_canceled_sweep_cancels_its_active_trials_through_canceling(repo, sweeps, sweep_spec, trial_spec):
    sweep = _running_sweep(sweeps, sweep_spec)
    run = sweeps.register_trial(sweep.id, trial_id="t", spec=trial_spec, params={}, token="a")
    assert sweeps.cancel(sweep.id).status is SS.CANCELING
    assert repo.get_run(run.id).status is S.CANCELING  # with its sweep, in the same transaction
    # Stopping the driver kills the trial's workers: their FAILED report is acknowledged, the cancel wins.
    assert repo.apply_worker_report(run.id, S.FAILED, error="SIGTERM received").status is S.CANCELING
    assert sweeps.end_trial(sweep.id, "t", outcome="failed").status is S.CANCELING
    assert sweeps.apply_driver_report(sweep.id, SS.COMPLETED).status is SS.CANCELING  # the cancel wins
    sweeps.transition(sweep.id, SS.CANCELED, only_from=[SS.CANCELING])
    assert [e.to_status for e in repo.events(run.id)][-2:] == [S.CANCELING, S.CANCELED]
    assert repo.get_run(run.id).status is S.CANCELED and repo.get_run(run.id).error is None


def test_a_trial_resumed_by_hand_is_an_ordinary_run_the_sweep_no_longer_ends(repo, sweeps, sweep_spec, trial_spec):
    sweep = _running_sweep(sweeps, sweep_spec)
    run = sweeps.register_trial(sweep.id, trial_id="t", spec=trial_spec, params={}, token="a")
    sweeps.end_trial(sweep.id, "t", outcome="stopped")
    resumed = repo.resume_run(run.id)
    assert resumed.status is S.QUEUED and not resumed.driven_by_sweep
    repo.begin_attempt(run.id, token="own")
    with pytest.raises(IllegalTransition, match="resumed by hand"):
        sweeps.register_trial(sweep.id, trial_id="t", spec=trial_spec, params={}, token="b")
    sweeps.transition(sweep.id, SS.FAILED)
    assert repo.get_run(run.id).status is S.STARTING


def test_extrema_keep_the_min_and_max_of_every_point_and_best_follows_the_metric_mode(repo, example_spec):
    run = repo.create_run(example_spec)
    repo.add_metrics(run.id, _points("eval/loss", [2.0, 0.5]) + _points("eval/accuracy", [0.2, 0.9]))
    repo.add_metrics(run.id, _points("eval/loss", [0.7, math.nan]) + _points("eval/accuracy", [0.4, math.inf]))
    stored = repo.get_run(run.id)
    assert stored.extrema == {"eval/loss": [0.5, 2.0], "eval/accuracy": [0.2, 0.9]}
    view = stored.to_view()
    assert view.best == {"eval/loss": 0.5, "eval/accuracy": 0.9}
    assert view.summary == {"eval/loss": 0.7, "eval/accuracy": 0.4}


def test_runs_can_be_listed_by_sweep(repo, sweeps, sweep_spec, trial_spec, example_spec):
    sweep = _running_sweep(sweeps, sweep_spec)
    trials = [sweeps.register_trial(sweep.id, trial_id=t, spec=trial_spec, params={}, token=t).id for t in "ab"]
    repo.create_run(example_spec)
    runs, cursor = repo.list_runs(sweep_id=sweep.id)
    assert {r.id for r in runs} == set(trials) and cursor is None
    first, cursor = repo.list_runs(sweep_id=sweep.id, limit=1)
    second, _ = repo.list_runs(sweep_id=sweep.id, limit=1, cursor=cursor)
    assert {first[0].id, second[0].id} == set(trials)


def test_the_spec_is_stored_as_given(sweeps, sweep_spec):
    body = copy.deepcopy(sweep_spec.model_dump(mode="json"))
    assert sweeps.get_sweep(sweeps.create_sweep(sweep_spec).id).spec == body


def test_archiving_a_sweep_archives_its_trials_and_unarchiving_brings_back_only_those(repo, sweeps, sweep_spec,
                                                                                    trial_spec):
    sweep = _running_sweep(sweeps, sweep_spec)
    trials = [sweeps.register_trial(sweep.id, trial_id=f"t_{i}", spec=trial_spec, params={}, token=f"r{i}")
              for i in range(3)]
    repo.set_archived(trials[0].id, True)  # archived on its own first
    own = repo.get_run(trials[0].id).archived_at
    sweeps.set_archived(sweep.id, True)
    archived = sweeps.sweep_view(sweep.id).archived_at
    assert [repo.get_run(t.id).archived_at for t in trials] == [own, archived, archived]
    sweeps.set_archived(sweep.id, True)  # again: nothing moves
    assert [repo.get_run(t.id).archived_at for t in trials] == [own, archived, archived]
    later = sweeps.register_trial(sweep.id, trial_id="t_3", spec=trial_spec, params={}, token="r3")
    assert repo.get_run(later.id).archived_at == archived  # registered while archived: hidden with it
    sweeps.set_archived(sweep.id, False)
    assert sweeps.sweep_view(sweep.id).archived_at is None
    assert [repo.get_run(t.id).archived_at for t in [*trials, later]] == [own, None, None, None]
