"""The driver's reporting to the service, without Ray: trial ends, cancel polling, and what Tune
pickles into its experiment (never the sweep token); and how it ends the MLflow runs its trials'
rank 0 left RUNNING (a real MLflow store in an SQLite file)."""

import pickle
from types import SimpleNamespace

import pytest

from api.errors import ApiError
from api.views import RunStatus, SweepStatus
from tests.workers.helpers_specs import tiny_spec
from tests.workers.test_mlflow_logger import mlflow_store  # noqa: F401  (a fixture)
from workers.loggers import STATUS_TAG, MLflowSink
from workers.tune import main
from workers.tune import reporting as driver

TOKEN = "sweep-token-never-on-disk"


class FakeClient:
    base_url = "http://service"

    def __init__(self, statuses=()):
        self.statuses = list(statuses)
        self.ends: list[tuple[str, str, str, str | None]] = []
        self.refuse_ends = False

    def get_sweep(self, sweep_id):
        return SimpleNamespace(status=self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0])

    def end_trial(self, sweep_id, token, trial_id, end):
        if self.refuse_ends:
            raise ApiError(404, "no such trial")
        self.ends.append((sweep_id, token, trial_id, end.outcome))


@pytest.fixture
def session(monkeypatch):
    monkeypatch.setattr(driver, "POLL_INTERVAL_S", 0.0)
    client = FakeClient([SweepStatus.RUNNING])
    session = driver._DriverSession(key="sw1", client=client, token=TOKEN, sweep_id="sw1")
    driver._SESSIONS["sw1"] = session
    yield session
    driver._SESSIONS.pop("sw1", None)


def trial(trial_id, progress=None):
    """A Tune trial as the callbacks see it; ``progress``: its last report's ``time/progress``."""
    return SimpleNamespace(trial_id=trial_id, error_file=None,
                           last_result={} if progress is None else {"time/progress": progress})


def test_tune_stops_once_the_service_says_the_sweep_was_canceled(session):
    stopper = driver._StopWhenSweepEnds("sw1")
    session.client.statuses = [SweepStatus.RUNNING, SweepStatus.CANCELED]
    assert stopper.stop_all() is False
    assert stopper.stop_all() is True and session.sweep_status is SweepStatus.CANCELED
    assert stopper("any-trial", {}) is False  # single trials are never stopped by it


def test_a_service_that_cannot_be_reached_does_not_stop_the_sweep(session):
    def unreachable(sweep_id):
        raise ApiError(503, "restarting")

    session.client.get_sweep = unreachable
    assert driver._StopWhenSweepEnds("sw1").stop_all() is False and session.sweep_status is None


def test_trial_ends_reach_the_service_as_stopped_or_failed(session):
    callback = driver._ReportTrialEnds("sw1")
    callback.on_trial_start(iteration=1, trials=[], trial=trial("t1"))
    callback.on_trial_complete(iteration=2, trials=[], trial=trial("t1"))
    callback.on_trial_error(iteration=3, trials=[], trial=trial("t2"))
    assert session.client.ends == [("sw1", TOKEN, "t1", "stopped"), ("sw1", TOKEN, "t2", "failed")]
    assert session.ended["t1"] >= session.started["t1"]


def test_a_refused_trial_end_is_logged_not_raised_into_tune(session):
    session.client.refuse_ends = True
    driver._ReportTrialEnds("sw1").on_trial_error(iteration=1, trials=[], trial=trial("t9"))
    assert session.client.ends == []


def test_what_tune_pickles_holds_no_token_and_its_state_survives_a_restore(session):
    callback = driver._ReportTrialEnds("sw1")
    callback.on_trial_start(iteration=1, trials=[], trial=trial("t1"))
    blob = pickle.dumps((callback, driver._StopWhenSweepEnds("sw1")))
    assert TOKEN.encode() not in blob
    state = callback.get_state()
    assert TOKEN not in repr(state)

    restored = driver._DriverSession(key="sw1", client=FakeClient([SweepStatus.RUNNING]), token="attempt-2-token",
                                     sweep_id="sw1")
    driver._SESSIONS["sw1"] = restored
    pickle.loads(blob)[0].set_state(state)
    assert restored.started == session.started


