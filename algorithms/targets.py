"""Target helpers shared by methods that turn class indices into dense target distributions."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# A target that counts for nothing: no loss, no accuracy, no token of perplexity. PyTorch's
# cross_entropy default and Hugging Face's convention: a language model's padding.
IGNORE_INDEX = -100


def is_index_target(target: torch.Tensor) -> bool:
    """True for class-index targets (an integer tensor), False for dense targets."""
    return not (target.is_floating_point() or target.is_complex())


def to_dense_targets(target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Index targets ``(N,)`` as float one-hot rows ``(N, num_classes)``; dense targets as they are."""
    if is_index_target(target):
        return F.one_hot(target.long(), num_classes).float()
    return target
