"""One value per (key, step) after a resume, on SQLite and PostgreSQL: a resumed attempt that
reports a point at a step an earlier attempt reported too (the trainer commits an epoch's
checkpoint before that epoch's evaluation, so a run resumed from it evaluates the same step
again) supersedes the earlier point; a key it does not report again keeps the earlier point;
the summary, the best values and ``run_bests`` follow; and batches past the earlier attempts'
steps cost no query."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import event, select

from api.views import ReportedMetric, RunStatus
from service import metric_writes
from service.db.models import RunBest

S = RunStatus
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
ACC, LOSS, TRAIN = "eval/accuracy", "eval/loss", "train/loss"


def _running(repo, spec) -> str:
    run = repo.create_run(spec)
    repo.begin_attempt(run.id, token="tok-1")
    repo.apply_worker_report(run.id, S.RUNNING, step=0)
    return run.id


def _train(steps, value) -> list[ReportedMetric]:
    return [ReportedMetric(step=s, key=TRAIN, value=value(s), time=T0) for s in steps]


def _evaluation(step: int, accuracy: float, loss: float) -> list[ReportedMetric]:
    return [ReportedMetric(step=step, key=ACC, value=accuracy, time=T0),
            ReportedMetric(step=step, key=LOSS, value=loss, time=T0)]


def _series(repo, run_id, key, *, all_attempts=False) -> list[tuple[int, float, int, bool]]:
    points, _ = repo.metrics_after(run_id, all_attempts=all_attempts)
    return [(p.step, p.value, p.attempt, p.superseded) for p in points if p.key == key]


def _bests(repo, run_id) -> dict[str, tuple[float, float]]:
    with repo.db.read() as session:
        rows = session.execute(select(RunBest.key, RunBest.min_value, RunBest.max_value)
                               .where(RunBest.run_id == run_id)).all()
    return {key: (low, high) for key, low, high in rows}


def _attempt_one(repo, run_id) -> None:
    """6 epochs of 22 batches, checkpointed each epoch before its evaluation; killed at batch 50,
    after the checkpoint at 44. Its best accuracy (0.9) and loss (0.1) are at step 44."""
    repo.add_metrics(run_id, _train(range(1, 23), lambda s: 2.0 - s / 100), session_id="a1", batch=1)
    repo.add_metrics(run_id, _evaluation(22, 0.5, 1.0), session_id="a1", batch=2)
    repo.add_metrics(run_id, _train(range(23, 45), lambda s: 2.0 - s / 100), session_id="a1", batch=3)
    repo.add_metrics(run_id, _evaluation(44, 0.9, 0.1), session_id="a1", batch=4)
    repo.add_metrics(run_id, _train(range(45, 51), lambda s: 2.0 - s / 100), session_id="a1", batch=5)


@pytest.mark.parametrize("bound", ["from_running", "from_the_database"])
def test_a_resumed_attempt_s_evaluation_at_its_checkpoint_step_supersedes_the_earlier_one(repo, example_spec, bound):
    run_id = _running(repo, example_spec)
    _attempt_one(repo, run_id)
    repo.apply_worker_report(run_id, S.RESTARTING)  # Ray Train restarts the worker group: attempt 2
    repo.apply_worker_report(run_id, S.RUNNING, step=44)
    if bound == "from_the_database":  # another service process, or one restarted since
        metric_writes.forget_bounds()
    # Attempt 2 evaluates step 44 again first (its checkpoint was written before that evaluation).
    repo.add_metrics(run_id, _evaluation(44, 0.6, 0.5), session_id="a2", batch=1)
    accuracy = _series(repo, run_id, ACC)
    assert [(step, value, attempt) for step, value, attempt, _ in accuracy] == [(22, 0.5, 1), (44, 0.6, 2)]
    run = repo.get_run(run_id)
    assert run.summary[ACC] == 0.6 and run.summary[LOSS] == 0.5  # the latest value is the surviving one
    view = run.to_view()
    assert view.best[ACC] == 0.6 and view.best[LOSS] == 0.5  # attempt 1's 0.9 and 0.1 no longer count
    assert _bests(repo, run_id)[ACC] == (0.5, 0.6)
    assert repo.eval_metrics_at(run_id, 44) == {ACC: 0.6, LOSS: 0.5}

    repo.add_metrics(run_id, _train(range(45, 67), lambda s: 1.0 - s / 100), session_id="a2", batch=2)
    repo.add_metrics(run_id, _evaluation(66, 0.7, 0.4), session_id="a2", batch=3)

    for key, values in ((ACC, [(22, 0.5, 1), (44, 0.6, 2), (66, 0.7, 2)]),
                        (LOSS, [(22, 1.0, 1), (44, 0.5, 2), (66, 0.4, 2)])):
        assert [(step, value, attempt) for step, value, attempt, _ in _series(repo, run_id, key)] == values
    train = _series(repo, run_id, TRAIN)
    assert [step for step, *_ in train] == list(range(1, 67))  # one value per step, in order
    assert [attempt for _, _, attempt, _ in train] == [1] * 44 + [2] * 22  # 44: attempt 1's, never reported again
    every = [(key, step, attempt) for key in (ACC, LOSS, TRAIN)
             for step, _, attempt, superseded in _series(repo, run_id, key, all_attempts=True) if superseded]
    assert every == [(ACC, 44, 1), (LOSS, 44, 1)] + [(TRAIN, s, 1) for s in range(45, 51)]  # kept for audit
    run = repo.get_run(run_id)
    assert run.summary == {ACC: 0.7, LOSS: 0.4, TRAIN: pytest.approx(1.0 - 66 / 100)}
    assert run.to_view().best[ACC] == 0.7 and run.to_view().best[LOSS] == 0.4
    assert _bests(repo, run_id)[ACC] == (0.5, 0.7) and _bests(repo, run_id)[LOSS] == (0.4, 1.0)


def test_a_step_one_attempt_reports_twice_keeps_both_points(repo, example_spec):
    """Only an earlier attempt's points are superseded: within one attempt nothing changes."""
    run_id = _running(repo, example_spec)
    repo.add_metrics(run_id, _train([5, 5], lambda s: 1.0))
    repo.apply_worker_report(run_id, S.RESTARTING)
    repo.apply_worker_report(run_id, S.RUNNING, step=5)
    repo.add_metrics(run_id, _train([6, 6], lambda s: 0.5))
    assert [(step, attempt) for step, _, attempt, _ in _series(repo, run_id, TRAIN)] == [(5, 1), (5, 1), (6, 2), (6, 2)]


