"""The loop's events, for the runtime.

``Event`` is defined in ``algorithms.events`` because algorithms sit below ``workers`` in the
import order and must name the events they act on; read its docstring for where each event
fires and for the ordering rule (``Event.is_after``: ``AFTER_*`` and ``*_END`` events run
algorithms in reverse order). The runtime imports it from here.
"""

from algorithms.events import Event

__all__ = ["Event"]
