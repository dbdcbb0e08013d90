"""GyroDropout (Lee et al. 2022): instead of a fresh dropout mask for every example and step,
train a fixed set of ``sigma`` pre-selected subnetworks, ``tau`` of them at a time.

Each ``GyroDropoutLayer`` owns ``sigma`` masks over its features (kept with probability
``1 - p``). On a training step the batch's rows are split into ``tau`` equal groups, each
multiplied by one of the ``tau`` active masks (scaled by ``1 / (1 - p)`` as dropout is); the
active set changes every ``iters_per_epoch * max_epoch / sigma`` steps, so over a run every
subnetwork gets about the same share of training. Evaluation is the identity.

Features are the last dimension for ``(N, C)`` and ``(N, T, C)`` inputs (one mask per example
for all its positions) and the channel dimension for ``(N, C, ...)`` feature maps.

Bitwise resume: the masks and every active set are pure functions of the layer's ``seed``, the
step and the period (``change_every``), all persistent buffers (so in every checkpoint and
export: a model rebuilt by ``load_model`` trains on with the same schedule). The seed is drawn from torch's RNG
at surgery -- the same on every rank, since the trainer seeds them alike before building the
model -- and masks are generated on the CPU, so they are the same on every device. The
functional form counts its own training forwards, as Composer's does; the ``GyroDropout``
algorithm instead sets the step from the run's batch counter, so microbatches, SAM's second
pass and selective backprop's scoring pass do not advance it. It sets it when the counter
moves (BATCH_END) and at EPOCH_START (a fresh run, or a fork that loaded its parent's layers),
never at AFTER_DATALOADER: that event runs algorithms in reverse list order, so a selective
backprop listed after GyroDropout would score the batch with the previous step's masks.
"""

from __future__ import annotations

import itertools
import warnings

import torch
import torch.nn as nn

from algorithms.base import Algorithm, AlgorithmState, NoEffectWarning
from algorithms.events import Event
from algorithms.surgery import replace_modules

_GOLDEN = 0x9E3779B97F4A7C15  # spreads consecutive periods over the generator's seed space


def _check(p: float, sigma: int, tau: int) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p {p} must lie in [0, 1)")
    if sigma < 1:
        raise ValueError(f"sigma {sigma} must be >= 1")
    if not 1 <= tau <= sigma:
        raise ValueError(f"tau {tau} must lie in [1, sigma={sigma}]")


