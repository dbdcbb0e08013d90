"""SeqLengthWarmup (Li et al. 2022): start language-model training on short sequences and grow
them linearly to full length over the first ``duration`` of training.

Short sequences make early steps cheap (attention is quadratic in length) and stabilize
training at large batch sizes and learning rates. Each batch of token rows ``(B, T)`` is cut
to the current length at ``AFTER_DATALOADER``: ``truncate`` keeps the first ``L`` tokens of
every row; otherwise rows are reshaped into ``(B * T // L, L)`` so no token is wasted. The
length is a function of the batch count alone (as in Composer), so a resumed run continues
the schedule exactly without algorithm state.
"""

from __future__ import annotations

from typing import Any

import torch

from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event


def _cut(tensor: torch.Tensor, length: int, truncate: bool) -> torch.Tensor:
    if truncate:
        return tensor[:, :length]
    batch, full = tensor.shape[:2]
    keep = full // length * length
    return tensor[:, :keep].reshape(batch * (keep // length), length, *tensor.shape[2:])


def set_batch_sequence_length(batch: Any, curr_seq_len: int, truncate: bool = True) -> Any:
    """Cut a batch of ``(B, T)`` token tensors -- one tensor, or a tuple/list of them (inputs and
    targets) -- to sequences of ``curr_seq_len``; ``T <= curr_seq_len`` leaves it unchanged.

    Composer's name and arguments (its batches are HuggingFace dicts, which also work here:
    every tensor value is cut). ``truncate=False`` reshapes rows instead of dropping their ends.
    """
    if curr_seq_len < 1:
        raise ValueError(f"curr_seq_len {curr_seq_len} must be >= 1")
    if isinstance(batch, torch.Tensor):
        return batch if batch.shape[1] <= curr_seq_len else _cut(batch, curr_seq_len, truncate)
    if isinstance(batch, dict):
        return {k: set_batch_sequence_length(v, curr_seq_len, truncate) if isinstance(v, torch.Tensor) else v
                for k, v in batch.items()}
    return type(batch)(set_batch_sequence_length(t, curr_seq_len, truncate) for t in batch)


def current_sequence_length(batch: int, max_batches: int, duration: float, min_seq_length: int,
                            max_seq_length: int, step_size: int) -> int:
    """Composer's schedule: from ``min_seq_length`` up by ``step_size`` at equal intervals,
    reaching ``max_seq_length`` after ``duration`` of ``max_batches``."""
    warmup_batches = int(max_batches * duration)
    updates = max(1, (max_seq_length - min_seq_length) // step_size)
    every = max(1, warmup_batches // updates)
    return min(max(step_size * (batch // every) + min_seq_length, min_seq_length), max_seq_length)


class SeqLengthWarmup(Algorithm):
    """Cuts every batch to the scheduled sequence length at AFTER_DATALOADER."""

    name = "seq_length_warmup"
    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(self, duration: float = 0.3, min_seq_length: int = 8, max_seq_length: int = 1024,
                 step_size: int = 8, truncate: bool = True):
        if not 0.0 < duration <= 1.0:
            raise ValueError(f"duration {duration} must lie in (0, 1]")
        if not 1 <= min_seq_length <= max_seq_length:
            raise ValueError(f"min_seq_length {min_seq_length} must be >= 1 and <= max_seq_length {max_seq_length}")
        if step_size < 1:
            raise ValueError(f"step_size {step_size} must be >= 1")
        self.duration, self.min_seq_length, self.max_seq_length = duration, min_seq_length, max_seq_length
        self.step_size, self.truncate = step_size, truncate

    def apply(self, event: Event, state: AlgorithmState) -> None:
        length = current_sequence_length(state.timestamp.batch, state.max_batches, self.duration,
                                         self.min_seq_length, self.max_seq_length, self.step_size)
        state.inputs, state.targets = set_batch_sequence_length((state.inputs, state.targets), length, self.truncate)
