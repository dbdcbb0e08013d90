"""The one collective algorithms need: averaging tensors over ranks.

Here rather than in ``workers.parallel`` because algorithms cannot import ``workers`` (SWA
averages its recomputed BatchNorm statistics); ``workers.parallel.average_buffers`` uses it too,
so there is one implementation of the rule.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist


def average_across_ranks(tensors: Iterable[torch.Tensor]) -> None:
    """Average each of ``tensors`` over the ranks of the default process group, in place: a
    collective, so every rank must call it with the same tensors in the same order. Nothing
    happens without a process group or with one rank (the tensors are not even iterated)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    world_size = dist.get_world_size()
    if world_size == 1:
        return
    for tensor in tensors:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor.div_(world_size)
