"""``fit_with_ray`` asks Ray Train's controller to poll its workers every
``CONTROLLER_POLL_INTERVAL_S`` (Ray's default, 2 s, held every run's end back by up to that:
bench/fit_end.py), unless the environment chose an interval, and leaves the environment as it was.
Ray Train is faked: what is checked is the environment its controller would be started with."""

import os

import pytest
import ray.train.torch

from api.specs import RunSpec
from workers.errors import TrainingError
from workers.ray_train import CONTROLLER_POLL_ENV, CONTROLLER_POLL_INTERVAL_S, fit_with_ray


class _Result:
    return_value = {"time/batch": 1.0}


class Seen(list):
    """The variable's value at each fake fit(), and the fake TorchTrainer class (``trainer``)."""

    trainer: type


@pytest.fixture
def seen_at_fit(monkeypatch):
    """The poll variable as each fit() of a fake TorchTrainer saw it; the variable unset to begin with."""
    seen = Seen()

    class FakeTorchTrainer:
        raises: Exception | None = None

        def __init__(self, train_fn, **settings):
            self.settings = settings

        def fit(self):
            seen.append(os.environ.get(CONTROLLER_POLL_ENV))
            if self.raises is not None:
                raise self.raises
            return _Result()

    monkeypatch.setattr(ray.train.torch, "TorchTrainer", FakeTorchTrainer)
    # Unset for the test, whatever this process had; monkeypatch restores that afterwards.
    monkeypatch.setenv(CONTROLLER_POLL_ENV, "")
    monkeypatch.delenv(CONTROLLER_POLL_ENV)
    seen.trainer = FakeTorchTrainer
    return seen


def spec():
    return RunSpec.model_validate({"name": "poll", "model": {"name": "simple_cnn"},
                                   "data": {"train": {"name": "digits"}, "batch_size": 32},
                                   "optimizer": {"name": "sgd", "lr": 0.1}, "max_duration": "1ba"})


def test_the_controller_polls_every_quarter_second_and_the_environment_is_left_as_it_was(seen_at_fit, tmp_path):
    assert fit_with_ray(spec(), run_id="r1", storage_path=str(tmp_path)) == {"time/batch": 1.0}
    assert seen_at_fit == [repr(CONTROLLER_POLL_INTERVAL_S)] == ["0.25"]
    assert CONTROLLER_POLL_ENV not in os.environ


def test_an_interval_the_environment_sets_is_kept(seen_at_fit, tmp_path, monkeypatch):
    monkeypatch.setenv(CONTROLLER_POLL_ENV, "1.5")
    fit_with_ray(spec(), run_id="r2", storage_path=str(tmp_path))
    assert seen_at_fit == ["1.5"]
    assert os.environ[CONTROLLER_POLL_ENV] == "1.5"


def test_the_environment_is_left_as_it_was_when_the_fit_fails(seen_at_fit, tmp_path):
    seen_at_fit.trainer.raises = RuntimeError("a worker died")
    with pytest.raises(TrainingError, match="a worker died"):
        fit_with_ray(spec(), run_id="r3", storage_path=str(tmp_path))
    assert seen_at_fit == ["0.25"]
    assert CONTROLLER_POLL_ENV not in os.environ
