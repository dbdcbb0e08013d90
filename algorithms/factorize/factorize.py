"""Factorize: replace a wide Linear or Conv2d with two thinner layers through a low-rank latent.

``Linear(in, out)`` becomes ``Linear(in, r, bias=False) -> Linear(r, out)`` and a k x k
``Conv2d(in, out)`` becomes ``Conv2d(in, r, k) -> Conv2d(r, out, 1)``. Per output position
that costs ``r * (fan_in + out)`` multiply-adds instead of ``fan_in * out`` (``fan_in = in * k * k``),
so it only pays when ``r < fan_in * out / (fan_in + out)``; a latent size at or above that is
refused. Thresholds and latent sizes follow Composer's ``apply_factorization``.

How the two new layers start (``init``):

- ``"random"`` (default): PyTorch's default initialization of fresh layers, as Composer's
  re-initialization does; nothing of the old weight is kept. Costs no more than building the
  layers. At ``INIT`` the built-in models' weights are fresh random ones, so nothing is lost
  there; an imported model whose builder loads pretrained weights loses them (use ``lowrank``
  or ``svd`` for it). A replayed ``INIT`` whose weights are loaded right after
  (``state.loads_weights``: a fork's first start, ``load_model``) always starts ``random``;
  a resume computes its ``init`` again before its checkpoint overwrites it.
- ``"lowrank"``: a randomized rank-r approximation of the old weight (``torch.svd_lowrank``,
  two power iterations): close to the best one, several times cheaper than an exact SVD.
- ``"svd"``: the best rank-r approximation (exact truncated SVD); a layer whose weight already
  has rank <= r computes exactly the same function. It is the slow one: an exact SVD of
  every factorized weight (seconds for a ResNet-18 on a CPU).
"""

from __future__ import annotations

import math
import warnings
from typing import Literal, Sequence, get_args

import torch
import torch.nn as nn

from algorithms.base import Algorithm, AlgorithmState, NoEffectWarning
from algorithms.events import Event
from algorithms.surgery import replace_modules


def max_rank_with_speedup(in_size: int, out_size: int, kernel_elements: int = 1) -> int:
    """The largest latent size whose factorization needs fewer multiply-adds than the layer."""
    fan_in = in_size * kernel_elements
    breakeven = fan_in * out_size / (fan_in + out_size)
    return int(math.ceil(breakeven - 1))  # strictly below the break-even point


def resolve_latent_size(latent: int | float, in_size: int, out_size: int) -> int:
    """A float in (0, 1) is a fraction of ``min(in_size, out_size)`` (at least 1); an int is itself."""
    if isinstance(latent, float) and latent < 1:
        if latent <= 0:
            raise ValueError(f"latent size fraction {latent} must be positive")
        return max(1, int(latent * min(in_size, out_size)))
    if latent < 1 or latent != int(latent):
        raise ValueError(f"latent size {latent!r} must be a fraction in (0, 1) or an integer >= 1")
    return int(latent)


FactorizeInit = Literal["random", "lowrank", "svd"]
INITS: tuple[str, ...] = get_args(FactorizeInit)
LOWRANK_OVERSAMPLING = 8  # extra random directions: the rank-r part is found far more reliably
LOWRANK_POWER_ITERATIONS = 2  # sharpen the spectrum before the projection (torch.svd_lowrank's default)


def _check_init(init: str) -> None:
    if init not in INITS:
        raise ValueError(f"init {init!r} is not one of {', '.join(repr(i) for i in INITS)}")


def low_rank_factors(weight: torch.Tensor, rank: int, init: str = "svd") -> tuple[torch.Tensor, torch.Tensor]:
    """``(A (rank, n), B (m, rank))`` with ``B @ A`` a rank-``rank`` approximation of ``weight (m, n)``:
    the best one (``init="svd"``), or a randomized one (``"lowrank"``), balanced as
    ``A = sqrt(S) V^T``, ``B = U sqrt(S)``."""
    w = weight.detach().float()
    if init == "svd":
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        u, s, v = u[:, :rank], s[:rank], vh[:rank].T
    elif init == "lowrank":
        q = min(rank + LOWRANK_OVERSAMPLING, *w.shape)
        u, s, v = torch.svd_lowrank(w, q=q, niter=LOWRANK_POWER_ITERATIONS)
        u, s, v = u[:, :rank], s[:rank], v[:, :rank]
    else:
        raise ValueError(f"init {init!r} has no factors to compute; expected 'svd' or 'lowrank'")
    root = s.sqrt()
    return (root[:, None] * v.T).to(weight.dtype), (u * root[None, :]).to(weight.dtype)


