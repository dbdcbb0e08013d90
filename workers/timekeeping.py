"""Training time: converting ``Time`` values to batches, and the ``Timestamp`` of the loop.

``api.time.Time`` parses ``"3ep"``, ``"100ba"``, ``"2048sp"``, ``"0.1dur"``; converting between
units needs the length of an epoch and the global batch size, which only the trainer knows.
Everything in the loop counts in optimizer steps (global batches): ``max_duration``, warmup and
eval interval are converted once, up front, with ``to_batches``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from api.time import Time, TimeUnit

__all__ = ["Time", "TimeUnit", "Timestamp", "to_batches"]


def to_batches(time: Time | str, *, batches_per_epoch: int, samples_per_batch: int,
               max_batches: int | None = None, tokens_per_batch: int | None = None) -> int:
    """The number of global batches ``time`` lasts.

    ``samples_per_batch`` is the global batch size. Samples and tokens round up (a partial batch
    still takes a step); ``dur`` fractions of ``max_batches`` round to the nearest batch.
    """
    time = Time.parse(time)
    unit = time.unit
    if unit is TimeUnit.EPOCH:
        return int(time.value) * batches_per_epoch
    if unit is TimeUnit.BATCH:
        return int(time.value)
    if unit is TimeUnit.SAMPLE:
        return math.ceil(time.value / samples_per_batch)
    if unit is TimeUnit.TOKEN:
        if not tokens_per_batch:
            raise ValueError(f"{time} is in tokens, but this data set has no tokens; use ep, ba or sp")
        return math.ceil(time.value / tokens_per_batch)
    if max_batches is None:
        raise ValueError(f"{time} is a fraction of max_duration, which is not known here; "
                         "max_duration itself must use ep, ba, sp or tok")
    return round(time.value * max_batches)


@dataclass(frozen=True)
class Timestamp:
    """Where the loop is: completed epochs, batches (global, and within the current epoch),
    samples and tokens (global, summed over workers)."""

    epoch: int = 0
    batch: int = 0
    batch_in_epoch: int = 0
    sample: int = 0
    token: int = 0

    def after_batch(self, *, samples: int, tokens: int = 0) -> "Timestamp":
        """The timestamp once one more global batch of ``samples`` is done."""
        # The constructor, not dataclasses.replace: this runs every step and replace costs twice as much.
        return Timestamp(self.epoch, self.batch + 1, self.batch_in_epoch + 1, self.sample + samples,
                         self.token + tokens)

    def after_epoch(self) -> "Timestamp":
        """The timestamp once the current epoch is done."""
        return replace(self, epoch=self.epoch + 1, batch_in_epoch=0)

    def where(self) -> str:
        """Where the loop is, for a log line, epochs counted from 1: ``in epoch 2, batch 30``
        during an epoch, ``at the end of epoch 1, batch 22`` between epochs."""
        if self.batch_in_epoch == 0 and self.epoch > 0:
            return f"at the end of epoch {self.epoch}, batch {self.batch}"
        return f"in epoch {self.epoch + 1}, batch {self.batch}"

    def progress(self, max_batches: int) -> float:
        """Fraction of training done, in [0, 1]. Counted in batches, so it moves every step
        whatever the unit of ``max_duration`` (an ``"Nep"`` duration does not make it jump at
        epoch boundaries only)."""
        return min(1.0, self.batch / max_batches) if max_batches > 0 else 1.0

    def get(self, unit: TimeUnit) -> int:
        """The count in ``unit`` (``ep``, ``ba``, ``sp`` or ``tok``)."""
        counts = {TimeUnit.EPOCH: self.epoch, TimeUnit.BATCH: self.batch,
                  TimeUnit.SAMPLE: self.sample, TimeUnit.TOKEN: self.token}
        if unit not in counts:
            raise ValueError(f"a timestamp has no '{unit.value}' count; use progress() for fractions")
        return counts[unit]
