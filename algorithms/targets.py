"""Target helpers shared by methods that turn class indices into dense target distributions."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def is_index_target(target: torch.Tensor) -> bool:
    """True for class-index targets (an integer tensor), False for dense targets."""
    return not (target.is_floating_point() or target.is_complex())


def to_dense_targets(target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Index targets ``(N,)`` as float one-hot rows ``(N, num_classes)``; dense targets as they are."""
    if is_index_target(target):
        return F.one_hot(target.long(), num_classes).float()
    return target
