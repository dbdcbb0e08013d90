"""The trainer's one way to get its data: ``build_train_loader`` and ``build_eval_loader``.

A train loader yields ``(inputs, targets)`` batches already on ``device``, this rank's share of
each global batch, and implements the protocol the trainer relies on: ``len()`` (batches per
epoch), ``set_epoch(epoch)``, ``exhausted``, ``sample_transforms`` (a list the loader applies
per sample) and ``state_dict()`` / ``load_state_dict(state)``, its position, which checkpoints
save as the loader gives it (a richer state, e.g. a streaming reader's, resumes exactly).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from workers.data import build_dataset, num_classes_of
from workers.data.loader import TensorLoader


class TrainData(NamedTuple):
    """A train loader and what the model is built for: classes and input channels."""

    loader: TensorLoader
    num_classes: int
    in_channels: int


def build_train_loader(spec: Any, *, rank: int, world_size: int, device: torch.device) -> TrainData:
    """This rank's train loader for ``spec`` (an ``api.specs.RunSpec``). In-memory data sets:
    every rank loads the whole (small) data set and takes its shard of each global batch; the
    position saved is in global batches, so it resumes onto any world size."""
    images, labels = build_dataset(spec.data.train)
    loader = TensorLoader(images, labels, batch_size=spec.data.batch_size, rank=rank, world_size=world_size,
                          drop_last=spec.data.drop_last, seed=spec.seed, device=device)
    return TrainData(loader, num_classes_of(spec.data.train), images.shape[1])


def build_eval_loader(spec: Any, *, rank: int, world_size: int, device: torch.device) -> TensorLoader | None:
    """This rank's share of ``spec.data.eval``, or None without one. No padding and no
    shuffling: each example is evaluated exactly once across ranks."""
    if spec.data.eval is None:
        return None
    images, labels = build_dataset(spec.data.eval)
    global_batch = spec.data.eval_batch_size or spec.data.batch_size
    per_rank = -(-global_batch // world_size)
    return TensorLoader(images, labels, batch_size=per_rank * world_size, rank=rank, world_size=world_size,
                        shuffle=False, drop_last=False, pad=False, device=device)
