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


def _cut(tensor: torch.Tensor, length: int, truncate: bool, ends: torch.Tensor | None) -> torch.Tensor:
    if truncate:
        if ends is None:
            return tensor[:, :length]
        ends = ends.clamp(max=tensor.shape[1] - 1)
        cut = tensor[:, :length].clone()  # a copy: the caller's batch is left as it was
        rows = torch.nonzero(ends >= length).flatten()  # rows whose last token was cut off
        cut[rows, length - 1] = tensor[rows, ends[rows]]
        return cut
    batch, full = tensor.shape[:2]
    keep = full // length * length
    return tensor[:, :keep].reshape(batch * (keep // length), length, *tensor.shape[2:])


def _row_ends(batch: Any) -> torch.Tensor | None:
    """Each row's last token position from a dict batch's ``attention_mask`` (its last nonzero
    entry; -1 for an all-padding row), or None: then every row ends at its last position."""
    mask = batch.get("attention_mask") if isinstance(batch, dict) else None
    if not isinstance(mask, torch.Tensor):
        return None
    if mask.dim() != 2:
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}; preserve_end_of_sequence needs "
                         "(batch, sequence)")
    present = mask != 0
    last = mask.shape[1] - 1 - present.flip(1).int().argmax(1)
    return torch.where(present.any(1), last, torch.full_like(last, -1))


def _set_length(batch: Any, length: int, truncate: bool, preserve: bool, ends: torch.Tensor | None) -> Any:
    if isinstance(batch, torch.Tensor):
        if batch.shape[1] <= length:
            return batch
        if preserve and ends is None:
            ends = torch.full((batch.shape[0],), batch.shape[1] - 1, device=batch.device)
        return _cut(batch, length, truncate, ends.to(batch.device) if preserve else None)
    if isinstance(batch, dict):
        return {k: _set_length(v, length, truncate, preserve, ends) if isinstance(v, torch.Tensor) else v
                for k, v in batch.items()}
    return type(batch)(_set_length(t, length, truncate, preserve, ends) for t in batch)


def set_batch_sequence_length(batch: Any, curr_seq_len: int, truncate: bool = True,
                              preserve_end_of_sequence: bool = False) -> Any:
    """Cut a batch of ``(B, T)`` token tensors -- one tensor, or a tuple/list of them (inputs and
    targets) -- to sequences of ``curr_seq_len``; ``T <= curr_seq_len`` leaves it unchanged.

    Composer's name and arguments (its batches are HuggingFace dicts, which also work here:
    every tensor value is cut). ``truncate=False`` reshapes rows instead of dropping their ends.

    ``preserve_end_of_sequence=True`` (with ``truncate``, ignored otherwise, as in Composer): a
    row whose last token is cut off gets that token in its new last position, so an
    end-of-sequence token survives: ``[10, 11, 12, 13, 14, 15]`` cut to 3 is ``[10, 11, 15]``.
    Every tensor of the batch gets the same treatment (labels keep their last label). A dict
    batch's ``attention_mask`` says where each row ends (its last nonzero entry; rows that end
    within the new length are only cut, all-padding rows too). Without a mask, which Composer
    requires, every row ends at its last position.
    """
    if curr_seq_len < 1:
        raise ValueError(f"curr_seq_len {curr_seq_len} must be >= 1")
    preserve = bool(preserve_end_of_sequence and truncate)
    return _set_length(batch, curr_seq_len, truncate, preserve, _row_ends(batch) if preserve else None)


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
