"""ALiBi: attention with linear biases instead of position embeddings (Press et al. 2021).

Surgery, driven by a registry: ``ALIBI_POLICIES`` maps a module type to a function
``fn(module, max_sequence_length) -> module | None`` that converts one module (zero and freeze
the position embeddings, or give an attention module its per-head biases). Model code registers
its own types with ``@register_alibi_policy(SomeAttention)``; Tessera's ``gpt_small`` does so in
``workers.models.gpt``. This module holds the model-independent parts: the slopes, the bias
matrix, the embedding conversion, ``apply_alibi`` and the ``Alibi`` algorithm.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Sequence

import torch

from algorithms.base import Algorithm, AlgorithmState, NoEffectWarning
from algorithms.events import Event
from algorithms.surgery import replace_modules

AlibiPolicy = Callable[[torch.nn.Module, int], "torch.nn.Module | None"]

ALIBI_POLICIES: dict[type[torch.nn.Module], AlibiPolicy] = {}
"""Module type -> its ALiBi conversion. Extend it with ``register_alibi_policy``."""


def register_alibi_policy(*module_types: type[torch.nn.Module]) -> Callable[[AlibiPolicy], AlibiPolicy]:
    """Decorator: convert every module of exactly these types with the decorated function."""
    if not module_types:
        raise ValueError("register_alibi_policy needs at least one module type")

    def register(fn: AlibiPolicy) -> AlibiPolicy:
        for module_type in module_types:
            if not (isinstance(module_type, type) and issubclass(module_type, torch.nn.Module)):
                raise TypeError(f"{module_type!r} is not a torch.nn.Module subclass")
            if ALIBI_POLICIES.get(module_type, fn) is not fn:
                raise ValueError(f"an ALiBi policy for {module_type.__qualname__} is already registered")
            ALIBI_POLICIES[module_type] = fn
        return fn

    return register


def alibi_slopes(num_heads: int) -> list[float]:
    """Per-head slopes: the geometric sequence ``2^(-8/n), 2^(-16/n), ...`` for ``n`` a power of 2.

    For other head counts (as in the paper's reference code): the slopes of the largest power
    of 2 below ``num_heads``, then every other slope of twice that power for the rest.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be positive, got {num_heads}")

    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start * start ** i for i in range(n)]  # the reference code's rounding, bit for bit

    if math.log2(num_heads).is_integer():
        return power_of_2(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


def alibi_bias(slopes: torch.Tensor, seq_len: int, *, causal: bool = True) -> torch.Tensor:
    """The additive attention bias ``(H, T, T)``: ``-slope_h * (i - j)`` for query i, key j.

    With ``causal`` the keys after each query get ``-inf`` (the causal mask in the same tensor);
    without it the distance is symmetric, ``-slope_h * |i - j|``.
    """
    position = torch.arange(seq_len, device=slopes.device)
    distance = position[:, None] - position[None, :]  # i - j: >= 0 for past keys
    bias = -slopes.float()[:, None, None] * distance.abs().float()
    if causal:
        bias = bias.masked_fill(distance < 0, float("-inf"))
    return bias


def zero_freeze_and_extend(embedding: torch.nn.Embedding, max_sequence_length: int) -> torch.nn.Embedding:
    """A zero, frozen position embedding with ``max_sequence_length`` rows, replacing ``embedding``.

    Kept (rather than deleted) so the model's forward and its state-dict keys stay unchanged.
    """
    weight = embedding.weight
    new = torch.nn.Embedding(max_sequence_length, embedding.embedding_dim, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.zero_()
    new.weight.requires_grad_(False)
    return new


def apply_alibi(model: torch.nn.Module, max_sequence_length: int,
                optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None) -> torch.nn.Module:
    """Convert every module of a type in ``ALIBI_POLICIES`` to ALiBi, in place.

    Same name and signature as Composer's ``apply_alibi`` (which returns None; this returns the
    model for chaining). After it, the model accepts sequences up to ``max_sequence_length``.
    Pass ``optimizers`` built before the call so they drop the old position embeddings and see
    the new ones. Warns ``NoEffectWarning`` when nothing in the model has a registered policy.
    """
    if max_sequence_length < 1:
        raise ValueError(f"max_sequence_length must be positive, got {max_sequence_length}")
    policies = {t: (lambda m, fn=fn: fn(m, max_sequence_length)) for t, fn in ALIBI_POLICIES.items()}
    replaced = replace_modules(model, policies, optimizers=optimizers)
    if not replaced:
        known = ", ".join(sorted(t.__qualname__ for t in ALIBI_POLICIES)) or "none"
        warnings.warn(NoEffectWarning(
            f"ALiBi found no module with a registered policy in {type(model).__name__}; it changes nothing "
            f"(registered: {known}; add yours with algorithms.alibi.register_alibi_policy)"))
    return model


def scale_sequence_length(tensor: torch.Tensor, scaling: float) -> torch.Tensor:
    """Reshape ``(B, T)`` to ``(B * k, T // k)`` rows of length ``int(T * scaling)``.

    Every token is kept (the batch holds the same number of tokens in shorter rows), except a
    remainder of ``T mod new_length`` tokens at the end of each row.
    """
    batch, length = tensor.shape[:2]
    new_length = max(1, int(length * scaling))
    keep = length // new_length * new_length
    return tensor[:, :keep].reshape(batch * (keep // new_length), new_length, *tensor.shape[2:])


class Alibi(Algorithm):
    """Converts the model at INIT; trains on shorter sequences from AFTER_DATALOADER on."""

    name = "alibi"
    events = frozenset({Event.INIT, Event.AFTER_DATALOADER})
    changes_model = True

    def __init__(self, max_sequence_length: int = 1024, train_sequence_length_scaling: float = 0.25):
        self.max_sequence_length = max_sequence_length
        self.train_sequence_length_scaling = train_sequence_length_scaling

    def apply(self, event: Event, state: AlgorithmState) -> None:
        if event is Event.INIT:
            apply_alibi(state.model, self.max_sequence_length, optimizers=getattr(state, "optimizer", None))
            return
        if self.train_sequence_length_scaling >= 1.0:
            return
        inputs, targets = state.inputs, state.targets
        # Token batches only: (B, T) integer inputs with per-token targets of the same shape.
        if (isinstance(inputs, torch.Tensor) and inputs.dim() == 2 and not inputs.is_floating_point()
                and isinstance(targets, torch.Tensor) and targets.shape[:2] == inputs.shape):
            state.inputs = scale_sequence_length(inputs, self.train_sequence_length_scaling)
            state.targets = scale_sequence_length(targets, self.train_sequence_length_scaling)
