"""Loggers in the spec: TensorBoard event files under the run's storage prefix, read back with
TensorBoard's own EventAccumulator; a failing logger never fails the run."""

from __future__ import annotations

import pytest

from api.views import RunStatus
from workers.loggers import FanoutSink, closed_at_end, flatten, with_loggers
from workers.paths import checkpoints_url, run_url, tensorboard_url
from workers.reporter import MemorySink
from workers.trainer import train
from tests.workers.helpers_specs import tiny_spec


def test_tensorboard_events_hold_every_reported_scalar(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = tiny_spec(loggers=[{"name": "tensorboard"}], eval_interval="1ba", tags=["baseline"])
    run = run_url(f"file://{tmp_path}", "r1")
    memory = MemorySink()
    sink = with_loggers(memory, spec, run)
    assert isinstance(sink, FanoutSink)
    train(spec, sink=sink, checkpoint_url=checkpoints_url(run))

    events = EventAccumulator(tensorboard_url(run).removeprefix("file://"))
    events.Reload()
    assert "eval/accuracy" in events.Tags()["scalars"] and "spec" in str(events.Tags())
    for key in ("eval/accuracy", "eval/loss"):
        written = [(e.step, pytest.approx(e.value)) for e in events.Scalars(key)]
        assert written == memory.values(key)


def test_a_logger_that_fails_is_skipped_and_the_primary_still_gets_everything():
    class Broken:
        def __getattr__(self, name):
            def fail(*args, **kwargs):
                raise OSError("disk full")
            return fail

    memory = MemorySink()
    sink = FanoutSink(memory, [Broken()])
    sink.add(1, "loss", 2.0)
    sink.flush()
    sink.close()
    assert memory.values("loss") == [(1, 2.0)]
    # Nor does a logger that cannot end its run (MLflow unreachable at the end) fail the attempt.
    primary = MemorySink()
    with closed_at_end(FanoutSink(primary, [Broken()])) as sink:
        sink.add(1, "loss", 2.0)  # the attempt reports, and ends
    assert primary.closed


def test_the_loggers_end_failed_and_are_closed_when_the_primary_cannot_deliver_after_a_clean_end():
    class Undeliverable(MemorySink):
        def close(self):
            raise RuntimeError("the service did not take reports")

    logger = MemorySink()
    with pytest.raises(RuntimeError, match="did not take reports"):
        with closed_at_end(FanoutSink(Undeliverable(), [logger])) as sink:
            sink.add(1, "loss", 2.0)  # the attempt reports, and trains to its end
    assert [s["status"] for s in logger.statuses] == [RunStatus.FAILED] and logger.closed
    assert logger.statuses[0]["error"] == "RuntimeError: the service did not take reports"


def test_only_the_loggers_hear_how_the_attempt_ended():
    primary, logger = MemorySink(), MemorySink()
    with closed_at_end(FanoutSink(primary, [logger])) as sink:
        sink.add(1, "loss", 2.0)  # the attempt reports, and trains to its end
    assert primary.statuses == [] and primary.closed  # the service hears it from workers.outcome
    assert [s["status"] for s in logger.statuses] == [RunStatus.COMPLETED] and logger.closed


def test_spec_flattens_to_dotted_params():
    flat = flatten(tiny_spec(algorithms=[{"name": "blurpool"}]).model_dump(mode="json"))
    assert flat["optimizer.lr"] == "0.05" and flat["algorithms.0.name"] == "blurpool"