def test_the_job_entry_point_refuses_to_start_without_its_service_and_token(monkeypatch, capsys):
    for name in ("TESSERA_SERVICE_URL", "TESSERA_SWEEP_TOKEN", "TESSERA_SWEEP_ID"):
        monkeypatch.delenv(name, raising=False)
    assert main(["--sweep-id", "sw1"]) == 2
    assert "TESSERA_SERVICE_URL and TESSERA_SWEEP_TOKEN" in capsys.readouterr().err


def driver_entry_env(monkeypatch):
    monkeypatch.setenv("TESSERA_SERVICE_URL", "http://service")
    monkeypatch.setenv("TESSERA_SWEEP_TOKEN", TOKEN)
    monkeypatch.setenv("TESSERA_ATTEMPT", "2")


@pytest.mark.parametrize("attempt", ["two", "0", ""])
def test_the_job_entry_point_refuses_a_bad_attempt_number_as_a_bad_start(monkeypatch, capsys, attempt):
    from workers.tune import driver as entry

    driver_entry_env(monkeypatch)
    monkeypatch.setenv("TESSERA_ATTEMPT", attempt)
    monkeypatch.setattr(entry, "drive_sweep", lambda *args, **kwargs: pytest.fail("driven on a bad attempt number"))
    assert main(["--sweep-id", "sw1"]) == 2  # as without its service and token: the job's last line says why
    refusal = f"workers.tune: TESSERA_ATTEMPT must be a whole number from 1, not {attempt!r}"
    assert capsys.readouterr().err.strip() == refusal


@pytest.mark.parametrize("answer, words", [
    (ApiError(404, "no such sweep"), "no such sweep"),
    (SimpleNamespace(spec={"name": "s", "base": {}, "novel_field": 1}), "novel_field"),  # a newer service's spec
])
def test_a_driver_that_cannot_fetch_or_read_its_sweep_says_so_in_its_log_and_exits_1(monkeypatch, caplog, answer,
                                                                                        words):
    from workers.tune import driver as entry

    class Answers(FakeClient):
        def __init__(self, *args, **kwargs):
            super().__init__()

        def get_sweep(self, sweep_id):
            if isinstance(answer, Exception):
                raise answer
            return answer

    driver_entry_env(monkeypatch)
    monkeypatch.setattr(entry, "Client", Answers)
    assert main(["--sweep-id", "sw1"]) == 1
    assert "sweep sw1 attempt 2 failed: could not fetch or read the sweep: " in caplog.text
    assert words in caplog.records[-1].getMessage()  # the job's last line says how it ended


def test_a_driver_stopped_by_ray_logs_the_stop_as_its_last_line_and_keeps_the_stop_s_exit(monkeypatch, caplog):
    from workers.tune import driver as entry

    def stopped(*args, **kwargs):
        raise SystemExit(15)  # what ray.init's SIGTERM handler raises in Tune when the job is stopped

    driver_entry_env(monkeypatch)
    monkeypatch.setattr(entry, "drive_sweep", stopped)
    with pytest.raises(SystemExit) as stop:
        main(["--sweep-id", "sw1"])
    assert stop.value.code == 15
    assert caplog.records[-1].getMessage() == ("sweep sw1 attempt 2 stopped by Ray's stop signal "
                                               "(a cancel, or its job was stopped); exit 15")


# --- the trials' MLflow runs ---------------------------------------------------------------------

