"""LabelSmoothing: move a fraction of each target's probability mass to the uniform distribution.

Discourages over-confident logits and usually improves accuracy and calibration of classifiers.
The smoothed targets exist only for the loss: they are installed at ``BEFORE_LOSS`` and the
original targets come back at ``AFTER_LOSS``, so callbacks and metrics after the loss see the
labels the data loader produced.
"""

from __future__ import annotations

from typing import Any

import torch

from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event
from algorithms.targets import to_dense_targets


def smooth_labels(logits: torch.Tensor, target: torch.Tensor, smoothing: float = 0.1) -> torch.Tensor:
    """Dense smoothed targets: ``(1 - smoothing) * one_hot(target) + smoothing / num_classes``.

    Composer's signature: ``logits`` (N, C) give the number of classes; ``target`` holds class
    indices (N,) or dense rows (N, C), e.g. already mixed by CutMix. Rows that sum to 1 still
    sum to 1.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing {smoothing} must lie in [0, 1)")
    num_classes = logits.shape[-1]  # the class dimension is last: (N, C) or per token (B, T, V)
    dense = to_dense_targets(target, num_classes)
    return dense * (1.0 - smoothing) + smoothing / num_classes


class LabelSmoothing(Algorithm):
    """Smooths targets for the loss only: replaced at BEFORE_LOSS, restored at AFTER_LOSS."""

    name = "label_smoothing"
    events = frozenset({Event.BEFORE_LOSS, Event.AFTER_LOSS})

    def __init__(self, smoothing: float = 0.1):
        self.smoothing = smoothing
        self._original_targets: Any = None

    def apply(self, event: Event, state: AlgorithmState) -> None:
        if event is Event.BEFORE_LOSS:
            self._original_targets = state.targets
            state.targets = smooth_labels(state.outputs, state.targets, self.smoothing)
        else:
            state.targets = self._original_targets
            self._original_targets = None  # don't keep a batch alive between steps
