"""The driver's reporting to the service, without Ray: trial ends, cancel polling, and what Tune
pickles into its experiment (never the sweep token)."""

import pickle
from types import SimpleNamespace

import pytest

from api.errors import ApiError
from api.views import SweepStatus
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


def trial(trial_id):
    return SimpleNamespace(trial_id=trial_id, error_file=None)


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
