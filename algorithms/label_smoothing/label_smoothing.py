"""LabelSmoothing: move a fraction of each target's probability mass to the uniform distribution.

Discourages over-confident logits and usually improves accuracy and calibration of classifiers.
The smoothed targets exist only for the loss: they are installed at ``BEFORE_LOSS`` and the
original targets come back at ``AFTER_LOSS``, so callbacks and metrics after the loss see the
labels the data loader produced.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event
from algorithms.targets import IGNORE_INDEX, is_index_target, to_dense_targets


def smooth_labels(logits: torch.Tensor, target: torch.Tensor, smoothing: float = 0.1, *,
                  class_dim: int | None = None) -> torch.Tensor:
    """Dense smoothed targets: ``(1 - smoothing) * one_hot(target) + smoothing / num_classes``.

    Composer's signature: ``logits`` give the number of classes; ``target`` holds class indices
    or dense rows of ``logits``' shape (e.g. already mixed by CutMix), returned smoothed in
    ``logits``' layout. ``smoothing`` in [0, 1] (1: uniform targets). The class dimension is
    Composer's, dim 1 (``(N, C)``, or ``(N, C, d1, ...)`` with index targets ``(N, d1, ...)``),
    unless the index targets only fit a last class dimension (a language model's ``(B, T, V)``
    logits with ``(B, T)`` targets); ``class_dim`` says it outright. An index target of
    ``IGNORE_INDEX`` (-100) gets a row of zeros, which the loss leaves out.
    """
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing {smoothing} must lie in [0, 1]")
    if class_dim is None:
        class_dim = _class_dim(logits, target)
    num_classes = logits.shape[class_dim]
    if not is_index_target(target):
        return to_dense_targets(target, num_classes) * (1.0 - smoothing) + smoothing / num_classes
    # An ignored target (IGNORE_INDEX: a language model's padding) gets a row of zeros: no loss.
    kept = target != IGNORE_INDEX
    dense = F.one_hot(target.long().where(kept, 0), num_classes).float()
    if class_dim % logits.dim() != logits.dim() - 1:
        dense = dense.movedim(-1, class_dim)  # one_hot appends the class dimension last
    return (dense * (1.0 - smoothing) + smoothing / num_classes) * kept.unsqueeze(class_dim)


def _class_dim(logits: torch.Tensor, target: torch.Tensor) -> int:
    if logits.dim() <= 2 or not is_index_target(target):
        return 1 if logits.dim() >= 2 else 0
    composer_layout = logits.shape[:1] + logits.shape[2:]
    if target.shape == composer_layout:
        return 1
    if target.shape == logits.shape[:-1]:
        return -1
    raise ValueError(f"smooth_labels target of shape {tuple(target.shape)} fits neither class dimension of logits "
                     f"{tuple(logits.shape)}: index targets must be (N, d1, ...) for logits (N, C, d1, ...) "
                     f"or logits.shape[:-1] for logits (..., C)")


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
            # The loop's outputs keep classes last (N, C) or per token (B, T, V).
            state.targets = smooth_labels(state.outputs, state.targets, self.smoothing, class_dim=-1)
        else:
            state.targets = self._original_targets
            self._original_targets = None  # don't keep a batch alive between steps
