"""The in-process training loop: learning, metrics, microbatches, precision, determinism, events."""

import math
import time

import pytest
import torch

from tests.workers.helpers_specs import digits_spec, tiny_spec
from workers.events import Event
from workers.reporter import MemorySink
from workers.timekeeping import Timestamp
from workers.trainer import Trainer, train


class EventLog:
    """A callback recording each event and a value read from the state."""

    def __init__(self, read=lambda state: None):
        self.read, self.events, self.values = read, [], []

    def run_event(self, event, state):
        self.events.append(event)
        self.values.append((event, self.read(state)))


def test_a_short_run_on_digits_learns_well_above_chance_and_reports_every_metric():
    sink = MemorySink()
    final = train(digits_spec(), sink=sink)
    assert final["eval/accuracy"] > 0.6  # chance is 0.1
    assert [step for step, _ in sink.values("train/loss")] == list(range(1, 45))
    assert [step for step, _ in sink.values("eval/accuracy")] == [22, 44]
    assert sink.values("time/batch")[-1] == (44, 44)
    assert sink.values("time/epoch")[-1] == (44, 2)
    assert sink.values("time/progress")[-1] == (44, 1.0)
    assert len(sink.values("lr")) == 44 and sink.values("lr")[0][1] == 0.0  # warmup starts at 0
    assert all(value > 0 for _, value in sink.values("throughput/samples_per_sec"))
    assert final["eval/loss"] == sink.values("eval/loss")[-1][1]


def test_each_evaluation_is_a_line_in_the_log(caplog):
    import logging

    caplog.set_level(logging.INFO, logger="workers.trainer")
    Trainer(tiny_spec(max_duration="2ba", eval_interval="1ba")).fit()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("evaluation ")]
    assert len(lines) == 2 and lines[0].startswith("evaluation in epoch 1, batch 1 (50%): eval/accuracy=")
    assert lines[1].startswith("evaluation in epoch 1, batch 2 (100%): ") and "eval/loss=" in lines[1]


def test_a_sweep_trials_evaluation_is_delivered_before_tune_sees_it(caplog):
    """A trial the scheduler stops on an evaluation is STOPPED at once and takes no more reports:
    ``on_eval`` (Tune) gets the results only after the sink delivered them, and a sink that could
    not in time is named in the log."""
    import logging

    class Delivering(MemorySink):
        def __init__(self, delivered):
            super().__init__()
            self.calls, self.delivered = [], delivered

        def deliver(self, timeout_s):
            self.calls.append(("deliver", [key for _, key, _ in self.points if key.startswith("eval/")]))
            return self.delivered

    for delivered in (True, False):
        sink = Delivering(delivered)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="workers.trainer"):
            Trainer(tiny_spec(max_duration="2ba", eval_interval="1ba"), sink=sink,
                    on_eval=lambda results: sink.calls.append(("on_eval", results["time/batch"]))).fit()
        assert sink.calls == [("deliver", ["eval/loss", "eval/accuracy"]), ("on_eval", 1.0),
                              ("deliver", ["eval/loss", "eval/accuracy"] * 2), ("on_eval", 2.0)]
        warned = [r.getMessage() for r in caplog.records if "has not stored the evaluation" in r.getMessage()]
        assert len(warned) == (0 if delivered else 2)


def test_a_run_without_an_eval_set_logs_its_progress_at_each_epochs_end_and_every_half_minute(caplog):
    import logging

    from workers import metric_buffer

    caplog.set_level(logging.INFO, logger="workers.metric_buffer")
    spec = digits_spec(max_duration="2ep")
    spec = spec.model_copy(update={"data": spec.data.model_copy(update={"eval": None})})
    train(spec, sink=MemorySink())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training ")]
    assert [line.split(" (")[0] for line in lines] == ["training at the end of epoch 1, batch 22",
                                                      "training at the end of epoch 2, batch 44"]  # no third
    assert lines[0].startswith("training at the end of epoch 1, batch 22 (50%): train/loss=")
    assert "(mean of 22 steps)" in lines[0] and "samples/s" in lines[0]
    caplog.clear()
    train(tiny_spec(max_duration="3ba"), sink=MemorySink())  # ends mid-epoch: a last line at 100%
    last = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training ")]
    assert len(last) == 1 and last[0].startswith("training in epoch 1, batch 3 (100%): train/loss=")
    caplog.clear()
    buffer = metric_buffer.MetricBuffer(MemorySink(), rank=0, progress_log_s=0.0)  # a line at every flush
    for step, loss in ((1, 4.0), (2, 2.0), (3, 1.0)):
        buffer.add_step(step, torch.tensor(loss), 0.1)
        if step != 2:  # a line's loss is the mean over the steps since the line before
            buffer.flush(Timestamp(batch=step, batch_in_epoch=step, sample=8 * step), step / 10)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "training in epoch 1, batch 1 (10%): train/loss=4 (mean of 1 step), " \
        + lines[0].split("step), ")[1]
    assert lines[1].startswith("training in epoch 1, batch 3 (30%): train/loss=1.5 (mean of 2 steps)")
    assert len(lines) == 2
    quiet = metric_buffer.MetricBuffer(MemorySink(), rank=0)  # every PROGRESS_LOG_S: not at a mere flush
    quiet.add_step(1, torch.tensor(1.0), 0.1)
    quiet.flush(Timestamp(batch=1, batch_in_epoch=1, sample=8), 0.1)
    assert len(caplog.records) == 2


