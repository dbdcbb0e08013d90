"""The engine's fixed order: algorithms in list order before, reversed after; callbacks last."""

import pytest

from algorithms.base import Algorithm
from workers.engine import Engine
from workers.events import Event


class Recorder(Algorithm):
    events = frozenset(Event)

    def __init__(self, label, log):
        self.label, self.log = label, log

    def apply(self, event, state):
        self.log.append(self.label)


class RecordingCallback:
    def __init__(self, log):
        self.log = log

    def run_event(self, event, state):
        self.log.append("callback")


def run(event, *labels):
    log = []
    engine = Engine([Recorder(label, log) for label in labels], [RecordingCallback(log)])
    engine.run_event(event, state=object())
    return log


@pytest.mark.parametrize("event", [Event.INIT, Event.EPOCH_START, Event.BEFORE_FORWARD, Event.BEFORE_LOSS])
def test_before_events_run_algorithms_in_list_order_then_callbacks(event):
    assert run(event, "a", "b", "c") == ["a", "b", "c", "callback"]


@pytest.mark.parametrize("event", [Event.AFTER_DATALOADER, Event.AFTER_LOSS, Event.BATCH_END, Event.FIT_END])
def test_after_events_run_algorithms_in_reverse_order_then_callbacks(event):
    assert run(event, "a", "b", "c") == ["c", "b", "a", "callback"]


def test_is_after_holds_exactly_for_after_and_end_events():
    after = {e for e in Event if e.is_after}
    assert after == {Event.AFTER_DATALOADER, Event.AFTER_FORWARD, Event.AFTER_LOSS, Event.AFTER_BACKWARD,
                     Event.AFTER_TRAIN_BATCH, Event.BATCH_END, Event.EPOCH_END, Event.EVAL_END, Event.FIT_END}


def test_only_matching_algorithms_apply_and_matches_are_decided_before_any_apply():
    log = []

    class DisablesOthers(Recorder):
        def apply(self, event, state):
            super().apply(event, state)
            state["enabled"] = False

    class RunsIfEnabled(Recorder):
        def match(self, event, state):
            return state["enabled"]

    state = {"enabled": True}
    Engine([DisablesOthers("first", log), RunsIfEnabled("second", log)]).run_event(Event.BEFORE_LOSS, state)
    assert log == ["first", "second"]
    log.clear()
    Engine([RunsIfEnabled("second", log)]).run_event(Event.BEFORE_LOSS, state)
    assert log == []
