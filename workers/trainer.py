"""The training loop. Reads top to bottom: build, surgery, wrap, then
``while not done: step; evaluate when due; report``.

One ``Trainer`` is one rank. Under Ray Train a process group already exists and every rank
runs this same code; without one (``workers.local``) it is a single rank. Metrics go to a
``MetricSink`` from rank 0 only, so the loop runs without a service.

Hot-path rule: no host syncs per step. Losses stay on the device as detached tensors and
are converted together when metrics are flushed (about once a second, before evaluation and
at the end); evaluation syncs once per evaluation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import signal
import time
from typing import Callable, Iterator, Sequence

import torch

from algorithms.registry import build_algorithms
from api.catalog import DATASETS
from api.specs import RunSpec
from workers.checkpoint import Checkpointer, fingerprint, rng_state, set_rng_state
from workers.data import build_eval_loader, build_train_loader
from workers.engine import Callback, Engine
from workers.events import Event
from workers.loss import eval_metrics, eval_sums, soft_cross_entropy
from workers.models import build_model
from workers.optim import build_optimizer, build_scheduler
from workers.parallel import (OomAgreement, all_reduce_max, all_reduce_sum, average_buffers, average_gradients,
                              device_for, is_fsdp, no_sync, rank_and_world_size, reset_after_failed_step, unwrap,
                              wrap_model)
from workers.precision import autocast, grad_scaler
from workers.reporter import MetricSink, NullSink
from workers.state import State
from workers.timekeeping import Timestamp, to_batches

FLUSH_INTERVAL_S = 1.0
log = logging.getLogger(__name__)


@contextlib.contextmanager
def process_settings(spec: RunSpec) -> Iterator[None]:
    """Threads and determinism for this process, restored afterwards (in-process runs share
    the interpreter with their caller)."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(spec.parallelism.cpus_per_worker)
    if spec.deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; harmless on CPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


