"""The training loop. Reads top to bottom: build, surgery, wrap, then
``while not done: step; evaluate when due; report``.

One ``Trainer`` is one rank. Under Ray Train a process group already exists and every rank
runs this same code; without one (``workers.local``) it is a single rank. Metrics go to a
``MetricSink`` from rank 0 only, so the loop runs without a service.

Hot-path rule: no host syncs per step. Losses stay on the device as detached tensors and
are converted together when metrics are flushed (``MetricBuffer``: about once a second, before
evaluation and at the end); evaluation syncs once per evaluation.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from typing import Callable, Iterator, Sequence

import torch

from algorithms.registry import build_algorithms
from api.catalog import ALGORITHMS
from api.data_specs import dataset_domain
from api.lineage import ForkInfo
from api.model_specs import ImportedModelSpec
from api.specs import Precision, RunSpec
from workers.checkpoint import Checkpointer, fingerprint, with_retries
from workers.checkpoint.fork_source import load_fork_source
from workers.checkpoint.training import (AlgorithmStates, RankRng, StateOf, Stateful,
                                         TimestampState, TrainingCheckpoints, scaler_state)
from workers.data import build_eval_loader, build_train_loader
from workers.deterministic import deterministic_pools
from workers.engine import Callback, Engine
from workers.eval_metrics import EvalMetrics
from workers.events import Event
from workers.export import export_metadata, full_model_state, write_exports
from workers.fault_injection import install_fault_injection
from workers.loss import eval_metrics, eval_sums, soft_cross_entropy
from workers.loss_weights import microbatch_shares, rank_weight
from workers.metric_buffer import MetricBuffer
from workers.microbatch import Microbatches
from workers.models import build_model
from workers.models.user_code import loss_of
from workers.paths import run_of_checkpoints
from workers.optim import build_optimizer, build_scheduler
from workers.outcome import FINAL_SAVED_KEY
from workers.output_check import check_first_outputs
from workers.parallel import (all_reduce_max, all_reduce_sum, average_buffers, average_gradients, device_for,
                              is_fsdp, no_sync, rank_and_world_size, unwrap, wrap_model)
from workers.precision import autocast, grad_scaler
from workers.reporter import MetricSink, NullSink
from workers.state import State
from workers.surgery_notes import collect_no_effect
from workers.timekeeping import Time, to_batches

log = logging.getLogger(__name__)

# How long a sweep trial's evaluation waits for the service to store it before Tune sees it.
EVAL_DELIVERY_S = 30.0


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
    """Builds one rank's model, data, optimizer and algorithms from a ``RunSpec`` and trains.

    It delegates: ``checkpoints`` (when to save; what a checkpoint gathers), ``metrics``
    (buffering, flushing, throughput), ``microbatches`` (the microbatch size and the
    out-of-memory retry of ``auto``)."""

    def __init__(self, spec: RunSpec, *, sink: MetricSink | None = None, device: torch.device | None = None,
                 callbacks: Sequence[Callback] = (), checkpoint_url: str | None = None,
                 on_eval: Callable[[dict[str, float]], None] | None = None, fork: ForkInfo | None = None):
        """``checkpoint_url``: the run's checkpoint folder (``workers.paths.checkpoints_url``);
        with one, the trainer resumes from its newest committed checkpoint and saves every
        ``spec.checkpoint.interval`` and at the end. ``on_eval``: called on every rank after
        each evaluation with its results plus ``time/batch``, ``time/epoch`` and
        ``time/progress`` (how a Tune trial reports to its scheduler). ``fork``: where a forked run
        came from; without a checkpoint of its own yet, it starts from the parent's
        (``workers.checkpoint.fork_source``)."""
        self.spec = spec
        self.fork = fork
        self.on_eval = on_eval
        self.device = device or device_for(spec.parallelism.use_gpu)
        self.rank, self.world_size = rank_and_world_size()
        self.sink: MetricSink = sink if sink is not None and self.rank == 0 else NullSink()
        self.metrics = MetricBuffer(self.sink, rank=self.rank)
        # Data: built-in sets are loaded whole and sharded in memory; image folders and WebDataset
        # shards are read by DataLoader worker processes (workers.data.factory).
        self.train_loader = build_train_loader(spec, rank=self.rank, world_size=self.world_size,
                                               device=self.device, seed=spec.seed)
        item_shape = getattr(self.train_loader, "item_shape", None)  # your own data set's
        self.eval_loader = build_eval_loader(spec, rank=self.rank, world_size=self.world_size, device=self.device,
                                             num_classes=self.train_loader.num_classes, item_shape=item_shape,
                                             check_train=getattr(self.train_loader, "check_items", None))
        num_classes, in_channels = self.train_loader.num_classes, self.train_loader.in_channels
        _check_features_fit(spec, item_shape)
        # Your own metrics are imported here: a wrong import path fails before the first step.
        self.listed_metrics = EvalMetrics(spec.eval_metrics, num_classes=num_classes, device=self.device)

        # Model: the same initial weights on every rank (DDP would broadcast rank 0's anyway).
        torch.manual_seed(spec.seed)
        model = build_model(spec.model, num_classes=num_classes, in_channels=in_channels,
                            image_size=getattr(self.train_loader, "image_size", None),
                            domain=dataset_domain(spec.data.train))
        self.batches_per_epoch = len(self.train_loader)
        # Text counts tokens (``tok`` times): seq_len characters an example; images count none.
        self.counts_tokens = dataset_domain(spec.data.train) == "text"
        seq_len = getattr(spec.data.train, "seq_len", None) if self.counts_tokens else None
        self.tokens_per_batch = spec.data.batch_size * seq_len if seq_len else None
        max_batches = self._batches(spec.max_duration)
        algorithms = build_algorithms(spec.algorithms)
        self.state = State(model=model, num_classes=num_classes, max_batches=max_batches,
                           loss_fn=loss_of(model, soft_cross_entropy), device=self.device, precision=spec.precision,
                           rank=self.rank, world_size=self.world_size, algorithms=algorithms)
        if self.state.loss_fn is soft_cross_entropy:  # its logits' shape is known: checked on the first step
            check_first_outputs(self.state, spec=spec, text=self.counts_tokens)
        self.engine = Engine(algorithms, callbacks)
        self.train_loader.sample_transforms = self.state.sample_transforms  # one list: FIT_START installs
        self.state.train_batches = self.train_loader.fresh_epoch  # SWA's BatchNorm pass
        self.checkpoint_url, self.in_channels = checkpoint_url, in_channels
        self.checkpointer = None if checkpoint_url is None else self._checkpointer(checkpoint_url, in_channels)
        # A fork's first start loads its parent's weights over the model: surgery skips computing
        # how new tensors start. (A resume is not known yet: finding it is a collective listing of
        # storage that ``resume`` makes once, after wrapping; its surgery computes its init again.)
        self.state.loads_weights = fork is not None and fork.checkpoint_url is not None

        # Surgery before wrapping: DDP/FSDP must see the final modules and parameters.
        self.surgery_notes = collect_no_effect(lambda: self.engine.run_event(Event.INIT, self.state))
        if spec.deterministic and self.device.type == "cuda":  # CPU pools are deterministic already
            deterministic_pools(self.state.model)
        self.state.model = wrap_model(self.state.model, strategy=spec.parallelism.strategy, device=self.device)
        self._build_optimization()
        self.eval_every = self._interval(spec.eval_interval)
        self._last_eval_batch = -1
        # Autocast for forward and loss (None for fp32), made once: entering one context
        # object twice a step, never nested, is what a fresh one per use would do.
        self.forward_context = None if spec.precision is Precision.FP32 else autocast(spec.precision, self.device)
        self.microbatches = Microbatches(spec.microbatch_size, model=self.state.model, device=self.device,
                                         world_size=self.world_size)
        # Whether a whole-batch backward must say if it syncs gradients: DDP deferring its
        # all-reduce, or FSDP (a microbatched batch may have turned its sync off).
        self.sync_control = self.microbatches.defer_gradient_sync or is_fsdp(self.state.model)
        # Augmentations (CutMix boxes, permutations) draw from a per-rank stream.
        torch.manual_seed(spec.seed + self.rank)

        self.resumed_from: str | None = None
        self.checkpoints = TrainingCheckpoints(self.checkpointer, self.state,
                                               every=self._interval(spec.checkpoint.interval),
                                               shared=self._checkpointed_parts(),
                                               per_rank={"rng": RankRng(self.state, spec.seed)})

    def _build_optimization(self) -> None:
        """Optimizer, LR schedule and grad scaler, over the wrapped model's parameters."""
        spec, state = self.spec, self.state
        state.optimizer = build_optimizer(state.model.parameters(), spec.optimizer)
        state.scheduler = build_scheduler(state.optimizer, spec.scheduler, max_batches=state.max_batches,
                                          warmup_batches=self._batches(spec.scheduler.warmup, state.max_batches))
        state.scaler = grad_scaler(spec.precision, self.device)
        # fp16 only: the loop skips a disabled scaler's calls, which would only pass through.
        self.scaling = state.scaler.is_enabled()

    def _checkpointer(self, checkpoint_url: str, in_channels: int) -> Checkpointer:
        """The run's checkpoint folder; its fingerprint refuses checkpoints of another model."""
        spec = self.spec
        return Checkpointer(checkpoint_url, keep_last=spec.checkpoint.keep_last, async_save=spec.checkpoint.async_save,
                            rank=self.rank, world_size=self.world_size, on_report=self.sink.checkpoint,
                            on_note=self.sink.note, fingerprint=self._fingerprint(in_channels),
                            inputs={"image_size": getattr(self.train_loader, "image_size", None)})

    def _fingerprint(self, in_channels: int) -> dict:
        """The spec fields this run's checkpoint tensors depend on (``workers.checkpoint.contents``)."""
        surgery = [s for s, a in zip(self.spec.algorithms, self.state.algorithms) if a.changes_model]
        return fingerprint(self.spec, surgery=surgery, num_classes=self.state.num_classes, in_channels=in_channels)

    def _batches(self, duration: Time | str, max_batches: int | None = None) -> int:
        """``duration`` in batches of this run (``dur`` fractions need ``max_batches``)."""
        return to_batches(duration, batches_per_epoch=self.batches_per_epoch,
                          samples_per_batch=self.spec.data.batch_size, max_batches=max_batches,
                          tokens_per_batch=self.tokens_per_batch)

    def _interval(self, duration: Time | str | None) -> int | None:
        """An interval (evaluation, checkpoints) in batches, at least 1; None: never."""
        return None if duration is None else max(1, self._batches(duration, self.state.max_batches))

    def _checkpointed_parts(self) -> dict[str, Stateful]:
        """What ``trainer.pt`` holds, by the object that owns each part (loaded in this order:
        the timestamp first, as the RNG of another world size restarts from it)."""
        state = self.state
        return {
            "timestamp": TimestampState(state),
            "loader": self.train_loader,  # its position in global batches: valid for any world size
            "scheduler": state.scheduler,
            "scaler": scaler_state(state.scaler),
            "algorithms": AlgorithmStates(state.algorithms),
            "last_eval_batch": StateOf(lambda: self._last_eval_batch, self._set_last_eval_batch),
            "microbatch_size": self.microbatches,
        }

    def _set_last_eval_batch(self, batch: int) -> None:
        self._last_eval_batch = batch

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
                save_due = self.checkpoints.due(state.timestamp.batch)
                if self._eval_due() and not self.train_loader.exhausted:
                    self.evaluate()
                elif save_due:
                    self._flush_metrics_to_spool()
                elif self.metrics.due():
                    self._flush_metrics()
                if save_due:
                    self.checkpoints.save(epoch_done=self.train_loader.exhausted)
            if self.train_loader.exhausted:
                # An evaluation due on the epoch's last batch runs after EPOCH_END (as in
                # Composer), so it is labelled with the completed epoch.
                state.timestamp = state.timestamp.after_epoch()
                engine.run_event(Event.EPOCH_END, state)
                self._flush_metrics(epoch_end=True)
                if self._eval_due():
                    self.evaluate()
                self.sink.flush()
        self._flush_metrics_to_spool()
        self.metrics.log_progress(state.timestamp, state.progress, unless_logged=True)  # the last line: 100%
        self.checkpoints.save_final(state.timestamp.batch)  # always end with the final state
        if self._last_eval_batch != state.timestamp.batch:
            self.evaluate()  # always end with an evaluation of the final model
        self.checkpoints.wait()
        final_saved = self.checkpoints.final_saved()
        if final_saved is not None:  # visible in the summary; the launcher reports it with COMPLETED
            self.metrics.record(state.timestamp.batch, FINAL_SAVED_KEY, 1.0 if final_saved else 0.0)
        engine.run_event(Event.FIT_END, state)
        self._flush_metrics()
        self.sink.flush()
        if self.checkpoint_url is not None:
            self.export(run_of_checkpoints(self.checkpoint_url))
        return dict(self.metrics.latest)

    def export(self, run: str) -> dict[str, str] | None:
        """Write the final model as one file per format under ``{run}/exports/`` (``workers.export``);
        every rank must call it (FSDP gathers), rank 0 writes and gets the URLs."""
        state = full_model_state(self.state.model)
        if self.rank != 0:
            return None
        surgery = [s for s, a in zip(self.spec.algorithms, self.state.algorithms) if a.changes_model]
        metadata = export_metadata(self.spec, surgery=surgery, step=self.state.timestamp.batch,
                                   num_classes=self.state.num_classes, in_channels=self.in_channels,
                                   image_size=getattr(self.train_loader, "image_size", None),
                                   metrics=dict(self.metrics.latest))
        retries = {} if self.checkpointer is None else {"attempts": self.checkpointer.attempts,
                                                        "first_delay_s": self.checkpointer.first_delay_s}
        try:
            return with_retries(lambda: write_exports(run, state, metadata),
                                what=f"exporting the final model to {run}", **retries)
        except Exception as exc:  # the weights are trained; a missing export must not fail the run
            log.exception("exporting the final model to %s/exports failed", run)
            self.sink.note(f"the final model could not be exported to {run}/exports after its retries "
                           f"({type(exc).__name__}: {str(exc)[:200]}); export a committed checkpoint later "
                           f"(POST /runs/{{id}}/exports, `tessera export RUN --step N`)")
            return None

    def _eval_due(self) -> bool:
        return bool(self.eval_every) and self.state.timestamp.batch % self.eval_every == 0

    def train_batch(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """One optimizer step on this rank's batch, split into microbatches if asked."""
        state, engine, microbatches = self.state, self.engine, self.microbatches
        # Most runs have no algorithms and no callbacks: their steps make no event calls at all
        # (nine a step, 0.7% of a tiny CNN's step in bench/loop.py). Read each step, as
        # a callback may join or leave the engine between steps.
        dispatch = engine.algorithms or engine.callbacks
        state.inputs, state.targets = inputs, targets
        if dispatch:
            engine.run_event(Event.AFTER_DATALOADER, state)
        batch_inputs, batch_targets = state.inputs, state.targets
        batch_size = batch_inputs.shape[0]
        lr = state.optimizer.param_groups[0]["lr"]
        # Text on several ranks: each rank's loss weighs by its kept tokens (one all-reduce).
        weight = rank_weight(batch_targets, world_size=self.world_size) if self.counts_tokens else None
        if not microbatches.auto:  # only 'auto' retries a batch that ran out of memory
            batch_loss = self._accumulate_gradients(batch_inputs, batch_targets, weight)
        else:
            while (batch_loss := microbatches.attempt(
                    lambda inputs, targets: self._accumulate_gradients(inputs, targets, weight),
                    batch_inputs, batch_targets)) is None:
                if not microbatches.halve(batch_size, state):
                    raise torch.OutOfMemoryError(f"out of memory on this batch with microbatches of "
                                                 f"{microbatches.size or batch_size}, on this rank or another")
        if microbatches.defer_gradient_sync:
            average_gradients(state.model)
        # Algorithms that read gradients (clipping) must see their true values: unscale first
        # (fp16 only); ``step`` then skips its own unscale and still skips inf/NaN steps.
        if self.scaling:
            state.scaler.unscale_(state.optimizer)
        if dispatch:
            # SAM takes a second forward/backward of this batch at other weights.
            state.recompute_gradients = lambda: self._recompute_gradients(batch_inputs, batch_targets, weight)
            engine.run_event(Event.AFTER_TRAIN_BATCH, state)
            state.recompute_gradients = None
        if self.scaling:
            state.scaler.step(state.optimizer)
            state.scaler.update()
        else:  # a disabled scaler's step and update only pass through: four calls a step saved
            state.optimizer.step()
        state.scheduler.step()
        state.timestamp = state.timestamp.after_batch(
            samples=batch_size * self.world_size,
            tokens=batch_inputs.numel() * self.world_size if self.counts_tokens else 0)
        if dispatch:
            engine.run_event(Event.BATCH_END, state)
        self.metrics.add_step(state.timestamp.batch, batch_loss, lr)

    def _recompute_gradients(self, batch_inputs: torch.Tensor, batch_targets: torch.Tensor,
                             weight: torch.Tensor | None) -> None:
        """Zero the gradients and run the batch's forward/backward again at the current weights,
        synced across ranks like the first pass; the new gradients are scaled (fp16), not unscaled."""
        self._accumulate_gradients(batch_inputs, batch_targets, weight)
        if self.microbatches.defer_gradient_sync:
            average_gradients(self.state.model)

    def _accumulate_gradients(self, batch_inputs: torch.Tensor, batch_targets: torch.Tensor,
                              weight: torch.Tensor | None = None) -> torch.Tensor:
        """Forward and backward over the batch's microbatches; returns this rank's mean loss.
        ``weight``: this rank's loss's weight in the ranks' average (``loss_weights.rank_weight``;
        None: the same as every rank's)."""
        state = self.state
        batch_size = batch_inputs.shape[0]
        size, defer_sync = self.microbatches.size, self.microbatches.defer_gradient_sync
        state.optimizer.zero_grad(set_to_none=True)
        if size is None or size >= batch_size:
            # The whole batch at once (the usual case): no slices, no running sum, and on one
            # rank no weighting. Four fewer tensor ops per step, which a small model's step time
            # feels (bench/loop.py).
            state.inputs, state.targets = batch_inputs, batch_targets
            if self.sync_control:
                with no_sync(state.model, skip=defer_sync):
                    self._forward_backward(weight)
            else:
                self._forward_backward(weight)
            return state.loss.detach()
        bounds = self.microbatches.bounds(batch_size)
        batch_loss = torch.zeros((), device=self.device)
        # Weighting each microbatch's mean loss by its share of the batch (of its items, or for
        # text of its kept tokens) makes the summed gradients equal the full batch's.
        shares = microbatch_shares(batch_targets, bounds, by_tokens=self.counts_tokens)
        for i, ((start, end), share) in enumerate(zip(bounds, shares)):
            state.inputs, state.targets = batch_inputs[start:end], batch_targets[start:end]
            # DDP all-reduces gradients only on the last microbatch (or, deferred, after the batch).
            with no_sync(state.model, skip=defer_sync or i < len(bounds) - 1):
                self._forward_backward(share if weight is None else share * weight)
            batch_loss += state.loss.detach() * share
        return batch_loss

    def _forward_backward(self, weight: float | torch.Tensor | None) -> None:
        state, engine, forward_context = self.state, self.engine, self.forward_context
        dispatch = engine.algorithms or engine.callbacks  # as in train_batch
        if dispatch:
            engine.run_event(Event.BEFORE_FORWARD, state)
        if forward_context is None:  # fp32: no context to enter and leave, twice a step
            state.outputs = state.model(state.inputs)
        else:
            with forward_context:
                state.outputs = state.model(state.inputs)
        if dispatch:
            engine.run_event(Event.AFTER_FORWARD, state)
            engine.run_event(Event.BEFORE_LOSS, state)
        if forward_context is None:
            state.loss = state.loss_fn(state.outputs, state.targets)
        else:
            with forward_context:
                state.loss = state.loss_fn(state.outputs, state.targets)
        if dispatch:
            engine.run_event(Event.AFTER_LOSS, state)
            engine.run_event(Event.BEFORE_BACKWARD, state)
        loss = state.loss if weight is None else state.loss * weight
        (state.scaler.scale(loss) if self.scaling else loss).backward()
        if dispatch:
            engine.run_event(Event.AFTER_BACKWARD, state)

    def close(self) -> None:
        """Wait for a checkpoint write in flight and free what this trainer holds in the process
        group (``Checkpointer.close``). Only after a clean end or one that every rank took at the
        same point: a rank that raised alone may have peers inside a collective."""
        if self.checkpointer is not None:
            self.checkpointer.close()

    # --- evaluation ---------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """``eval/loss``, ``eval/accuracy`` (and ``eval/perplexity`` for text), and the spec's
        ``eval_metrics``, over the whole eval split, summed across ranks."""
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
                if self.listed_metrics:
                    self.listed_metrics.update(outputs, targets)
        model.train()
        loss_sum, correct, count = all_reduce_sum(sums).tolist()  # one host sync per evaluation
        results = eval_metrics(loss_sum, correct, count, domain=dataset_domain(self.spec.data.train))
        if self.listed_metrics:  # the spec's eval_metrics: their collectives, then your callables
            results.update(self.listed_metrics.compute())
        for key, value in results.items():
            self.metrics.record(state.timestamp.batch, key, value)
        if self.rank == 0:  # a line in the run's log (tessera logs) at each evaluation
            log.info("evaluation %s (%.0f%%): %s", state.timestamp.where(), 100 * state.progress,
                     ", ".join(f"{key}={value:.4g}" for key, value in sorted(results.items())))
        self.engine.run_event(Event.EVAL_END, state)
        self.sink.flush()
        if self.on_eval is not None:
            # A sweep trial: the service stores this evaluation before Tune's scheduler sees it.
            # A trial the scheduler stops on it is STOPPED at once, and a stopped run takes no
            # more reports: sent after, the metric it was stopped on was refused and lost.
            if not self.sink.deliver(EVAL_DELIVERY_S):
                log.warning("the service has not stored the evaluation at batch %d within %.0fs; if the sweep's "
                            "scheduler stops this trial on it, the run may not keep it", state.timestamp.batch,
                            EVAL_DELIVERY_S)
            self.on_eval({**results, "time/batch": float(state.timestamp.batch),
                          "time/epoch": float(state.timestamp.epoch), "time/progress": float(state.progress)})
        self.metrics.restart_throughput(state.timestamp.sample)  # eval time is not training
        return results

    # --- checkpoints and reporting -----------------------------------------------------
    def resume(self) -> str | None:
        """Load the newest committed checkpoint, if any: model, optimizer, every checkpointed
        part (``_checkpointed_parts``) and this rank's RNG; without one, a fork starts from its
        parent's (``start_from_fork``). Returns its URL. Surgery has already been replayed (INIT)
        and the model wrapped, so the saved tensors find their modules."""
        info = self.checkpoints.resume()
        if info is None:
            return self.start_from_fork()
        self.metrics.restart_throughput(self.state.timestamp.sample)
        self.resumed_from = info.url
        log.info("rank %d resumed from %s at batch %d", self.rank, info.url, self.state.timestamp.batch)
        return info.url

    def start_from_fork(self) -> str | None:
        """A fork's first start (no checkpoint of its own yet): load the parent's checkpoint
        that the service chose, as new training from batch 0 (``workers.checkpoint.fork_source``
        says what carries over). Returns its URL, or None when there is none to load."""
        url = self.fork.checkpoint_url if self.fork is not None else None
        if url is None:
            return None
        saved = load_fork_source(url, model=self.state.model, optimizer=self.state.optimizer,
                                 fingerprint=self._fingerprint(self.in_channels), load_optimizer=self.fork.load_optimizer,
                                 unshaped=("in_channels",) if self.counts_tokens else ())
        AlgorithmStates(self.state.algorithms).load_state_dict(saved)
        self.resumed_from = url
        log.info("rank %d starts from the parent's checkpoint %s", self.rank, url)
        return url

    def _flush_metrics(self, *, epoch_end: bool = False) -> None:
        self.metrics.flush(self.state.timestamp, self.state.progress, epoch_end=epoch_end)

    def _flush_metrics_to_spool(self) -> None:
        """Before a checkpoint: what was measured up to it is handed to the sink (the service
        reporter spools it to disk) before the checkpoint exists, so a run resumed from that
        checkpoint has lost no point, whatever kills the worker after."""
        self._flush_metrics()
        self.sink.flush()


def train(spec: RunSpec, *, sink: MetricSink | None = None, device: torch.device | None = None,
          callbacks: Sequence[Callback] = (), checkpoint_url: str | None = None) -> dict[str, float]:
    """Build a ``Trainer`` for ``spec`` in this process and fit it; returns the final metrics."""
    with process_settings(spec):
        trainer = Trainer(spec, sink=sink, device=device, callbacks=callbacks, checkpoint_url=checkpoint_url)
        install_fault_injection(trainer)  # only when a test asks for it (TESSERA_TEST_*)
        return trainer.fit()


def _check_features_fit(spec: RunSpec, item_shape: tuple[int, ...] | None) -> None:
    """Your own data set of feature vectors (items ``(F,)``) trains only your own model: the
    named models and the methods that work on pixels (``api.catalog``'s ``needs_images``) take
    images ``(C, H, W)``. ``UserCodeError`` naming the data set and what does not fit otherwise
    (the model would fail at its first batch inside a convolution, a method inside its transform)."""
    if item_shape is None or len(item_shape) != 1 or dataset_domain(spec.data.train) != "vision":
        return  # images, or token sequences (text)
    from workers.models.code_cache import UserCodeError

    gives = f"data.train.import {spec.data.train.import_path!r} gives feature vectors of shape {item_shape}"
    if not isinstance(spec.model, ImportedModelSpec):
        raise UserCodeError(f"{gives}, but model {spec.model.name!r} takes images (C, H, W); train your own "
                            "model (model.import) on feature vectors, or return images from the data set")
    on_pixels = [f"algorithms[{i}] {a.name!r}" for i, a in enumerate(spec.algorithms) if ALGORITHMS[a.name].needs_images]
    on_pixels += [f"algorithms[{i}].scale_factor {a.scale_factor} of 'selective_backprop' (scoring on downscaled "
                  "inputs; 1.0 scores at full size)" for i, a in enumerate(spec.algorithms)
                  if a.name == "selective_backprop" and a.scale_factor < 1.0]
    if on_pixels:
        raise UserCodeError(f"{gives}, but {', '.join(on_pixels)} work on the pixels of images (N, C, H, W); leave "
                            "them out, or return images from the data set")
