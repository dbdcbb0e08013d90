"""Soft cross-entropy: one loss for class-index targets and dense (probability) targets.

CutMix and label smoothing turn index targets into distributions; the loss must accept both,
and must give the same value for index targets and their one-hot rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of ``logits`` (N, C) against indices (N,) or distributions (N, C).

    Computed in float32 even under autocast: log-softmax in bf16/fp16 loses the small
    probabilities that dense targets put weight on.
    """
    logits = logits.float()
    if not targets.is_floating_point():
        return F.cross_entropy(logits, targets.long(), reduction=reduction)
    if targets.shape != logits.shape:
        raise ValueError(f"dense targets of shape {tuple(targets.shape)} do not match logits {tuple(logits.shape)}")
    per_example = -(targets.float() * F.log_softmax(logits, dim=-1)).sum(dim=-1)
    if reduction == "mean":
        return per_example.mean()
    if reduction == "sum":
        return per_example.sum()
    if reduction == "none":
        return per_example
    raise ValueError(f"reduction {reduction!r} must be 'mean', 'sum' or 'none'")
