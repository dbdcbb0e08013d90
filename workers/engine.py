"""The engine: runs algorithms, then callbacks, at each event, in a fixed order.

The order, for every event:

1. Algorithms whose ``match(event, state)`` is true. ``match`` only decides; it never changes
   state. Before-events (``INIT``, ``*_START``, ``BEFORE_*``) run algorithms in the order the
   run spec lists them; after-events (``AFTER_*``, ``*_END``; ``Event.is_after``) run them in
   reverse, so an algorithm can undo its own before-change before an earlier-listed algorithm
   sees the state (label smoothing restores the targets at ``AFTER_LOSS``).
2. Callbacks, always in list order, after all algorithms: they observe what the algorithms did.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from algorithms.base import Algorithm
from workers.events import Event
from workers.state import State


# Decided once per event type, not per call: ``Event.is_after`` reads the enum's value, which
# costs more than a set lookup, and a step with algorithms or callbacks dispatches 9 events (a
# step with neither dispatches none: ``Trainer.train_batch``).
_AFTER_EVENTS = frozenset(event for event in Event if event.is_after)


class Callback(Protocol):
    """Observes the loop (monitors, loggers). Called at every event after the algorithms."""

    def run_event(self, event: Event, state: State) -> None: ...


class Engine:
    """Dispatches events to ``algorithms`` and ``callbacks`` in the documented order."""

    def __init__(self, algorithms: Sequence[Algorithm] = (), callbacks: Sequence[Callback] = ()):
        self.algorithms = list(algorithms)
        self.callbacks = list(callbacks)

    def run_event(self, event: Event, state: State) -> None:
        """Run every matching algorithm, then every callback, for ``event``."""
        if self.algorithms:  # runs with callbacks only: no ordering, no list, per event
            ordered = reversed(self.algorithms) if event in _AFTER_EVENTS else self.algorithms
            # Decide first, then apply: one algorithm's apply cannot change whether another
            # algorithm matched this event.
            for algorithm in [a for a in ordered if a.match(event, state)]:
                algorithm.apply(event, state)
        for callback in self.callbacks:
            callback.run_event(event, state)
