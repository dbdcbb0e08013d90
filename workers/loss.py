"""Soft cross-entropy: one loss for class-index targets and dense (probability) targets.

CutMix and label smoothing turn index targets into distributions; the loss must accept both,
and must give the same value for index targets and their one-hot rows. Language models give
logits ``(B, T, V)`` for targets ``(B, T)``: every position counts as one example (token).

``eval_sums``/``eval_metrics`` are the evaluation side: per-example (or per-token) sums that
ranks all-reduce, then the reported metrics, with perplexity for text.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from algorithms.targets import IGNORE_INDEX


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of ``logits`` (N, C) against indices (N,) or distributions (N, C).

    Sequence logits (B, T, C) with targets (B, T) or (B, T, C) are flattened to B*T rows; their
    mean is over the tokens whose target is not ``IGNORE_INDEX`` (-100; dense: a row of zeros).
    Computed in float32 even under autocast: log-softmax in bf16/fp16 loses the small
    probabilities that dense targets put weight on.
    """
    if logits.dtype is torch.float32 and logits.ndim == 2 and targets.dtype is torch.int64:
        # The training step's usual case: attribute reads instead of four tensor method calls.
        return F.cross_entropy(logits, targets, reduction=reduction)
    logits = logits.float()
    sequence = logits.dim() > 2
    if sequence:
        logits = logits.reshape(-1, logits.shape[-1])
        targets = targets.reshape(-1, logits.shape[-1]) if targets.is_floating_point() else targets.reshape(-1)
    if not targets.is_floating_point():
        if sequence and reduction == "mean":  # over the kept tokens; 0, not NaN, when none is kept
            kept = (targets != IGNORE_INDEX).sum().clamp_min(1)
            return F.cross_entropy(logits, targets.long(), reduction="sum") / kept
        return F.cross_entropy(logits, targets.long(), reduction=reduction)
    if targets.shape != logits.shape:
        raise ValueError(f"dense targets of shape {tuple(targets.shape)} do not match logits {tuple(logits.shape)}")
    per_example = -(targets.float() * F.log_softmax(logits, dim=-1)).sum(dim=-1)
    if reduction == "mean":
        if sequence:  # a row of zeros is an ignored token's (smooth_labels): not counted
            return per_example.sum() / (targets.sum(dim=-1) > 0).sum().clamp_min(1)
        return per_example.mean()
    if reduction == "sum":
        return per_example.sum()
    if reduction == "none":
        return per_example
    raise ValueError(f"reduction {reduction!r} must be 'mean', 'sum' or 'none'")


def eval_sums(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[loss sum, correct, count]`` (float64) of one eval batch of index targets; for sequences
    every token is one example (next-token accuracy). A target of ``IGNORE_INDEX`` counts for
    nothing (cross-entropy leaves it out, and no prediction equals it)."""
    loss_sum = soft_cross_entropy(outputs, targets, reduction="sum")
    correct = (outputs.argmax(dim=-1) == targets).sum()
    count = (targets != IGNORE_INDEX).sum()
    return torch.stack([loss_sum.double(), correct.double(), count.double()])


def eval_metrics(loss_sum: float, correct: float, count: float, *, domain: str) -> dict[str, float]:
    """``eval/loss`` and ``eval/accuracy``; for text also ``eval/perplexity`` (exp of the per-token loss)."""
    results = {"eval/loss": loss_sum / count, "eval/accuracy": correct / count}
    if domain == "text":
        results["eval/perplexity"] = math.exp(min(results["eval/loss"], 700.0))  # exp overflows past ~709
    return results
