"""Microbatches and the out-of-memory retry of ``microbatch_size: auto``.

A batch is split into microbatches of ``size`` samples whose gradients add up to the full
batch's. With ``auto`` the first try uses the full batch; an out-of-memory error (CUDA) halves
the size and the batch is tried again, down to one sample. On several ranks every rank must
retry together, or their collectives would no longer match: an ``OomAgreement`` has all ranks
agree once per batch whether any of them ran out of memory.
"""

from __future__ import annotations

import logging
from typing import Callable, Literal

import torch

from workers.parallel import OomAgreement, is_fsdp, reset_after_failed_step
from workers.state import State

log = logging.getLogger(__name__)


class Microbatches:
    """The current microbatch size and the retry state of ``auto``. ``size`` None: the whole
    batch. Its ``state_dict`` is the size ``auto`` settled on, so a resumed run keeps it."""

    def __init__(self, setting: int | Literal["auto"] | None, *, model: torch.nn.Module, device: torch.device,
                 world_size: int):
        """``model``: the wrapped model (DDP/FSDP), whose collectives the agreement guards."""
        self.auto = setting == "auto"
        self.size: int | None = setting if isinstance(setting, int) else None
        self.device = device
        self.agreement = OomAgreement(model, device) if self.auto and world_size > 1 else None
        # Under DDP the gradient all-reduce waits until all ranks agree that the batch fit (FSDP
        # has sync points before its reduce-scatters instead): the caller averages gradients
        # itself after ``attempt`` when this is set, and skips DDP's sync in the meantime.
        self.defer_gradient_sync = self.agreement is not None and not is_fsdp(model)

    def bounds(self, batch_size: int) -> list[tuple[int, int]]:
        """``[(start, end), ...]`` of each microbatch of a batch of ``batch_size``."""
        size = self.size
        # "auto" starts with the full batch and halves on an out-of-memory error (CUDA); on CPU
        # memory is not the limit, so it stays the full batch.
        if size is None or size >= batch_size:
            return [(0, batch_size)]
        return [(start, min(start + size, batch_size)) for start in range(0, batch_size, size)]

    def attempt(self, step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], inputs: torch.Tensor,
                targets: torch.Tensor) -> torch.Tensor | None:
        """``step(inputs, targets)`` (forward and backward; returns the batch's loss), or None when
        ``auto`` and this rank or (on several ranks) any rank ran out of memory. Every rank gets
        the same answer, so all retry the batch together and their collectives stay matched."""
        agreement = self.agreement
        loss = None
        try:
            if agreement is None:  # one rank, or a fixed size: nothing to agree on
                loss = step(inputs, targets)
            else:
                with agreement.attempt():
                    loss = step(inputs, targets)
        except torch.OutOfMemoryError:
            if not self.auto:
                raise
        if agreement is not None and agreement.agree(loss is None):  # one small all-reduce per batch
            loss = None
        return loss

    def halve(self, batch_size: int, state: State) -> bool:
        """After an out-of-memory error: microbatches half the size, and the failed try's
        gradients, outputs and FSDP state cleared. False when already at 1 (the error stands)."""
        current = self.size or batch_size
        if current <= 1:
            return False
        self.size = current // 2
        state.optimizer.zero_grad(set_to_none=True)
        state.outputs = state.loss = None
        reset_after_failed_step(state.model)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        log.warning("out of memory with microbatches of %d; retrying the batch with %d", current, self.size)
        return True

    def state_dict(self) -> int | None:
        return self.size

    def load_state_dict(self, size: int | None) -> None:
        """Keep a size ``auto`` settled on before; a fixed size comes from the spec."""
        if isinstance(size, int) and self.auto:
            self.size = size