class GyroDropoutLayer(nn.Dropout):
    """Dropout over ``sigma`` fixed masks, ``tau`` active at a time. A subclass of ``nn.Dropout``
    so code that looks for dropout layers (and GatedLinearUnits' block detection) still finds it;
    surgery matches types exactly, so it is never converted twice."""

    def __init__(self, iters_per_epoch: int, max_epoch: int, p: float = 0.5, sigma: int = 256, tau: int = 16,
                 seed: int | None = None):
        _check(p, sigma, tau)
        if iters_per_epoch < 1 or max_epoch < 1:
            raise ValueError(f"iters_per_epoch {iters_per_epoch} and max_epoch {max_epoch} must be >= 1")
        super().__init__(p=p)
        self.iters_per_epoch, self.max_epoch, self.sigma, self.tau = iters_per_epoch, max_epoch, sigma, tau
        change_every = max(1, int(iters_per_epoch * max_epoch / sigma))
        self.count_forwards = True  # False when GyroDropout sets the step from the batch counter
        seed = int(torch.randint(0, 2**62, ()).item()) if seed is None else seed
        self.register_buffer("seed", torch.tensor(seed, dtype=torch.int64))
        self.register_buffer("step", torch.tensor(0, dtype=torch.int64))
        # Saved, not recomputed: a rebuild (load_model) does not know the run's length.
        self.register_buffer("period", torch.tensor(change_every, dtype=torch.int64))
        # Python mirrors of the buffers: reading a CUDA buffer every forward would synchronize.
        self._seed, self._step, self._change_every = seed, 0, change_every
        self._masks: tuple[int, torch.Tensor] | None = None  # (features, sigma x features bool masks)
        self._active: tuple[tuple, torch.Tensor] | None = None  # (key, tau x features scaled masks)

    @property
    def change_every(self) -> int:
        """Steps between changes of the active subnetworks (the ``period`` buffer)."""
        return self._change_every

    def set_step(self, step: int) -> None:
        """The training step the next forward belongs to (picks the active subnetworks)."""
        self._step = step
        self.step.fill_(step)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._seed, self._step, self._change_every = int(self.seed), int(self.step), int(self.period)
        self._masks = self._active = None

    def masks(self, features: int) -> torch.Tensor:
        """The ``sigma`` pre-selected keep-masks ``(sigma, features)`` of this layer (bool, CPU)."""
        if self._masks is None or self._masks[0] != features:
            generator = torch.Generator().manual_seed(self._seed)
            self._masks = (features, torch.rand(self.sigma, features, generator=generator) >= self.p)
        return self._masks[1]

    def active_indices(self, step: int) -> torch.Tensor:
        """Which ``tau`` of the ``sigma`` masks train at ``step`` (distinct; fixed within a period)."""
        period = step // self.change_every
        generator = torch.Generator().manual_seed((self._seed + _GOLDEN * (period + 1)) % 2**64)
        return torch.randperm(self.sigma, generator=generator)[:self.tau]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.dim() < 2:
            raise ValueError(f"GyroDropoutLayer needs a batch dimension and features, got shape {tuple(x.shape)}")
        step = self._step
        if self.count_forwards:
            self.set_step(step + 1)
        channels_first = x.dim() >= 4
        features = x.shape[1] if channels_first else x.shape[-1]
        key = (step // self.change_every, features, x.device, x.dtype, self._seed)
        if self._active is None or self._active[0] != key:
            active = self.masks(features)[self.active_indices(step)]
            self._active = (key, (active.to(x.dtype) / (1.0 - self.p)).to(x.device))
        n = x.shape[0]
        groups = torch.arange(n, device=x.device) * self.tau // n  # tau (nearly) equal groups of rows
        mask = self._active[1][groups]
        if channels_first:
            mask = mask.view(n, features, *([1] * (x.dim() - 2)))
        else:
            mask = mask.view(n, *([1] * (x.dim() - 2)), features)
        return x * mask

    def extra_repr(self) -> str:
        return f"p={self.p}, sigma={self.sigma}, tau={self.tau}, change_every={self.change_every}"


def apply_gyro_dropout(model: nn.Module, iters_per_epoch: int = 196, max_epoch: int = 100, p: float = 0.5,
                       sigma: int = 256, tau: int = 16) -> nn.Module:
    """Replace every ``nn.Dropout`` of ``model`` with a ``GyroDropoutLayer``, in place.

    Composer's name and signature (Composer returns None; this returns the model). Every layer
    gets ``p`` (the old layers' own rates are replaced, as in Composer) and its own seed from
    torch's RNG. Dropout has no parameters, so optimizers need no update. Warns
    ``NoEffectWarning`` if the model has no ``nn.Dropout``.
    """
    _check(p, sigma, tau)
    # The new layers' seed and step buffers go where the model is (it may already be on a GPU).
    device = next((t.device for t in itertools.chain(model.parameters(), model.buffers())), None)
    replaced = replace_modules(model, {nn.Dropout: lambda m: GyroDropoutLayer(iters_per_epoch, max_epoch, p, sigma,
                                                                              tau).to(device)})
    if not replaced:
        warnings.warn(NoEffectWarning(f"GyroDropout found no torch.nn.Dropout in {type(model).__name__}; "
                                      "it changes nothing"))
    return model


class GyroDropout(Algorithm):
    """Replaces the dropout layers at INIT (the active set changes every ``max_batches / sigma``
    batches); sets each layer's step to the batch counter at EPOCH_START and BATCH_END, so every
    forward of a batch (selective backprop's scoring one too, in either list order) has its step."""

    name = "gyro_dropout"
    events = frozenset({Event.INIT, Event.EPOCH_START, Event.BATCH_END})
    changes_model = True

    def __init__(self, p: float = 0.5, sigma: int = 256, tau: int = 16):
        _check(p, sigma, tau)
        self.p, self.sigma, self.tau = p, sigma, tau
        # Found once at INIT (a resume replays INIT on the rebuilt model, so it is found again);
        # loading a state dict keeps the modules, so the list stays valid.
        self._layers: list[GyroDropoutLayer] | None = None

    def apply(self, event: Event, state: AlgorithmState) -> None:
        if event is Event.INIT:
            apply_gyro_dropout(state.model, iters_per_epoch=max(1, state.max_batches), max_epoch=1, p=self.p,
                               sigma=self.sigma, tau=self.tau)
            self._layers = [m for m in state.model.modules() if isinstance(m, GyroDropoutLayer)]
            for layer in self._layers:
                layer.count_forwards = False
            return
        if self._layers is None:  # driven without INIT (a hand-built engine): find them once
            self._layers = [m for m in state.model.modules() if isinstance(m, GyroDropoutLayer)]
        for layer in self._layers:
            layer.set_step(state.timestamp.batch)