def _refuse_if_no_shrink(kind: str, in_size: int, out_size: int, kernel_elements: int, rank: int) -> None:
    limit = max_rank_with_speedup(in_size, out_size, kernel_elements)
    if rank > limit:
        fan_in = in_size * kernel_elements
        raise ValueError(
            f"latent size {rank} does not shrink {kind}({in_size} -> {out_size}): factorized it costs "
            f"{rank} * ({fan_in} + {out_size}) = {rank * (fan_in + out_size)} multiply-adds per output "
            f"position versus {fan_in * out_size} unfactorized; use a latent size of at most {limit}")


class FactorizedLinear(nn.Module):
    """``Linear(in, r, bias=False)`` then ``Linear(r, out)``."""

    def __init__(self, in_features: int, out_features: int, latent_features: int, bias: bool = True, *,
                 device: torch.device | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        _refuse_if_no_shrink("Linear", in_features, out_features, 1, latent_features)
        self.in_features, self.out_features, self.latent_features = in_features, out_features, latent_features
        self.module0 = nn.Linear(in_features, latent_features, bias=False, device=device, dtype=dtype)
        self.module1 = nn.Linear(latent_features, out_features, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module1(self.module0(x))

    @classmethod
    def from_linear(cls, linear: nn.Linear, latent_features: int | float,
                    init: FactorizeInit = "random") -> "FactorizedLinear":
        """The factorization of ``linear``: fresh layers (``init="random"``, as Composer), or
        started from a rank-r approximation of its weight (``"lowrank"``, ``"svd"``)."""
        _check_init(init)
        rank = resolve_latent_size(latent_features, linear.in_features, linear.out_features)
        new = cls(linear.in_features, linear.out_features, rank, bias=linear.bias is not None,
                  device=linear.weight.device, dtype=linear.weight.dtype)
        if init == "random":
            return new
        a, b = low_rank_factors(linear.weight, rank, init)
        with torch.no_grad():
            new.module0.weight.copy_(a)
            new.module1.weight.copy_(b)
            if linear.bias is not None:
                new.module1.bias.copy_(linear.bias)
        return new


class FactorizedConv2d(nn.Module):
    """``Conv2d(in, r, k)`` (the original stride, padding, dilation) then a 1x1 ``Conv2d(r, out)``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, latent_channels: int, *, stride=1,
                 padding=0, dilation=1, bias: bool = True, padding_mode: str = "zeros",
                 device: torch.device | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        kernel_size = nn.modules.utils._pair(kernel_size)
        _refuse_if_no_shrink("Conv2d", in_channels, out_channels, kernel_size[0] * kernel_size[1], latent_channels)
        self.in_channels, self.out_channels, self.latent_channels = in_channels, out_channels, latent_channels
        self.module0 = nn.Conv2d(in_channels, latent_channels, kernel_size, stride=stride, padding=padding,
                                 dilation=dilation, bias=False, padding_mode=padding_mode, device=device, dtype=dtype)
        self.module1 = nn.Conv2d(latent_channels, out_channels, 1, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module1(self.module0(x))

    @classmethod
    def from_conv2d(cls, conv: nn.Conv2d, latent_channels: int | float,
                    init: FactorizeInit = "random") -> "FactorizedConv2d":
        """The factorization of ``conv`` (ungrouped): fresh layers (``init="random"``, as
        Composer), or started from a rank-r approximation of its flattened weight."""
        _check_init(init)
        if conv.groups != 1:
            raise ValueError(f"cannot factorize a grouped convolution (groups={conv.groups})")
        rank = resolve_latent_size(latent_channels, conv.in_channels, conv.out_channels)
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, rank, stride=conv.stride,
                  padding=conv.padding, dilation=conv.dilation, bias=conv.bias is not None,
                  padding_mode=conv.padding_mode, device=conv.weight.device, dtype=conv.weight.dtype)
        if init == "random":
            return new
        a, b = low_rank_factors(conv.weight.flatten(1), rank, init)  # (out, in*kh*kw)
        with torch.no_grad():
            new.module0.weight.copy_(a.view_as(new.module0.weight))
            new.module1.weight.copy_(b.view_as(new.module1.weight))
            if conv.bias is not None:
                new.module1.bias.copy_(conv.bias)
        return new


def apply_factorization(model: nn.Module, factorize_convs: bool = True, factorize_linears: bool = True,
                        min_channels: int = 512, latent_channels: int | float = 0.25, min_features: int = 512,
                        latent_features: int | float = 0.25,
                        optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
                        init: FactorizeInit = "random") -> nn.Module:
    """Factorize every ``Conv2d`` with ``min(in, out) >= min_channels`` and every ``Linear`` with
    ``min(in, out) >= min_features`` whose latent size would cut its multiply-adds.

    Same name, signature and thresholds as Composer's ``apply_factorization`` (which returns None;
    this returns the model). Wide-enough layers the latent size would not shrink are skipped,
    as in Composer, and named in the ``NoEffectWarning`` if nothing was factorized. Pass
    ``optimizers`` built earlier so they swap the old parameters for the new ones.
    """
    _check_init(init)  # up front: an unknown init is an error even where no layer qualifies
    skipped: list[str] = []
    inside = {id(m) for f in model.modules() if isinstance(f, (FactorizedLinear, FactorizedConv2d))
              for m in (f.module0, f.module1)}
    policies: dict[type[nn.Module], object] = {}

    def maybe(build, module, in_size, out_size, kernel_elements, minimum, latent):
        if id(module) in inside or min(in_size, out_size) < minimum:
            return None
        rank = resolve_latent_size(latent, in_size, out_size)
        if rank > max_rank_with_speedup(in_size, out_size, kernel_elements):
            skipped.append(f"{type(module).__name__}({in_size} -> {out_size}) at latent {rank}")
            return None
        return build(module, rank, init)

    if factorize_convs:
        policies[nn.Conv2d] = lambda c: None if c.groups != 1 else maybe(
            FactorizedConv2d.from_conv2d, c, c.in_channels, c.out_channels,
            c.kernel_size[0] * c.kernel_size[1], min_channels, latent_channels)
    if factorize_linears:
        policies[nn.Linear] = lambda m: maybe(FactorizedLinear.from_linear, m, m.in_features, m.out_features, 1,
                                              min_features, latent_features)
    replaced = replace_modules(model, policies, optimizers=optimizers)  # type: ignore[arg-type]
    if not replaced:
        reason = (f"; the latent size would not shrink: {', '.join(skipped)}" if skipped else
                  f"; no Conv2d with >= {min_channels} channels or Linear with >= {min_features} features")
        warnings.warn(NoEffectWarning(f"Factorize changed nothing in {type(model).__name__}{reason}"))
    return model


class Factorize(Algorithm):
    """Factorizes the model's wide layers at INIT, before wrapping."""

    name = "factorize"
    events = frozenset({Event.INIT})
    changes_model = True

    def __init__(self, factorize_convs: bool = True, factorize_linears: bool = True, min_channels: int = 256,
                 latent_channels: int | float = 0.25, min_features: int = 256, latent_features: int | float = 128,
                 init: FactorizeInit = "random"):
        _check_init(init)
        if not (factorize_convs or factorize_linears):
            raise ValueError("factorize_convs and factorize_linears are both False: Factorize would change nothing")
        self.factorize_convs, self.factorize_linears = factorize_convs, factorize_linears
        self.min_channels, self.latent_channels = min_channels, latent_channels
        self.min_features, self.latent_features = min_features, latent_features
        self.init = init

    def apply(self, event: Event, state: AlgorithmState) -> None:
        # A replay (resume, fork, load_model) loads saved tensors right after: computing an SVD
        # or low-rank start only for them to overwrite it would be wasted.
        init = "random" if getattr(state, "loads_weights", False) else self.init
        apply_factorization(state.model, factorize_convs=self.factorize_convs,
                            factorize_linears=self.factorize_linears, min_channels=self.min_channels,
                            latent_channels=self.latent_channels, min_features=self.min_features,
                            latent_features=self.latent_features, optimizers=getattr(state, "optimizer", None),
                            init=init)