def first_batch_gradients(microbatch_size):
    trainer = Trainer(tiny_spec(microbatch_size=microbatch_size))
    inputs, targets = next(iter(trainer.train_loader))
    trainer.train_batch(inputs, targets)
    (_, loss, _), = trainer.metrics.pending
    return [p.grad.clone() for p in trainer.state.model.parameters()], loss


def test_microbatches_accumulate_the_same_gradients_as_the_full_batch():
    full_grads, full_loss = first_batch_gradients(None)
    micro_grads, micro_loss = first_batch_gradients(5)  # 16 = 5 + 5 + 5 + 1: uneven on purpose
    for full, micro in zip(full_grads, micro_grads):
        assert torch.allclose(full, micro, atol=1e-6, rtol=1e-5)
    assert torch.allclose(full_loss, micro_loss, atol=1e-6)


def test_auto_microbatching_uses_the_full_batch_on_cpu():
    trainer = Trainer(tiny_spec(microbatch_size="auto"))
    assert trainer.microbatches.bounds(16) == [(0, 16)]


@pytest.mark.parametrize("precision", ["amp_bf16", "amp_fp16"])
def test_mixed_precision_runs_complete_with_finite_loss(precision):
    sink = MemorySink()
    trainer = Trainer(tiny_spec(precision=precision), sink=sink)
    final = trainer.fit()
    assert trainer.state.scaler.is_enabled() == (precision == "amp_fp16")
    assert all(math.isfinite(v) for _, v in sink.values("train/loss"))
    assert math.isfinite(final["eval/loss"]) and 0.0 <= final["eval/accuracy"] <= 1.0


def test_deterministic_runs_with_the_same_seed_report_identical_metrics():
    def run():
        sink = MemorySink()
        spec = tiny_spec(deterministic=True, max_duration="4ba", algorithms=[{"name": "cutmix"}])
        train(spec, sink=sink)
        return [p for p in sink.points if p[1] != "throughput/samples_per_sec"]

    assert run() == run()
    assert not torch.are_deterministic_algorithms_enabled()  # restored after the run


def test_progress_advances_every_batch_when_max_duration_is_in_epochs():
    log = EventLog(read=lambda state: state.progress)
    Trainer(tiny_spec(max_duration="2ep"), callbacks=[log]).fit()
    progress = [value for event, value in log.values if event is Event.BATCH_END]
    assert progress == [0.125 * i for i in range(1, 9)]  # 4 batches per epoch, 2 epochs


def test_events_fire_in_the_documented_order():
    log = EventLog()
    Trainer(tiny_spec(max_duration="1ba", microbatch_size=8), callbacks=[log]).fit()
    one_microbatch = [Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS,
                      Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD]
    assert log.events == [Event.INIT, Event.FIT_START, Event.EPOCH_START, Event.AFTER_DATALOADER,
                          *one_microbatch, *one_microbatch, Event.AFTER_TRAIN_BATCH, Event.BATCH_END, Event.EVAL_START,
                          Event.EVAL_END, Event.FIT_END]


def test_evaluation_builds_no_autograd_graph_and_training_does():
    log = EventLog(read=lambda state: torch.is_grad_enabled())
    Trainer(tiny_spec(max_duration="1ba"), callbacks=[log]).fit()
    grad = dict(log.values)
    assert grad[Event.EVAL_START] is False and grad[Event.EVAL_END] is False
    assert grad[Event.BEFORE_FORWARD] is True and grad[Event.BATCH_END] is True


