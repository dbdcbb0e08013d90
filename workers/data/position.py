"""What every training and evaluation loader shares: where it is in the epoch, the per-sample
transforms algorithms install, and handing a batch to the device.

The trainer, not the loader, decides when an epoch begins (``set_epoch``). A batch counts as
consumed when it is handed out, so a loop that stops early (``islice``) leaves the position
exactly after the last batch it trained on; ``state_dict`` is that position, in global batches.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterator

import torch


def rank_batch_size(batch_size: int, world_size: int) -> int:
    """Each rank's share of a global batch; ValueError unless ``world_size`` divides it. Every
    loader checks this first, before it reads or builds anything."""
    if batch_size % world_size:
        raise ValueError(f"batch_size {batch_size} must be divisible by world_size {world_size}")
    return batch_size // world_size


class BatchPosition:
    """Mixin: subclasses set ``device`` and implement ``__len__`` (batches per epoch) and
    ``__iter__``, which yields ``self.hand_out(images, labels)`` for each batch."""

    device: torch.device

    def __init__(self) -> None:
        self.epoch = 0
        self.batch_in_epoch = 0  # batches already handed out in the current epoch
        # Per-sample transforms (torchvision-style callables on one (C, H, W) image), applied in
        # order on the host before the batch moves to the device. Empty: batches pass as they are.
        self.sample_transforms: list[Callable[[torch.Tensor], torch.Tensor]] = []

    def __len__(self) -> int:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch."""
        self.epoch, self.batch_in_epoch = epoch, 0

    @property
    def exhausted(self) -> bool:
        """True once every batch of the current epoch has been handed out."""
        return self.batch_in_epoch >= len(self)

    def fresh_epoch(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """A separate pass over this rank's batches of the current epoch, from its first batch,
        as training sees them (sample transforms included), leaving this loader's position
        untouched: a shallow copy counts the batches it hands out (SWA's BatchNorm pass)."""
        other = copy.copy(self)
        other.set_epoch(self.epoch)
        return iter(other)

    def hand_out(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Count the batch as consumed, apply the sample transforms and move it to the device."""
        self.batch_in_epoch += 1
        if self.sample_transforms:
            images = torch.stack([self._transform(image) for image in images])
        if self.device.type == "cpu":  # where every loader's batches are made: ``to`` would return them as they are
            return images, labels
        return images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)

    def _transform(self, image: torch.Tensor) -> torch.Tensor:
        for transform in self.sample_transforms:
            image = transform(image)
        return image

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
