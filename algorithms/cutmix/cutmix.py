"""CutMix: paste a box from a shuffled copy of the batch; mix the targets by area.

One box is drawn per batch (as in the paper's code and Composer): its kept area ``lambda`` is
drawn from ``Beta(alpha, alpha)``, its side lengths are ``sqrt(1 - lambda)`` of the image's, and
its centre is uniform over the image, so boxes near an edge are clipped. The target weight is
then recomputed from the clipped box ("area-adjusted lambda"), so the targets match the pixels
that were actually pasted. All tensor work happens on the input's device.
"""

from __future__ import annotations

import math

import torch

from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event
from algorithms.targets import to_dense_targets

BBox = tuple[int, int, int, int]


def cutmix_batch(input: torch.Tensor, target: torch.Tensor, length: float | None = None, alpha: float = 1.0,
                 bbox: BBox | None = None, indices: torch.Tensor | None = None,
                 uniform_sampling: bool = False) -> tuple[torch.Tensor, torch.Tensor, float, BBox]:
    """Fill one box of every image with the same box of another image in the batch.

    Composer 0.32's signature and return value.

    Args:
        input: images ``(N, C, H, W)``.
        target: class indices ``(N,)`` or dense targets ``(N, num_classes)``.
        length: if given, the box's sides are ``int(length * H)`` and ``int(length * W)``
            (Composer's documented meaning; its code instead draws a box of side
            ``sqrt(1 - length**2)``, which we don't reproduce). In [0, 1]; 0 mixes nothing.
            Excludes ``bbox``.
        alpha: ``Beta(alpha, alpha)`` concentration of the kept area, >= 0 (0: Composer's
            limit, a full-size box around the random centre); ignored with ``length`` or ``bbox``.
        bbox: a fixed box ``(x1, y1, x2, y2)``; as in Composer, ``x`` indexes rows (dim -2)
            and ``y`` columns (dim -1), and the box is ``input[..., x1:x2, y1:y2]``.
        indices: the permutation giving, for each example, the example pasted into it.
        uniform_sampling: draw the centre so every pixel is equally likely to be cut, instead
            of uniformly over the image (which under-cuts the borders).

    Returns:
        ``(mixed_input, permuted_target, area, bbox)``: ``permuted_target = target[indices]``,
        ``area`` the fraction of each image left unmixed (the weight of the original target),
        and the box actually used. ``mix_targets`` turns these into dense targets.
    """
    if bbox is not None and length is not None:
        raise ValueError(f"give length or bbox, not both; got length={length} and bbox={bbox}")
    if input.dim() != 4:
        raise ValueError(f"cutmix_batch needs images of shape (N, C, H, W); got shape {tuple(input.shape)}")
    height, width = input.shape[-2:]
    if indices is None:
        indices = torch.randperm(input.shape[0], device=input.device)
    if bbox is None:
        if length is not None:
            if not 0.0 <= length <= 1.0:
                raise ValueError(f"length {length} must lie in [0, 1]")
            cut_h, cut_w = int(length * height), int(length * width)
        else:
            cut_ratio = math.sqrt(1.0 - _sample_kept_fraction(alpha))
            cut_h, cut_w = int(height * cut_ratio), int(width * cut_ratio)
        bbox = _box_at_random_centre(height, width, cut_h, cut_w, uniform_sampling)
    x1, y1, x2, y2 = bbox
    mixed = input.clone()  # keeps the memory format (channels_last stays channels_last)
    mixed[:, :, x1:x2, y1:y2] = input[indices, :, x1:x2, y1:y2]
    area = 1.0 - (x2 - x1) * (y2 - y1) / (height * width)
    return mixed, target[indices], area, bbox


def mix_targets(target: torch.Tensor, permuted_target: torch.Tensor, area: float,
                num_classes: int) -> torch.Tensor:
    """Dense targets ``area * target + (1 - area) * permuted_target`` (indices one-hot first)."""
    return (area * to_dense_targets(target, num_classes)
            + (1.0 - area) * to_dense_targets(permuted_target, num_classes))


def _sample_kept_fraction(alpha: float) -> float:
    # Host-side scalar from torch's global CPU generator, so torch.manual_seed reproduces it
    # and no device sync is needed. Beta(a, a) as g1 / (g1 + g2) of two Gamma(a) draws: one
    # kernel, where torch.distributions.Beta costs ~0.15 ms of Python per batch.
    # alpha = 0 is Composer's limit case: nothing kept, the box is the whole image (clipped
    # around its random centre).
    if alpha < 0:
        raise ValueError(f"alpha {alpha} must be >= 0")
    if alpha == 0:
        return 0.0
    gammas = torch._standard_gamma(torch.full((2,), float(alpha), dtype=torch.float64))
    return float(gammas[0] / gammas.sum())


def _random_int(low: int, high: int) -> int:
    return int(torch.randint(low, high, (1,)))


def _box_at_random_centre(height: int, width: int, cut_h: int, cut_w: int, uniform_sampling: bool) -> BBox:
    if uniform_sampling:
        # Let the centre fall up to half a box outside the image: every pixel is then covered
        # by the same number of centre positions.
        cx = _random_int(-(cut_h // 2), height + cut_h // 2)
        cy = _random_int(-(cut_w // 2), width + cut_w // 2)
    else:
        cx, cy = _random_int(0, height), _random_int(0, width)
    x1, x2 = max(cx - cut_h // 2, 0), min(cx + cut_h // 2, height)
    y1, y2 = max(cy - cut_w // 2, 0), min(cy + cut_w // 2, width)
    # An empty box (clipped away, or alpha near 0) still yields a valid, unmixed batch.
    return x1, y1, max(x1, x2), max(y1, y2)


class CutMix(Algorithm):
    """Mixes each training batch at AFTER_DATALOADER and replaces the targets with dense,
    area-weighted targets, so any loss (or LabelSmoothing after it) sees the mixed labels."""

    name = "cutmix"
    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(self, alpha: float = 1.0, uniform_sampling: bool = False):
        if alpha <= 0:
            raise ValueError(f"alpha {alpha} must be > 0")
        self.alpha = alpha
        self.uniform_sampling = uniform_sampling

    def apply(self, event: Event, state: AlgorithmState) -> None:
        mixed, permuted, area, _ = cutmix_batch(state.inputs, state.targets, alpha=self.alpha,
                                               uniform_sampling=self.uniform_sampling)
        state.inputs = mixed
        state.targets = mix_targets(state.targets, permuted, area, state.num_classes)