def test_only_a_resumed_attempt_s_batches_at_earlier_attempts_steps_query_for_points_to_supersede(repo, example_spec):
    """The ingest path stays one insert a batch: a first attempt's batches and a resumed
    attempt's batches past its checkpoint step read no metric rows and update none."""
    run_id = _running(repo, example_spec)
    statements: list[str] = []

    def seen(_conn, _cursor, statement, *_args):
        if "metrics" in statement and not statement.lstrip().upper().startswith(("INSERT", "COPY")):
            statements.append(statement)

    event.listen(repo.engine, "before_cursor_execute", seen)
    try:
        repo.add_metrics(run_id, _train(range(1, 11), lambda s: 1.0 / s))
        assert statements == []  # attempt 1
        repo.apply_worker_report(run_id, S.RESTARTING)
        repo.apply_worker_report(run_id, S.RUNNING, step=6)
        statements.clear()
        repo.add_metrics(run_id, _train(range(7, 13), lambda s: 2.0 / s))
        assert statements == []  # past step 6, the most any earlier attempt's surviving point has
        repo.add_metrics(run_id, _train([6], lambda s: 3.0))
        assert statements  # at step 6: attempt 1's point there is superseded
    finally:
        event.remove(repo.engine, "before_cursor_execute", seen)
    assert [(step, attempt) for step, _, attempt, _ in _series(repo, run_id, TRAIN) if step == 6] == [(6, 2)]
