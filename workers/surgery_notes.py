"""Surgery that changed nothing becomes a note on the run, not a warning lost in a worker log.

Surgery methods (BlurPool, ChannelsLast, Factorize, ALiBi) warn ``NoEffectWarning`` when the
model has nothing they recognise, which is common with your own model (``model.import``).
``collect_no_effect`` runs the INIT event and returns those messages; rank 0 adds them to the
RUNNING event's message (``GET /runs/{id}/events``, the dashboard's timeline, ``tessera show``).
Other warnings are re-issued unchanged.
"""

from __future__ import annotations

import logging
import warnings
from typing import Callable

from algorithms.base import NoEffectWarning

log = logging.getLogger(__name__)


def collect_no_effect(action: Callable[[], None]) -> list[str]:
    """Run ``action``; return the ``NoEffectWarning`` messages it issued, in order."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action()
    notes = []
    for warning in caught:
        if issubclass(warning.category, NoEffectWarning):
            notes.append(str(warning.message))
            log.warning("%s", warning.message)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return notes


def with_notes(message: str, notes: list[str]) -> str:
    """``message`` followed by the notes: "...; no effect: BlurPool found no ...; ..."."""
    return message + "".join(f"; no effect: {note}" for note in notes)
