"""MixUp: train on convex combinations of pairs of examples and of their targets.

One mixing weight is drawn per batch from ``Beta(alpha, alpha)`` and folded to ``[0, 0.5]``
(``min(z, 1 - z)``, as Composer does), so the original example always dominates. The permuted
copy comes from one permutation of the batch. All tensor work happens on the input's device.
"""

from __future__ import annotations

import torch

from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event
from algorithms.targets import to_dense_targets


def mixup_batch(input: torch.Tensor, target: torch.Tensor, mixing: float | None = None, alpha: float = 0.2,
                indices: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Mix every example with another example of the batch: ``(1 - mixing) * x + mixing * x[indices]``.

    Composer 0.32's signature and return value.

    Args:
        input: a batch ``(N, ...)``.
        target: class indices ``(N,)`` or dense targets ``(N, ...)``; only permuted here.
        mixing: the weight of the permuted copy, in ``[0, 1]``; drawn as ``min(z, 1 - z)``,
            ``z ~ Beta(alpha, alpha)`` when ``None``.
        alpha: the Beta concentration, >= 0 (0: no mixing); ignored when ``mixing`` is given.
        indices: the permutation giving, for each example, the example mixed into it.

    Returns:
        ``(mixed_input, permuted_target, mixing)`` with ``permuted_target = target[indices]``;
        ``mixup_targets`` turns them into dense targets.
    """
    if mixing is None:
        mixing = sample_mixing(alpha)
    elif not 0.0 <= mixing <= 1.0:
        raise ValueError(f"mixing {mixing} must lie in [0, 1]")
    if indices is None:
        indices = torch.randperm(input.shape[0], device=input.device)
    # lerp: one fused kernel for x + mixing * (x[indices] - x).
    mixed = torch.lerp(input, input[indices], float(mixing))
    return mixed, target[indices], mixing


def mixup_targets(target: torch.Tensor, permuted_target: torch.Tensor, mixing: float,
                  num_classes: int) -> torch.Tensor:
    """Dense targets ``(1 - mixing) * target + mixing * permuted_target`` (indices one-hot first)."""
    return torch.lerp(to_dense_targets(target, num_classes), to_dense_targets(permuted_target, num_classes),
                      float(mixing))


def sample_mixing(alpha: float) -> float:
    """``min(z, 1 - z)`` with ``z ~ Beta(alpha, alpha)``, from torch's global CPU generator
    (``torch.manual_seed`` reproduces it; no device sync). ``alpha = 0`` gives 0 (no mixing),
    as in Composer, where Beta(0, 0) is read as its limit."""
    if alpha < 0:
        raise ValueError(f"alpha {alpha} must be >= 0")
    if alpha == 0:
        return 0.0
    a = torch._standard_gamma(torch.tensor([float(alpha), float(alpha)], dtype=torch.float64))
    z = float(a[0] / a.sum())
    return min(z, 1.0 - z)


class MixUp(Algorithm):
    """Mixes each training batch at AFTER_DATALOADER and replaces the targets with the dense mixed
    targets for the whole step, so CutMix and LabelSmoothing (which take dense targets) compose."""

    name = "mixup"
    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(self, alpha: float = 0.2):
        if alpha <= 0:
            raise ValueError(f"alpha {alpha} must be > 0")
        self.alpha = alpha

    def apply(self, event: Event, state: AlgorithmState) -> None:
        mixed, permuted, mixing = mixup_batch(state.inputs, state.targets, alpha=self.alpha)
        state.inputs = mixed
        state.targets = mixup_targets(state.targets, permuted, mixing, state.num_classes)
