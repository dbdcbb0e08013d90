"""StochasticDepth (Huang et al. 2016): train a shallower network on every step.

A residual block computes ``post(main(x) + shortcut(x))``. While training, ``block`` mode skips
the whole main branch with probability ``drop_rate`` (the block becomes ``post(shortcut(x))``);
``sample`` mode zeroes the main branch for a random ``drop_rate`` of the examples. At evaluation
the main branch is scaled by its survival probability ``1 - drop_rate``, as in the paper and
Composer. With ``linear`` distribution the i-th of n blocks drops with ``(i + 1) / n * drop_rate``.

Which modules are residual blocks, and how to split them into main branch and shortcut, comes
from a registry (``register_residual_block``): torchvision's ``BasicBlock`` and ``Bottleneck``
are registered here, Tessera's CIFAR ResNet block in ``workers.models.cifar_resnet``. Surgery
swaps a block's class for a ``Stochastic<Name>`` subclass in place, so parameters and their
names stay; a persistent ``drop_rate`` buffer is added (a checkpoint of the stochastic model
does not load silently into a plain one, whose evaluation would differ).

Under DDP and FSDP2 a skipped block would leave parameters without gradients, which the
wrappers' gradient reduction does not allow, so there a dropped block's main branch is computed
and multiplied by zero: same training signal, no speedup.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.models.resnet import BasicBlock, Bottleneck

from algorithms.base import Algorithm, AlgorithmState, NoEffectWarning
from algorithms.events import Event
from algorithms.surgery import replace_modules

StochasticMethod = Literal["block", "sample"]
DropDistribution = Literal["uniform", "linear"]


@dataclass(frozen=True)
class ResidualBlock:
    """How to run one residual block type in pieces: ``post(main(block, x) + shortcut(block, x))``."""

    module_type: type[nn.Module]
    main: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    shortcut: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    post: Callable[[torch.Tensor], torch.Tensor] = F.relu


RESIDUAL_BLOCKS: dict[str, ResidualBlock] = {}
"""``target_layer_name`` -> the block type and its pieces. Extend with ``register_residual_block``."""


def register_residual_block(name: str, module_type: type[nn.Module], *,
                            main: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                            shortcut: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                            post: Callable[[torch.Tensor], torch.Tensor] = F.relu) -> None:
    """Make blocks of exactly ``module_type`` convertible under ``target_layer_name=name``."""
    known = RESIDUAL_BLOCKS.get(name)
    if known is not None and known.module_type is not module_type:
        raise ValueError(f"residual block name {name!r} is already registered for {known.module_type.__qualname__}")
    RESIDUAL_BLOCKS[name] = ResidualBlock(module_type, main, shortcut, post)


def _downsampled(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x if block.downsample is None else block.downsample(x)


register_residual_block(
    "ResNetBasicBlock", BasicBlock, shortcut=_downsampled,
    main=lambda b, x: b.bn2(b.conv2(b.relu(b.bn1(b.conv1(x))))))
register_residual_block(
    "ResNetBottleneck", Bottleneck, shortcut=_downsampled,
    main=lambda b, x: b.bn3(b.conv3(b.relu(b.bn2(b.conv2(b.relu(b.bn1(b.conv1(x)))))))))


class StochasticResidual(nn.Module):
    """Mixin placed before a registered block class; ``forward`` drops its main branch at random."""

    residual: ResidualBlock
    stochastic_method: StochasticMethod = "block"
    skip_dropped: bool = True  # False under DDP/FSDP2: compute the dropped branch, multiply by zero
    drop_rate: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = type(self).residual
        shortcut = residual.shortcut(self, x)
        if not self.training:
            return residual.post(residual.main(self, x) * (1 - self.drop_rate).to(x.dtype) + shortcut)
        if self.stochastic_method == "block":
            keep = torch.bernoulli(1 - self.drop_rate)  # drawn on the buffer's device, from the run's RNG
            if self.skip_dropped:
                if not bool(keep):
                    return residual.post(shortcut)
                return residual.post(residual.main(self, x) + shortcut)
            return residual.post(residual.main(self, x) * keep.to(x.dtype) + shortcut)
        out = residual.main(self, x)
        mask_shape = (out.shape[0],) + (1,) * (out.dim() - 1)
        keep = (torch.rand(mask_shape, device=out.device) >= self.drop_rate).to(out.dtype)
        return residual.post(out * keep + shortcut)


_STOCHASTIC_CLASSES: dict[type[nn.Module], type[nn.Module]] = {}


def _stochastic_class(name: str) -> type[nn.Module]:
    residual = RESIDUAL_BLOCKS[name]
    cls = _STOCHASTIC_CLASSES.get(residual.module_type)
    if cls is None:
        # The name ends like the block's, so FSDP2 still shards each block as a unit.
        cls = type(f"Stochastic{residual.module_type.__name__}", (StochasticResidual, residual.module_type),
                   {"residual": residual, "__module__": __name__})
        _STOCHASTIC_CLASSES[residual.module_type] = cls
    return cls


def _check(target_layer_name: str, stochastic_method: str, drop_rate: float, drop_distribution: str) -> None:
    if target_layer_name != "auto" and target_layer_name not in RESIDUAL_BLOCKS:
        raise ValueError(f"target_layer_name {target_layer_name!r} is not one of "
                         f"{', '.join(['auto', *sorted(RESIDUAL_BLOCKS)])}")
    if stochastic_method not in ("block", "sample"):
        raise ValueError(f"stochastic_method {stochastic_method!r} is not one of block, sample")
    if not 0.0 <= drop_rate <= 1.0:
        raise ValueError(f"drop_rate {drop_rate} must lie in [0, 1]")
    if drop_distribution not in ("uniform", "linear"):
        raise ValueError(f"drop_distribution {drop_distribution!r} is not one of uniform, linear")


def apply_stochastic_depth(model: nn.Module, target_layer_name: str, stochastic_method: StochasticMethod = "block",
                           drop_rate: float = 0.2, drop_distribution: DropDistribution = "linear") -> nn.Module:
    """Make the residual blocks named by ``target_layer_name`` stochastic, in place.

    Composer's name and signature (``target_layer_name='ResNetBottleneck'``, etc.; ``'auto'``:
    every registered block type). Returns the model; warns ``NoEffectWarning`` if no block matches.
    """
    _check(target_layer_name, stochastic_method, drop_rate, drop_distribution)
    names = sorted(RESIDUAL_BLOCKS) if target_layer_name == "auto" else [target_layer_name]
    by_type = {RESIDUAL_BLOCKS[n].module_type: n for n in names}
    blocks = [m for m in model.modules() if type(m) in by_type]
    for index, block in enumerate(blocks):
        rate = (index + 1) / len(blocks) * drop_rate if drop_distribution == "linear" else drop_rate
        param = next(block.parameters(), None)
        block.register_buffer("drop_rate", torch.tensor(rate, device=param.device if param is not None else None))
        block.stochastic_method = stochastic_method
    # Convert after counting: the linear schedule needs every block's index first.
    replace_modules(model, {t: (lambda m, n=n: _convert(m, n)) for t, n in by_type.items()})
    if not blocks:
        warnings.warn(NoEffectWarning(
            f"StochasticDepth found no residual block ({', '.join(names)}) in {type(model).__name__}; "
            "register yours with algorithms.stochastic_depth.register_residual_block; it changes nothing"))
    return model


def _convert(block: nn.Module, name: str) -> nn.Module:
    block.__class__ = _stochastic_class(name)
    return block


def _is_distributed(model: nn.Module) -> bool:
    return hasattr(model, "module") or any(hasattr(p, "to_local") for p in model.parameters())


class StochasticDepth(Algorithm):
    """Converts the residual blocks at INIT; at FIT_START picks skip-or-multiply for the wrapper;
    with ``drop_warmup`` raises the drop rates linearly from 0 at every batch (AFTER_DATALOADER)."""

    name = "stochastic_depth"
    events = frozenset({Event.INIT, Event.FIT_START, Event.AFTER_DATALOADER})
    changes_model = True

    def __init__(self, target_layer_name: str = "auto", stochastic_method: StochasticMethod = "block",
                 drop_rate: float = 0.2, drop_distribution: DropDistribution = "linear", drop_warmup: float = 0.0):
        _check(target_layer_name, stochastic_method, drop_rate, drop_distribution)
        if not 0.0 <= drop_warmup < 1.0:
            raise ValueError(f"drop_warmup {drop_warmup} must lie in [0, 1)")
        self.target_layer_name, self.stochastic_method = target_layer_name, stochastic_method
        self.drop_rate, self.drop_distribution, self.drop_warmup = drop_rate, drop_distribution, drop_warmup

    def apply(self, event: Event, state: AlgorithmState) -> None:
        if event is Event.INIT:
            apply_stochastic_depth(state.model, self.target_layer_name, self.stochastic_method, self.drop_rate,
                                   self.drop_distribution)
            return
        if event is Event.AFTER_DATALOADER and not self.drop_warmup:
            return
        blocks = [m for m in state.model.modules() if isinstance(m, StochasticResidual)]
        if event is Event.FIT_START:
            skip = not _is_distributed(state.model)
            for block in blocks:
                block.skip_dropped = skip
        elif blocks:
            # A function of progress alone: a resumed run recomputes it exactly.
            scale = min(1.0, state.progress / self.drop_warmup)
            with torch.no_grad():
                for index, block in enumerate(blocks):
                    rate = (index + 1) / len(blocks) * self.drop_rate if self.drop_distribution == "linear" \
                        else self.drop_rate
                    block.drop_rate.fill_(rate * scale)
