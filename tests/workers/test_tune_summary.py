"""A sweep's closing message (``workers.tune.outcome.summary``): its counts, its best trial, or
that no trial reported the metric it decides on."""

from __future__ import annotations

from workers.tune.outcome import SweepOutcome, TrialOutcome, summary


def trial(trial_id: str, metric: float | None, status: str = "COMPLETED") -> TrialOutcome:
    return TrialOutcome(trial_id=trial_id, run_id=f"run-{trial_id}", algorithms=[], params={}, status=status,
                        metric=metric, wall_time_s=1.0, train_time_s=1.0, progress=1.0)


def outcome(trials: list[TrialOutcome], best: TrialOutcome | None) -> SweepOutcome:
    return SweepOutcome(sweep_id="s", metric="eval/pr_auc", mode="max", trials=trials, pareto=[], best=best,
                        skipped=[])


def test_the_message_names_the_best_trial_or_says_that_none_reported_the_metric():
    best = trial("a", 0.91)
    assert summary(outcome([best, trial("b", 0.5, "STOPPED")], best)) == (
        "2 trial(s): 1 completed, 1 stopped; best run-a eval/pr_auc=0.91")
    # A metric of your own that no trial returned: COMPLETED trials, and no best among them.
    assert summary(outcome([trial("a", None)], None)) == (
        "1 trial(s): 1 completed; no trial reported eval/pr_auc, so none is best")
    assert summary(outcome([trial("a", None, "FAILED")], None)) == "1 trial(s): 1 failed"
