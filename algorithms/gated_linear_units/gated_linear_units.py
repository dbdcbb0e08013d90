"""GatedLinearUnits (Shazeer 2020): replace a transformer's feed-forward block
``down(act(up(x)))`` with a gated one, ``down(act(gate(x)) * up(x))``.

What counts as a feed-forward block: a sequential container (``nn.Sequential``, torchvision's
``MLP`` and ViT's ``MLPBlock``) whose children are exactly optional LayerNorms, ``Linear(d, h)``,
an activation, optional dropouts, ``Linear(h, d)`` and optional dropouts -- the shape of
gpt_small's ``mlp`` and of torchvision's ViT, Swin and MaxViT MLPs. Requiring the block to map width ``d`` back to ``d``
keeps classifier heads (``Linear(features, hidden) -> ReLU -> Linear(hidden, classes)``) out.

The original modules stay under their original names, so ``mlp.0.weight`` (now the non-gated
projection) and ``mlp.2.weight`` (the down projection) keep their trained values and their
state-dict keys; the gate is a new ``Linear(d, h)`` named ``gate``, initialised with the same
spread as the up projection. As in Composer, the two projections into the hidden width lose
their biases unless ``gated_layer_bias`` / ``non_gated_layer_bias`` ask for them; the down
projection keeps its own.
"""

from __future__ import annotations

import warnings
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torchvision.ops
from torchvision.models.vision_transformer import MLPBlock

from algorithms.base import Algorithm, AlgorithmState, NoEffectWarning
from algorithms.events import Event
from algorithms.surgery import replace_modules

ACTIVATIONS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU,
                                           "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}
"""Activations a spec may name (``act_fn``): GEGLU, ReGLU, SwiGLU, the original GLU, tanh."""

# Modules accepted as the activation of a feed-forward block.
_FFN_ACTIVATIONS = (nn.GELU, nn.ReLU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Mish, nn.LeakyReLU, nn.ELU, nn.ReLU6,
                    nn.Hardswish, nn.Softplus)

FFN_CONTAINERS: tuple[type[nn.Module], ...] = (nn.Sequential, torchvision.ops.MLP, MLPBlock)
"""Exact container types searched for feed-forward blocks (surgery matches types exactly)."""