def mlflow_sweep(session, store: str, experiment: str):
    """Give ``session`` a base spec that logs to MLflow; returns a maker of trials' rank-0 runs."""
    session.base = tiny_spec(loggers=[{"name": "mlflow", "tracking_uri": store, "experiment": experiment}])

    def rank_0_of(trial_id: str, sweep_id: str = "sw1") -> MLflowSink:
        return MLflowSink(session.base, store, experiment, run_id=f"run-{trial_id}",
                          trial={"sweep_id": sweep_id, "trial_id": trial_id})

    return rank_0_of


def ended_as(store: str, sink: MLflowSink) -> tuple[str, str | None]:
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=store).get_run(sink.run_id)
    return run.info.status, run.data.tags.get(STATUS_TAG)


def test_the_driver_ends_the_mlflow_run_of_a_trial_the_scheduler_stopped_finished_and_a_failed_ones_failed(
        session, mlflow_store):
    rank_0_of = mlflow_sweep(session, mlflow_store, "trial-ends")
    stopped, completed, failed = rank_0_of("t1"), rank_0_of("t2"), rank_0_of("t3")
    completed.status(RunStatus.COMPLETED)  # rank 0 ends a trial that trains to its end
    still_training = rank_0_of("t4")
    callback = driver._ReportTrialEnds("sw1")

    callback.on_trial_complete(iteration=1, trials=[], trial=trial("t1", progress=0.5))  # ASHA stopped it
    callback.on_trial_complete(iteration=2, trials=[], trial=trial("t2", progress=1.0))
    callback.on_trial_error(iteration=3, trials=[], trial=trial("t3"))  # its actor died, say

    assert ended_as(mlflow_store, stopped) == ("FINISHED", "STOPPED")
    assert ended_as(mlflow_store, completed) == ("FINISHED", "COMPLETED")
    assert ended_as(mlflow_store, failed) == ("FAILED", "FAILED")
    assert ended_as(mlflow_store, still_training) == ("RUNNING", None)


def test_after_tune_the_driver_ends_what_trials_left_running_as_the_sweep_ended(session, mlflow_store):
    rank_0_of = mlflow_sweep(session, mlflow_store, "sweep-ends")
    # Tune stopped the trials itself (the time budget): the ones that started and had no trial end.
    callback = driver._ReportTrialEnds("sw1")
    for trial_id in ("t1", "t2"):
        callback.on_trial_start(iteration=1, trials=[], trial=trial(trial_id))
    completed, budget_stopped = rank_0_of("t1"), rank_0_of("t2")
    completed.status(RunStatus.COMPLETED)
    callback.on_trial_complete(iteration=2, trials=[], trial=trial("t1", progress=1.0))
    driver.end_left_mlflow_runs(session, None)
    assert ended_as(mlflow_store, budget_stopped) == ("FINISHED", "STOPPED")

    # Canceled: the driver saw it, or Ray's stop signal (a SystemExit) ended Tune. Every trial's
    # run still RUNNING ends KILLED, and only this sweep's; those that ended stay as they ended.
    other_sweeps = rank_0_of("t1", sweep_id="sw2")
    session.sweep_status = SweepStatus.CANCELING
    training = rank_0_of("t3")
    driver.end_left_mlflow_runs(session, None)
    assert ended_as(mlflow_store, training) == ("KILLED", "CANCELED")
    session.sweep_status = None
    stopped_job = rank_0_of("t4")
    driver.end_left_mlflow_runs(session, SystemExit(15))
    assert ended_as(mlflow_store, stopped_job) == ("KILLED", "CANCELED")
    assert ended_as(mlflow_store, completed) == ("FINISHED", "COMPLETED")
    assert ended_as(mlflow_store, budget_stopped) == ("FINISHED", "STOPPED")
    assert ended_as(mlflow_store, other_sweeps) == ("RUNNING", None)

    # The driver failed: the service fails the sweep and its active trials.
    failing = rank_0_of("t5")
    driver.end_left_mlflow_runs(session, RuntimeError("storage gone"))
    assert ended_as(mlflow_store, failing) == ("FAILED", "FAILED")
