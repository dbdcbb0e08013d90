"""SelectiveBackprop (Jiang et al. 2019): spend the backward pass on the examples the model gets
most wrong.

On selected steps a gradient-free forward scores every example of the batch by its loss
(optionally on downscaled images, ``scale_factor``); ``keep`` of them are sampled, higher losses
more likely (probability ~ loss-rank percentile ``^ (1 / keep - 1)``, Composer's rule), and the
step trains on those only. Sampling uses torch's RNG, which the checkpoint holds, so resumed
runs pick the same examples. Selection runs between ``start`` and ``end`` (fractions of
training), every ``interval`` batches.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event
from algorithms.targets import IGNORE_INDEX, is_index_target


def per_example_loss(outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    """Cross-entropy per example (mean over tokens for sequence outputs ``(N, T, V)``, over the
    tokens whose target is not ``IGNORE_INDEX``); class indices or dense target rows."""
    if is_index_target(targets):
        loss = F.cross_entropy(outputs.movedim(-1, 1).float(), targets.long(), reduction="none")  # ignored: 0
        kept = targets != IGNORE_INDEX
    else:
        loss = -(targets * F.log_softmax(outputs.float(), dim=-1)).sum(-1)
        kept = targets.sum(-1) > 0  # a row of zeros is an ignored token's (smooth_labels)
    if loss.dim() > 1:
        loss = loss.flatten(1).sum(1) / kept.flatten(1).sum(1).clamp_min(1)
    return loss if reduction == "none" else loss.mean()


def should_select(progress: float, batch: int, start: float, end: float, interval: int) -> bool:
    """Whether this batch is trained on a selection: ``start <= progress < end`` and every ``interval`` batches."""
    return start <= progress < end and batch % interval == 0


def should_selective_backprop(current_duration: float, batch_idx: int, start: float = 0.5, end: float = 0.9,
                              interrupt: int = 2) -> bool:
    """Composer's schedule, by its name and parameters: select while ``start <= current_duration <
    end``, except that every ``interrupt``-th batch (``(batch_idx + 1) % interrupt == 0``) is a
    plain step; ``interrupt=0`` selects on every batch of the window.

    Composer passes the batch index within the epoch. The SelectiveBackprop algorithm keeps its own
    ``should_select`` above: its ``interval`` counts the other way (every ``interval``-th batch *is*
    selected, counted over the whole run), so only interval 1 (interrupt 0) and 2 (interrupt 2,
    within an epoch of even length) pick the same batches; existing specs and resumed runs rely on it.
    """
    if not interrupt >= 0:
        raise ValueError(f"interrupt {interrupt!r} must be >= 0 (0: select on every batch of the window)")
    in_window = start <= current_duration < end
    return in_window and (interrupt == 0 or (batch_idx + 1) % interrupt != 0)


def select_using_loss(input: torch.Tensor, target: torch.Tensor, model: torch.nn.Module,
                      loss_fun: Callable[..., torch.Tensor], keep: float = 0.5, scale_factor: float = 1
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``int(keep * N)`` examples of ``(input, target)`` sampled by loss rank (Composer's name,
    signature and rule). ``loss_fun(outputs, target, reduction="none")`` gives per-example losses;
    ``scale_factor < 1`` scores on images downscaled by that factor (4-d inputs)."""
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep {keep} must lie in (0, 1]")
    if not 0.0 < scale_factor <= 1.0:
        raise ValueError(f"scale_factor {scale_factor} must lie in (0, 1]")
    n = input.shape[0]
    n_select = max(1, int(keep * n))
    with torch.no_grad():
        scored = input
        if scale_factor != 1:
            if input.dim() != 4:
                raise ValueError(f"scale_factor {scale_factor} needs image batches (N, C, H, W), got {tuple(input.shape)}")
            scored = F.interpolate(input, scale_factor=scale_factor, mode="bilinear", align_corners=False)
        losses = loss_fun(model(scored), target, reduction="none")
        by_loss = torch.argsort(losses)  # lowest first: rank i has percentile (i + 0.5) / n
        percentiles = (torch.arange(n, dtype=torch.float64) + 0.5) / n
        weights = percentiles ** (1.0 / keep - 1.0)
        chosen = torch.multinomial(weights, n_select, replacement=False)
        index = by_loss[chosen.to(by_loss.device)]
    return input[index], target[index]


class SelectiveBackprop(Algorithm):
    """Replaces the batch by its selection at AFTER_DATALOADER, on the scheduled batches."""

    name = "selective_backprop"
    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(self, start: float = 0.5, end: float = 0.9, keep: float = 0.5, scale_factor: float = 1.0,
                 interval: int = 2):
        if not 0.0 <= start < end <= 1.0:
            raise ValueError(f"start {start} and end {end} must satisfy 0 <= start < end <= 1")
        if not 0.0 < keep <= 1.0 or not 0.0 < scale_factor <= 1.0 or interval < 1:
            raise ValueError(f"keep {keep} and scale_factor {scale_factor} must lie in (0, 1]; interval {interval} >= 1")
        self.start, self.end, self.keep = start, end, keep
        self.scale_factor, self.interval = scale_factor, interval

    def apply(self, event: Event, state: AlgorithmState) -> None:
        if not should_select(state.progress, state.timestamp.batch, self.start, self.end, self.interval):
            return
        state.inputs, state.targets = select_using_loss(state.inputs, state.targets, state.model, per_example_loss,
                                                        self.keep, self.scale_factor)
