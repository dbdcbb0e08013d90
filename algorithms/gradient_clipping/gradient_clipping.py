"""GradientClipping: bound the gradients before the optimizer step.

Three clipping types, as in Composer:

- ``norm``: scale all gradients together so their global L2 norm is at most the threshold
  (``torch.nn.utils.clip_grad_norm_``; under FSDP2 the gradients are DTensor shards and the
  norm it computes is the global one, all ranks' shards included);
- ``value``: clamp every gradient element to ``[-threshold, threshold]``;
- ``adaptive`` (AGC, Brock et al. 2021): scale each output unit's gradient (a row of a weight,
  a whole bias) so its norm is at most ``threshold * max(norm of the unit's weights, 1e-3)``.

Sharding needs nothing from the caller. FSDP2 (``fully_shard``, what Tessera's ``fsdp`` strategy
uses) keeps parameters and gradients as DTensor shards: torch's ``clip_grad_norm_`` takes the
per-shard norms as partial (``_NormPartial``) DTensors and all-reduces them into the global norm
before scaling, value clipping is element-wise so each rank clamps its own shard, and AGC works
on each rank's whole rows (see ``_clip_adaptive``). A model wrapped in FSDP1's
``FullyShardedDataParallel`` holds flattened shards instead: norm clipping goes through the root
wrapper's ``clip_grad_norm_`` (the global norm, as Composer does), value clipping clamps the
shards, and AGC, which needs each weight's rows, is refused. Composer's ``fsdp_enabled`` flag is
accepted but not needed: the wrappers are found in the model.

The algorithm acts at ``AFTER_TRAIN_BATCH``: after every microbatch's backward, after DDP's
gradient all-reduce and after the GradScaler has unscaled the gradients, just before the step.
"""

from __future__ import annotations

from typing import Iterable, Literal

import torch

from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event

ClippingType = Literal["norm", "value", "adaptive"]
CLIPPING_TYPES = ("norm", "value", "adaptive")
AGC_EPS = 1e-3  # the NFNet paper's floor on a unit's weight norm, so zero-initialised biases can learn


def apply_gradient_clipping(model: torch.nn.Module | torch.Tensor | Iterable[torch.Tensor],
                            clipping_type: ClippingType, clipping_threshold: float,
                            fsdp_enabled: bool = False) -> None:
    """Clip the gradients of ``model`` (a module, one tensor or an iterable of tensors) in place.

    Composer's name, parameters and order: ``apply_gradient_clipping(model, clipping_type,
    clipping_threshold, fsdp_enabled)``. A module stands for its parameters; parameters without a
    gradient are skipped. ``fsdp_enabled`` is accepted for Composer's call shape and changes
    nothing: FSDP2 shards are handled by the torch functions themselves, and an FSDP1 root in
    ``model`` is found without it (pass the module, not its parameters, for FSDP1). Unlike
    Composer's, ``fsdp_enabled=True`` on a model without FSDP1 wrappers still clips.
    """
    if clipping_type not in CLIPPING_TYPES:
        raise ValueError(f"clipping_type {clipping_type!r} is not one of {', '.join(CLIPPING_TYPES)}")
    if not clipping_threshold > 0:
        raise ValueError(f"clipping_threshold {clipping_threshold} must be > 0")
    fsdp1_root = _fsdp1_root(model) if isinstance(model, torch.nn.Module) else None
    if fsdp1_root is not None and clipping_type == "adaptive":
        raise ValueError("clipping_type 'adaptive' needs each weight's rows, which FSDP1 "
                         "(FullyShardedDataParallel) flattens; with FSDP1 use 'norm' or 'value', "
                         "or shard with FSDP2 (fully_shard)")
    if fsdp1_root is not None and clipping_type == "norm":
        fsdp1_root.clip_grad_norm_(max_norm=clipping_threshold)  # every rank's shards in the norm
        return
    if isinstance(model, torch.nn.Module):
        parameters = model.parameters()
    elif isinstance(model, torch.Tensor):
        parameters = [model]
    else:
        parameters = model
    with_grads = [p for p in parameters if p.grad is not None]
    if not with_grads:
        return
    if clipping_type == "norm":
        torch.nn.utils.clip_grad_norm_(with_grads, max_norm=clipping_threshold)
    elif clipping_type == "value":
        torch.nn.utils.clip_grad_value_(with_grads, clip_value=clipping_threshold)
    else:
        _clip_adaptive(with_grads, clipping_threshold)


def _fsdp1_root(model: torch.nn.Module) -> torch.nn.Module | None:
    """The outermost FSDP1 ``FullyShardedDataParallel`` in ``model``, if any (FSDP2 adds none)."""
    if not torch.distributed.is_available():
        return None
    from torch.distributed.fsdp import FullyShardedDataParallel
    for module in model.modules():  # outermost first
        if isinstance(module, FullyShardedDataParallel) and module.check_is_root():
            return module
    return None


def _unitwise_norm(tensor: torch.Tensor) -> torch.Tensor:
    """The L2 norm of each output unit: over all but the first dimension; a 0-d/1-d tensor is one unit."""
    if tensor.ndim <= 1:
        return torch.linalg.vector_norm(tensor)
    return torch.linalg.vector_norm(tensor, dim=tuple(range(1, tensor.ndim)), keepdim=True)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """An FSDP2 shard's local tensor (rows split on dim 0 keep every output unit whole on one rank)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _clip_adaptive(parameters: list[torch.Tensor], threshold: float) -> None:
    with torch.no_grad():
        for param in parameters:
            if param.ndim <= 1 and hasattr(param, "to_local"):
                # A sharded bias is one unit spread over ranks: DTensor ops give the global norm.
                weight_norm = _unitwise_norm(param.detach()).full_tensor()
                grad_norm = _unitwise_norm(param.grad.detach()).full_tensor()
            else:
                weight_norm = _unitwise_norm(_local(param.detach()))
                grad_norm = _unitwise_norm(_local(param.grad.detach()))
            max_norm = weight_norm.clamp(min=AGC_EPS) * threshold
            # Units whose gradient norm exceeds max_norm are scaled down to it; others stay.
            scale = (max_norm / grad_norm.clamp(min=1e-6)).clamp(max=1.0)
            _local(param.grad).mul_(scale.to(param.grad.dtype))


class GradientClipping(Algorithm):
    """Clips the batch's gradients at AFTER_TRAIN_BATCH (synced and unscaled, before the step)."""

    name = "gradient_clipping"
    events = frozenset({Event.AFTER_TRAIN_BATCH})

    def __init__(self, clipping_type: ClippingType = "norm", clipping_threshold: float = 1.0):
        if clipping_type not in CLIPPING_TYPES:
            raise ValueError(f"clipping_type {clipping_type!r} is not one of {', '.join(CLIPPING_TYPES)}")
        if not clipping_threshold > 0:
            raise ValueError(f"clipping_threshold {clipping_threshold} must be > 0")
        self.clipping_type, self.clipping_threshold = clipping_type, clipping_threshold

    def apply(self, event: Event, state: AlgorithmState) -> None:
        apply_gradient_clipping(state.model, self.clipping_type, self.clipping_threshold)
