"""Rank 0's training metrics on their way to the sink: per-step losses, flushing, throughput.

Hot-path rule: no host syncs per step. Each step's loss stays on the device as a detached
tensor; a flush (about once a second, before evaluation and at each epoch's end) converts all
pending losses together, one host sync, and reports them with the learning rate, throughput
and the time metrics. Every ``PROGRESS_LOG_S`` and at each epoch's end a flush also writes a
line to the run's log (``tessera logs``), and the trainer writes one as training ends: epoch,
batch, progress, the mean training loss since the last line and the throughput, so a run
without an evaluation set shows how it goes too.
"""

from __future__ import annotations

import logging
import time

import torch

from workers.reporter import MetricSink
from workers.timekeeping import Timestamp

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 1.0
PROGRESS_LOG_S = 30.0  # how often a progress line goes to the run's log, besides each epoch's end


class MetricBuffer:
    """Buffers rank 0's per-step losses and reports them to ``sink`` when flushed. On other
    ranks it buffers nothing (their sink is a ``NullSink``). ``latest`` holds the newest value
    of every metric reported, evaluation results included (``record``)."""

    def __init__(self, sink: MetricSink, *, rank: int, interval_s: float = FLUSH_INTERVAL_S,
                 progress_log_s: float = PROGRESS_LOG_S):
        self.sink, self.rank, self.interval_s, self.progress_log_s = sink, rank, interval_s, progress_log_s
        self.latest: dict[str, float] = {}
        self.pending: list[tuple[int, torch.Tensor, float]] = []  # (step, detached loss, lr)
        self._last_flush = time.monotonic()
        self._throughput_mark = (time.monotonic(), 0)  # (time, samples) training was measured from
        self._last_line = (time.monotonic(), 0.0, 0)  # the last progress line: (time, loss sum, steps) since

    def add_step(self, step: int, loss: torch.Tensor, lr: float) -> None:
        """One optimizer step's detached batch loss and learning rate (no host sync)."""
        if self.rank == 0:
            self.pending.append((step, loss, lr))

    def due(self) -> bool:
        """Whether ``interval_s`` has passed since the last flush."""
        return time.monotonic() - self._last_flush >= self.interval_s

    def record(self, step: int, key: str, value: float) -> None:
        self.latest[key] = value
        self.sink.add(step, key, value)

    def flush(self, timestamp: Timestamp, progress: float, *, epoch_end: bool = False) -> None:
        """Turn pending per-step losses into metric points (rank 0; one host sync), with
        throughput since the last mark and the time metrics at ``timestamp``."""
        self._last_flush = time.monotonic()
        if self.rank != 0 or not (self.pending or epoch_end):
            return
        pending, self.pending = self.pending, []
        losses = torch.stack([loss for _, loss, _ in pending]).tolist() if pending else []
        add = self.sink.add  # two points a step: straight to the sink, ``latest`` set once below
        for (step, _, lr), loss in zip(pending, losses):
            add(step, "train/loss", loss)
            add(step, "lr", lr)
        if pending:
            self.latest["train/loss"], self.latest["lr"] = losses[-1], pending[-1][2]
        line_at, loss_sum, steps = self._last_line
        self._last_line = (line_at, loss_sum + sum(losses), steps + len(losses))
        step = timestamp.batch
        start, start_sample = self._throughput_mark
        now = time.monotonic()
        if now > start and timestamp.sample > start_sample:
            self.record(step, "throughput/samples_per_sec", (timestamp.sample - start_sample) / (now - start))
        self._throughput_mark = (now, timestamp.sample)
        self.record(step, "time/epoch", timestamp.epoch)
        self.record(step, "time/batch", timestamp.batch)
        self.record(step, "time/progress", progress)
        if epoch_end or now - line_at >= self.progress_log_s:
            self.log_progress(timestamp, progress)

    def log_progress(self, timestamp: Timestamp, progress: float, *, unless_logged: bool = False) -> None:
        """Write the progress line now (rank 0); ``unless_logged``: only if steps were flushed
        since the last line (the trainer's last line, as training ends)."""
        now, loss_sum, steps = time.monotonic(), *self._last_line[1:]
        if self.rank != 0 or (unless_logged and not steps):
            return
        self._last_line = (now, 0.0, 0)
        figures = []
        if steps:
            figures.append(f"train/loss={loss_sum / steps:.4g} (mean of {steps} step{'s' if steps > 1 else ''})")
        throughput = self.latest.get("throughput/samples_per_sec")
        if throughput is not None:
            figures.append(f"{throughput:.4g} samples/s")
        log.info("training %s (%.0f%%)%s", timestamp.where(), 100 * progress,
                 ": " + ", ".join(figures) if figures else "")

    def restart_throughput(self, sample: int) -> None:
        """Measure throughput from now and ``sample`` on: time spent evaluating or resuming is
        not training time."""
        self._throughput_mark = (time.monotonic(), sample)