def test_a_duration_in_batches_can_stop_mid_epoch_and_still_ends_with_an_evaluation():
    log, sink = EventLog(), MemorySink()
    final = Trainer(tiny_spec(max_duration="6ba", eval_interval="1ep"), sink=sink, callbacks=[log]).fit()
    assert log.events.count(Event.EPOCH_END) == 1  # 4 batches per epoch: the second epoch is cut short
    assert [step for step, _ in sink.values("eval/accuracy")] == [4, 6]
    assert final["time/batch"] == 6 and final["time/epoch"] == 1


def test_a_duration_in_samples_rounds_up_to_whole_batches():
    trainer = Trainer(tiny_spec(max_duration="40sp"))
    assert trainer.state.max_batches == 3


def test_text_counts_tokens_and_a_duration_in_tokens_converts_to_batches():
    """8 rows of 32 characters a batch are 256 tokens: 1000 tokens take 4 batches (rounded up),
    and the timestamp counts every token trained on. Images count none."""
    from api.specs import RunSpec

    spec = RunSpec.model_validate({
        "name": "tokens", "model": {"name": "gpt_small", "params": {"n_layer": 1, "n_head": 2, "d_model": 16,
                                                                  "max_seq_len": 32}},
        "data": {"train": {"name": "shakespeare", "seq_len": 32, "limit": 64}, "batch_size": 8},
        "optimizer": {"name": "adamw", "lr": 0.003}, "max_duration": "1000tok", "seed": 0})
    trainer = Trainer(spec)
    assert trainer.state.max_batches == 4
    trainer.fit()
    assert trainer.state.timestamp.token == 4 * 256 and trainer.state.timestamp.batch == 4
    images = Trainer(tiny_spec(max_duration="2ba"))
    images.fit()
    assert images.state.timestamp.token == 0


def test_train_local_runs_a_single_worker_spec_in_process():
    from workers.local import train_local

    sink = MemorySink()
    final = train_local(tiny_spec(max_duration="3ba"), sink=sink)
    assert final["time/batch"] == 3 and sink.values("time/batch")[-1] == (3, 3)
    assert "eval/accuracy" in final


def test_a_step_dispatches_nothing_to_an_empty_engine_and_everything_once_a_callback_joins():
    """A run with no algorithms and no callbacks skips a step's nine dispatches; a callback that
    joins the engine between steps sees every event of the steps after, in order."""
    from workers.engine import Engine

    trainer = Trainer(tiny_spec(max_duration="3ba"), sink=MemorySink())
    step_events = [Event.AFTER_DATALOADER, Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS,
                   Event.AFTER_LOSS, Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH,
                   Event.BATCH_END]
    dispatched = []

    class Counting(Engine):
        def run_event(self, event, state):
            dispatched.append((state.timestamp.batch, event))
            super().run_event(event, state)

    trainer.engine = Counting()
    log = EventLog()

    class JoinAfterFirstStep:
        def run_event(self, event, state):  # the only callback until the first step has ended
            if event == Event.BATCH_END:
                trainer.engine.callbacks.remove(self)
                trainer.engine.callbacks.append(log)

    trainer.fit()
    assert [event for batch, event in dispatched if event in step_events] == []  # the empty engine's steps
    trainer = Trainer(tiny_spec(max_duration="3ba"), sink=MemorySink())
    dispatched.clear()
    trainer.engine = Counting(callbacks=[JoinAfterFirstStep()])
    trainer.fit()
    assert [event for event in log.events if event in step_events] == step_events * 2  # steps 2 and 3
    assert [event for batch, event in dispatched if event in step_events] == step_events * 3


def test_the_start_up_clock_times_the_first_step_only_and_leaves_the_engine_after_it():
    from workers.ray_train import FirstStepClock

    trainer = Trainer(tiny_spec(max_duration="3ba"), sink=MemorySink())
    log = EventLog(read=lambda state: time.time())
    trainer.engine.callbacks.append(log)
    clock = FirstStepClock(trainer.engine)
    trainer.fit()
    batch_ends = [t for event, t in log.values if event == Event.BATCH_END]
    next_batches = [t for event, t in log.values if event == Event.AFTER_DATALOADER]
    assert len(batch_ends) == 3
    assert batch_ends[0] <= clock.done <= next_batches[1]  # the first step's end, before the second
    assert "train_batch" not in vars(trainer)  # steps 2 and 3 ran the class's method
    assert trainer.engine.callbacks == [log]  # and no clock