class Trainer:
    """Builds one rank's model, data, optimizer and algorithms from a ``RunSpec`` and trains."""

    def __init__(self, spec: RunSpec, *, sink: MetricSink | None = None, device: torch.device | None = None,
                 callbacks: Sequence[Callback] = (), checkpoint_url: str | None = None,
                 on_eval: Callable[[dict[str, float]], None] | None = None):
        """``checkpoint_url``: the run's checkpoint folder (``{storage}/runs/{id}/checkpoints``);
        with one, the trainer resumes from its newest committed checkpoint and saves every
        ``spec.checkpoint.interval`` and at the end. ``on_eval``: called on every rank after
        each evaluation with its results plus ``time/batch``, ``time/epoch`` and
        ``time/progress`` (how a Tune trial reports to its scheduler)."""
        self.spec = spec
        self.on_eval = on_eval
        self.device = device or device_for(spec.parallelism.use_gpu)
        self.rank, self.world_size = rank_and_world_size()
        self.sink: MetricSink = sink if sink is not None and self.rank == 0 else NullSink()
        self.latest: dict[str, float] = {}

        # Data: built-in sets are loaded whole and sharded in memory; image folders and WebDataset
        # shards are read by DataLoader worker processes (workers.data.factory).
        self.train_loader = build_train_loader(spec, rank=self.rank, world_size=self.world_size,
                                               device=self.device, seed=spec.seed)
        self.eval_loader = build_eval_loader(spec, rank=self.rank, world_size=self.world_size, device=self.device)
        in_channels = self.train_loader.in_channels

        # Model: the same initial weights on every rank (DDP would broadcast rank 0's anyway).
        torch.manual_seed(spec.seed)
        num_classes = self.train_loader.num_classes
        model = build_model(spec.model, num_classes=num_classes, in_channels=in_channels)
        batches_per_epoch = len(self.train_loader)
        max_batches = to_batches(spec.max_duration, batches_per_epoch=batches_per_epoch,
                                 samples_per_batch=spec.data.batch_size)
        algorithms = build_algorithms(spec.algorithms)
        self.state = State(model=model, num_classes=num_classes, max_batches=max_batches,
                           loss_fn=soft_cross_entropy, device=self.device, precision=spec.precision,
                           rank=self.rank, world_size=self.world_size, algorithms=algorithms)
        self.engine = Engine(algorithms, callbacks)
        self.train_loader.sample_transforms = self.state.sample_transforms  # one list: FIT_START installs

        # Surgery before wrapping: DDP/FSDP must see the final modules and parameters.
        self.engine.run_event(Event.INIT, self.state)
        self.state.model = wrap_model(self.state.model, strategy=spec.parallelism.strategy, device=self.device)
        self.state.optimizer = build_optimizer(self.state.model.parameters(), spec.optimizer)
        warmup = to_batches(spec.scheduler.warmup, batches_per_epoch=batches_per_epoch,
                            samples_per_batch=spec.data.batch_size, max_batches=max_batches)
        self.state.scheduler = build_scheduler(self.state.optimizer, spec.scheduler, warmup_batches=warmup,
                                               max_batches=max_batches)
        self.state.scaler = grad_scaler(spec.precision, self.device)
        self.eval_every = None if spec.eval_interval is None else max(1, to_batches(
            spec.eval_interval, batches_per_epoch=batches_per_epoch, samples_per_batch=spec.data.batch_size,
            max_batches=max_batches))

        # Augmentations (CutMix boxes, permutations) draw from a per-rank stream.
        torch.manual_seed(spec.seed + self.rank)
        self._pending: list[tuple[int, torch.Tensor, float]] = []  # (step, detached loss, lr)
        self._last_flush = time.monotonic()
        self._throughput_mark = (time.monotonic(), 0)
        self._last_eval_batch = -1
        self._microbatch_size = spec.microbatch_size if isinstance(spec.microbatch_size, int) else None
        # "auto" on several ranks: every rank must halve together (see _try_batch).
        self._oom_agreement = OomAgreement(self.state.model, self.device) if (
            spec.microbatch_size == "auto" and self.world_size > 1) else None
        # Under DDP the gradient all-reduce waits until all ranks agree that the batch fit (FSDP
        # has sync points before its reduce-scatters instead).
        self._defer_gradient_sync = self._oom_agreement is not None and not is_fsdp(self.state.model)

        self.resumed_from: str | None = None
        self.checkpointer = None if checkpoint_url is None else Checkpointer(
            checkpoint_url, keep_last=spec.checkpoint.keep_last, async_save=spec.checkpoint.async_save,
            rank=self.rank, world_size=self.world_size, on_report=getattr(self.sink, "checkpoint", None),
            fingerprint=fingerprint(spec, surgery=[s for s, a in zip(spec.algorithms, algorithms) if a.changes_model],
                                    num_classes=num_classes, in_channels=in_channels))
        self.checkpoint_every = None if spec.checkpoint.interval is None else max(1, to_batches(
            spec.checkpoint.interval, batches_per_epoch=batches_per_epoch, samples_per_batch=spec.data.batch_size,
            max_batches=max_batches))
        self._last_checkpoint_batch = -1

    # --- the loop -----------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        """Train to ``max_duration``; returns the latest value of every reported metric."""
        state, engine = self.state, self.engine
        state.model.train()
        engine.run_event(Event.FIT_START, state)
        self.resume()
        while not state.done:
            if state.timestamp.batch_in_epoch == 0:
                self.train_loader.set_epoch(state.timestamp.epoch)
                engine.run_event(Event.EPOCH_START, state)
            remaining = state.max_batches - state.timestamp.batch
            for inputs, targets in itertools.islice(self.train_loader, remaining):
                self.train_batch(inputs, targets)
                if self._eval_due() and not self.train_loader.exhausted:
                    self.evaluate()
                elif time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S:
                    self._flush_metrics()
                if self.checkpoint_every and state.timestamp.batch % self.checkpoint_every == 0:
                    self.save_checkpoint()
                _test_hooks(self)
            if self.train_loader.exhausted:
                # An evaluation due on the epoch's last batch runs after EPOCH_END (as in
                # Composer), so it is labelled with the completed epoch.
                state.timestamp = state.timestamp.after_epoch()
                engine.run_event(Event.EPOCH_END, state)
                self._flush_metrics(epoch_end=True)
                if self._eval_due():
                    self.evaluate()
                self.sink.flush()
        if self._last_checkpoint_batch != state.timestamp.batch:
            self.save_checkpoint()  # always end with a checkpoint of the final state
        if self._last_eval_batch != state.timestamp.batch:
            self.evaluate()  # always end with an evaluation of the final model
        if self.checkpointer is not None:
            self.checkpointer.wait()
        engine.run_event(Event.FIT_END, state)
        self._flush_metrics()
        self.sink.flush()
        return dict(self.latest)

    def _eval_due(self) -> bool:
        return bool(self.eval_every) and self.state.timestamp.batch % self.eval_every == 0

    def train_batch(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """One optimizer step on this rank's batch, split into microbatches if asked."""
        state, engine = self.state, self.engine
        state.inputs, state.targets = inputs, targets
        engine.run_event(Event.AFTER_DATALOADER, state)
        batch_inputs, batch_targets = state.inputs, state.targets
        batch_size = batch_inputs.shape[0]
        lr = state.optimizer.param_groups[0]["lr"]
        while True:
            batch_loss = self._try_batch(batch_inputs, batch_targets)
            if batch_loss is not None:
                break
            if not self._halve_microbatch(batch_size):
                raise torch.OutOfMemoryError(f"out of memory on this batch with microbatches of "
                                             f"{self._microbatch_size or batch_size}, on this rank or another")
        state.scaler.step(state.optimizer)
        state.scaler.update()
        state.scheduler.step()
        state.timestamp = state.timestamp.after_batch(samples=batch_size * self.world_size)
        engine.run_event(Event.BATCH_END, state)
        if self.rank == 0:
            self._pending.append((state.timestamp.batch, batch_loss, lr))

    def _try_batch(self, batch_inputs: torch.Tensor, batch_targets: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward over the batch; its mean loss, or None when ``microbatch_size:
        auto`` and this rank or (on several ranks) any rank ran out of memory. Every rank gets
        the same answer, so all retry the batch together and their collectives stay matched."""
        agreement = self._oom_agreement
        batch_loss = None
        try:
            with agreement.attempt() if agreement is not None else contextlib.nullcontext():
                batch_loss = self._accumulate_gradients(batch_inputs, batch_targets)
        except torch.OutOfMemoryError:
            if self.spec.microbatch_size != "auto":
                raise
        if agreement is not None and agreement.agree(batch_loss is None):  # one small all-reduce per batch
            batch_loss = None
        if batch_loss is not None and self._defer_gradient_sync:
            average_gradients(self.state.model)
        return batch_loss

    def _halve_microbatch(self, batch_size: int) -> bool:
        """``microbatch_size: auto`` after an out-of-memory error: retry the batch in microbatches
        half the size. False when already at 1 (the error then stands)."""
        current = self._microbatch_size or batch_size
        if current <= 1:
            return False
        self._microbatch_size = current // 2
        self.state.optimizer.zero_grad(set_to_none=True)
        self.state.outputs = self.state.loss = None
        reset_after_failed_step(self.state.model)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        log.warning("out of memory with microbatches of %d; retrying the batch with %d", current,
                    self._microbatch_size)
        return True

    def _accumulate_gradients(self, batch_inputs: torch.Tensor, batch_targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward over the batch's microbatches; returns the batch's mean loss."""
        state = self.state
        batch_size = batch_inputs.shape[0]
        bounds = self._microbatch_bounds(batch_size)
        state.optimizer.zero_grad(set_to_none=True)
        batch_loss = torch.zeros((), device=self.device)
        for i, (start, end) in enumerate(bounds):
            state.inputs, state.targets = batch_inputs[start:end], batch_targets[start:end]
            # Weighting each microbatch's mean loss by its share of the batch makes the summed
            # gradients equal the full batch's.
            weight = (end - start) / batch_size
            # DDP all-reduces gradients only on the last microbatch (or, deferred, after the batch).
            with no_sync(state.model, skip=self._defer_gradient_sync or i < len(bounds) - 1):
                self._forward_backward(weight)
            batch_loss += state.loss.detach() * weight
        return batch_loss

    def _forward_backward(self, weight: float) -> None:
        state, engine = self.state, self.engine
        engine.run_event(Event.BEFORE_FORWARD, state)
        with autocast(state.precision, self.device):
            state.outputs = state.model(state.inputs)
        engine.run_event(Event.AFTER_FORWARD, state)
        engine.run_event(Event.BEFORE_LOSS, state)
        with autocast(state.precision, self.device):
            state.loss = state.loss_fn(state.outputs, state.targets)
        engine.run_event(Event.AFTER_LOSS, state)
        engine.run_event(Event.BEFORE_BACKWARD, state)
        state.scaler.scale(state.loss * weight).backward()
        engine.run_event(Event.AFTER_BACKWARD, state)

    def _microbatch_bounds(self, batch_size: int) -> list[tuple[int, int]]:
        size = self._microbatch_size
        # "auto" starts with the full batch and halves on an out-of-memory error (CUDA); on CPU
        # memory is not the limit, so it stays the full batch.
        if size is None or size >= batch_size:
            return [(0, batch_size)]
        return [(start, min(start + size, batch_size)) for start in range(0, batch_size, size)]

    # --- evaluation ---------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """``eval/loss``, ``eval/accuracy`` (and ``eval/perplexity`` for text) over the whole eval
        split, summed across ranks."""
        state = self.state
        self._last_eval_batch = state.timestamp.batch
        if self.eval_loader is None:
            return {}
        self._flush_metrics()
        self.engine.run_event(Event.EVAL_START, state)
        average_buffers(state.model)  # every rank evaluates the same BatchNorm statistics
        # The unwrapped module: ranks hold different numbers of eval batches, so no DDP
        # collectives may run per batch.
        model = unwrap(state.model)
        model.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss, correct, count
        self.eval_loader.set_epoch(0)
        batches = list(self.eval_loader)
        # FSDP gathers parameters with collectives in every forward, so every rank must run as
        # many forwards as the rank with the most eval batches (the extra ones are not counted).
        num_forwards = all_reduce_max(len(batches), self.device) if is_fsdp(model) else len(batches)
        for index in range(num_forwards):
            inputs, targets = batches[min(index, len(batches) - 1)]
            with autocast(state.precision, self.device):
                outputs = model(inputs)
            if index < len(batches):
                sums += eval_sums(outputs, targets)  # per token for language models
        model.train()
        loss_sum, correct, count = all_reduce_sum(sums).tolist()  # one host sync per evaluation
        results = eval_metrics(loss_sum, correct, count, domain=DATASETS[self.spec.data.train.name].domain)
        for key, value in results.items():
            self._record(state.timestamp.batch, key, value)
        self.engine.run_event(Event.EVAL_END, state)
        self.sink.flush()
        if self.on_eval is not None:
            self.on_eval({**results, "time/batch": float(state.timestamp.batch),
                          "time/epoch": float(state.timestamp.epoch), "time/progress": float(state.progress)})
        self._throughput_mark = (time.monotonic(), state.timestamp.sample)  # eval time is not training
        return results

    # --- checkpoints --------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Save this rank's part of a checkpoint (collective: every rank calls it at this step)."""
        if self.checkpointer is None:
            return
        state = self.state
        self._last_checkpoint_batch = state.timestamp.batch
        # BatchNorm statistics are per rank and neither DDP nor FSDP syncs them; average them so
        # the checkpoint (which keeps one copy) is the model every rank would evaluate.
        average_buffers(state.model)
        trainer_state = {
            "timestamp": dataclasses.asdict(state.timestamp),
            "loader": self.train_loader.state_dict(),  # global batches: valid for any world size
            "sampler_seed": self.spec.seed,
            "scheduler": state.scheduler.state_dict(),
            "scaler": state.scaler.state_dict(),
            "algorithms": {a.name: a.state_dict() for a in state.algorithms},
            "last_eval_batch": self._last_eval_batch,
            "microbatch_size": self._microbatch_size,
        }
        self.checkpointer.save(model=state.model, optimizer=state.optimizer, trainer_state=trainer_state,
                               rank_state={"rng": rng_state(self.device)}, epoch=state.timestamp.epoch,
                               step=state.timestamp.batch)

    def resume(self) -> str | None:
        """Load the newest committed checkpoint, if any: model, optimizer, schedules, algorithm
        state, RNG and data position. Returns its URL. Surgery has already been replayed (INIT)
        and the model wrapped, so the saved tensors find the modules they came from."""
        if self.checkpointer is None:
            return None
        info = self.checkpointer.agreed_latest()
        if info is None:
            return None
        state = self.state
        trainer_state, rank_state = self.checkpointer.load(info, model=state.model, optimizer=state.optimizer)
        state.timestamp = Timestamp(**trainer_state["timestamp"])
        self.train_loader.load_state_dict(trainer_state["loader"])
        state.scheduler.load_state_dict(trainer_state["scheduler"])
        if trainer_state["scaler"]:
            state.scaler.load_state_dict(trainer_state["scaler"])
        for algorithm in state.algorithms:
            if algorithm.name in trainer_state["algorithms"]:
                algorithm.load_state_dict(trainer_state["algorithms"][algorithm.name])
        self._last_eval_batch = trainer_state["last_eval_batch"]
        self._last_checkpoint_batch = state.timestamp.batch
        if isinstance(trainer_state.get("microbatch_size"), int) and self.spec.microbatch_size == "auto":
            self._microbatch_size = trainer_state["microbatch_size"]
        if rank_state is not None:
            set_rng_state(rank_state["rng"])
        else:  # another world size: a fresh, still deterministic stream per rank
            torch.manual_seed(self.spec.seed + self.rank + 1_000_003 * state.timestamp.batch)
        self._throughput_mark = (time.monotonic(), state.timestamp.sample)
        self.resumed_from = info.url
        log.info("rank %d resumed from %s at batch %d", self.rank, info.url, state.timestamp.batch)
        return info.url

    # --- reporting ----------------------------------------------------------------------
    def _record(self, step: int, key: str, value: float) -> None:
        self.latest[key] = value
        self.sink.add(step, key, value)

    def _flush_metrics(self, *, epoch_end: bool = False) -> None:
        """Turn pending per-step losses into metric points (rank 0; one host sync)."""
        self._last_flush = time.monotonic()
        if self.rank != 0 or not (self._pending or epoch_end):
            return
        pending, self._pending = self._pending, []
        losses = torch.stack([loss for _, loss, _ in pending]).tolist() if pending else []
        for (step, _, lr), loss in zip(pending, losses):
            self._record(step, "train/loss", loss)
            self._record(step, "lr", lr)
        ts, step = self.state.timestamp, self.state.timestamp.batch
        start, start_sample = self._throughput_mark
        now = time.monotonic()
        if now > start and ts.sample > start_sample:
            self._record(step, "throughput/samples_per_sec", (ts.sample - start_sample) / (now - start))
        self._throughput_mark = (now, ts.sample)
        self._record(step, "time/epoch", ts.epoch)
        self._record(step, "time/batch", ts.batch)
        self._record(step, "time/progress", self.state.progress)


def _test_hooks(trainer: Trainer) -> None:
    """Test hooks, after each batch (read from the environment, which the dispatcher forwards):

    - ``TESSERA_TEST_BATCH_DELAY_S``: sleep this long, so a test can act on a running run;
    - ``TESSERA_TEST_KILL_AT_BATCH=B`` with ``TESSERA_TEST_KILL_MARKER=path``: the rank
      ``TESSERA_TEST_KILL_RANK`` (default: the last) SIGKILLs itself after batch B, once (the
      marker file records that it happened, so the restarted worker trains on).
    """
    delay = os.environ.get("TESSERA_TEST_BATCH_DELAY_S")
    if delay:
        time.sleep(float(delay))
    at = os.environ.get("TESSERA_TEST_KILL_AT_BATCH")
    marker = os.environ.get("TESSERA_TEST_KILL_MARKER")
    if not at or not marker or trainer.state.timestamp.batch != int(at):
        return
    if trainer.rank != int(os.environ.get("TESSERA_TEST_KILL_RANK", trainer.world_size - 1)):
        return
    if os.path.exists(marker):
        return
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    if trainer.checkpointer is not None:
        trainer.checkpointer.wait()
    os.kill(os.getpid(), signal.SIGKILL)


def train(spec: RunSpec, *, sink: MetricSink | None = None, device: torch.device | None = None,
          callbacks: Sequence[Callback] = (), checkpoint_url: str | None = None) -> dict[str, float]:
    """Build a ``Trainer`` for ``spec`` in this process and fit it; returns the final metrics."""
    with process_settings(spec):
        return Trainer(spec, sink=sink, device=device, callbacks=callbacks, checkpoint_url=checkpoint_url).fit()