class _Activation(nn.Module):
    """A plain function (e.g. ``torch.nn.functional.silu``) as a module without parameters."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class GatedFeedForward(nn.Module):
    """``rest(act(gate(x)) * up(x))`` after optional ``pre`` norms: a feed-forward block with a
    gated hidden layer.

    The norms, ``up``, the activation and the modules after it (dropouts, the down projection)
    keep the names they had in the original container; only ``gate`` is new.
    """

    def __init__(self, pre: list[tuple[str, nn.Module]], modules: list[tuple[str, nn.Module]], gate: nn.Linear):
        super().__init__()
        for name, module in pre + modules:
            self.add_module(name, module)
        self.gate = gate
        self._pre = [name for name, _ in pre]
        self._up, self._act = modules[0][0], modules[1][0]
        self._rest = [name for name, _ in modules[2:]]

    def __getitem__(self, name: int | str) -> nn.Module:
        """A module by its name in the original container (``block[0]`` is still the up projection)."""
        return self._modules[str(name)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self._pre:
            x = getattr(self, name)(x)
        h = getattr(self, self._act)(self.gate(x)) * getattr(self, self._up)(x)
        for name in self._rest:
            h = getattr(self, name)(h)
        return h


def _ffn_layout(container: nn.Module) -> tuple[int, nn.Linear, nn.Linear] | None:
    """``(index of up, up, down)`` if ``container`` is a feed-forward block, else None."""
    children = list(container.children())
    start = 0
    # MaxViT normalizes inside. Any LayerNorm subclass: low_precision_layernorm's LPLayerNorm
    # listed earlier must not hide the block.
    while start < len(children) and isinstance(children[start], nn.LayerNorm):
        start += 1
    if len(children) - start < 3:
        return None
    up, act, *rest = children[start:]
    core = [m for m in rest if not isinstance(m, nn.Dropout)]  # GyroDropout layers included
    # Exactly nn.Linear: a layer that only behaves like one (factorize's FactorizedLinear, a
    # quantized or otherwise specialised subclass) has no single weight to gate beside.
    if len(core) != 1 or type(up) is not nn.Linear or type(core[0]) is not nn.Linear:
        return None
    if not isinstance(act, _FFN_ACTIVATIONS):
        return None
    (down,) = core
    if down.in_features != up.out_features or down.out_features != up.in_features:
        return None
    return start, up, down


def _set_bias(linear: nn.Linear, wanted: bool) -> None:
    if not wanted and linear.bias is not None:
        linear.bias = None
    elif wanted and linear.bias is None:
        linear.bias = nn.Parameter(torch.zeros(linear.out_features, device=linear.weight.device,
                                               dtype=linear.weight.dtype))


def _activation(act_fn: str | nn.Module | Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    if isinstance(act_fn, str):
        if act_fn not in ACTIVATIONS:
            raise ValueError(f"act_fn {act_fn!r} is not one of {', '.join(ACTIVATIONS)} (or a module/callable)")
        return ACTIVATIONS[act_fn]()
    if isinstance(act_fn, nn.Module):
        return act_fn
    if callable(act_fn):
        return _Activation(act_fn)
    raise ValueError(f"act_fn {act_fn!r} must be a name ({', '.join(ACTIVATIONS)}), a module or a callable")


def _gated(container: nn.Module, act_fn, gated_layer_bias: bool, non_gated_layer_bias: bool) -> nn.Module | None:
    layout = _ffn_layout(container)
    if layout is None:
        return None
    start, up, _ = layout
    named = list(container.named_children())
    if act_fn is not None:
        named[start + 1] = (named[start + 1][0], _activation(act_fn))
    _set_bias(up, non_gated_layer_bias)
    gate = nn.Linear(up.in_features, up.out_features, bias=gated_layer_bias, device=up.weight.device,
                     dtype=up.weight.dtype)
    with torch.no_grad():
        # The model's own init scale (GPT's N(0, 0.02), PyTorch's uniform), not nn.Linear's default.
        gate.weight.normal_(0.0, float(up.weight.detach().float().std()))
        if gate.bias is not None:
            gate.bias.zero_()
    return GatedFeedForward(named[:start], named[start:], gate)


def apply_gated_linear_units(model: nn.Module,
                             optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
                             act_fn: str | nn.Module | Callable[[torch.Tensor], torch.Tensor] | None = None,
                             gated_layer_bias: bool = False, non_gated_layer_bias: bool = False) -> nn.Module:
    """Make every feed-forward block of ``model`` a gated linear unit, in place.

    Composer's name and signature (Composer returns None; this returns the model). ``act_fn``:
    None keeps each block's own activation; else a name (gelu, relu, silu, sigmoid, tanh), a
    module or a callable. New gates join ``optimizers``' group of the block they gate; removed
    biases leave it. A second call changes nothing. Warns ``NoEffectWarning`` if no block matches.
    """
    if act_fn is not None:
        _activation(act_fn)  # a bad name fails before anything changes
    replaced = replace_modules(
        model, {t: (lambda m: _gated(m, act_fn, gated_layer_bias, non_gated_layer_bias)) for t in FFN_CONTAINERS},
        optimizers=optimizers)
    if not replaced:
        warnings.warn(NoEffectWarning(
            f"GatedLinearUnits found no feed-forward block (a Sequential of Linear(d, h), an activation, "
            f"Linear(h, d) and optional Dropouts) in {type(model).__name__}; it changes nothing"))
    return model


class GatedLinearUnits(Algorithm):
    """Gates the feed-forward blocks at INIT, before wrapping."""

    name = "gated_linear_units"
    events = frozenset({Event.INIT})
    changes_model = True

    def __init__(self, act_fn: str | None = None, gated_layer_bias: bool = False, non_gated_layer_bias: bool = False):
        if act_fn is not None and act_fn not in ACTIVATIONS:
            raise ValueError(f"act_fn {act_fn!r} is not one of {', '.join(ACTIVATIONS)} or null")
        self.act_fn, self.gated_layer_bias, self.non_gated_layer_bias = act_fn, gated_layer_bias, non_gated_layer_bias

    def apply(self, event: Event, state: AlgorithmState) -> None:
        apply_gated_linear_units(state.model, optimizers=getattr(state, "optimizer", None), act_fn=self.act_fn,
                                 gated_layer_bias=self.gated_layer_bias,
                                 non_gated_layer_bias=self.non_gated_layer_bias)
