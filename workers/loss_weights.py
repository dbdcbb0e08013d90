"""How much each microbatch's and each rank's mean loss weighs in a batch's gradient.

A batch's loss is a mean over what it counts: its items, or for text its kept tokens (targets
other than ``IGNORE_INDEX``, -100). A batch split into microbatches (``microbatch_size``), and a
global batch split over ranks (DDP and FSDP average the ranks' gradients), give the whole
batch's gradient only when each part's mean loss is weighted by its share of that count:

- **items** (images, classification): a microbatch's share is its share of the items, and every
  rank holds as many items (the sampler pads the last batch), so the ranks weigh the same;
- **kept tokens** (text): padding makes the shares uneven, so a microbatch's share is its kept
  tokens over its rank's, and a rank's weight is its kept tokens over the ranks' mean, summed
  with one all-reduce of one number a step. Without padding, every share is the same as by
  items.

The weights stay tensors (no host sync a step); a whole batch on one rank takes none at all.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from algorithms.targets import IGNORE_INDEX


def kept_tokens(targets: torch.Tensor) -> torch.Tensor:
    """How many positions of ``targets`` count: index targets other than ``IGNORE_INDEX``, or
    dense rows that are not all zeros (an ignored position after label smoothing)."""
    if targets.is_floating_point():
        return (targets.sum(dim=-1) > 0).sum()
    return (targets != IGNORE_INDEX).sum()


def microbatch_shares(targets: torch.Tensor, bounds: list[tuple[int, int]], *,
                      by_tokens: bool) -> list[float | torch.Tensor]:
    """Each microbatch's share of this rank's batch (``targets[start:end]`` for each of
    ``bounds``): of its items, or ``by_tokens`` of its kept tokens. The shares sum to 1 (0 for
    every one of a batch with no kept token, whose loss is 0)."""
    batch_size = targets.shape[0]
    if len(bounds) == 1 or not by_tokens:
        return [(end - start) / batch_size for start, end in bounds]
    counts = [kept_tokens(targets[start:end]) for start, end in bounds]
    total = torch.stack(counts).sum().clamp_min(1)
    return [count / total for count in counts]


def rank_weight(targets: torch.Tensor, *, world_size: int) -> torch.Tensor | None:
    """This rank's mean loss's weight, by kept tokens, in the gradient the ranks average: its
    kept tokens over the ranks' mean (one all-reduce: every rank calls it for its part of the
    same batch). None on one rank: no weight. By items no rank needs one (see above)."""
    if world_size == 1:
        return None
    kept = kept_tokens(targets).to(torch.float32)
    everyone = kept.clone()
    dist.all_reduce(everyone)  # a sum over the ranks
    return kept * world_size / everyone.clamp_min(1)
