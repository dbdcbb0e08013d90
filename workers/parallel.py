"""Data parallelism: the device, wrapping the model, and the few collectives the loop needs.

``ddp`` replicates the model; ``fsdp`` shards parameters, gradients and optimizer state with
FSDP2 (``fully_shard`` on every block, then on the root). Mixed precision comes from autocast
in the loop for every strategy: FSDP2's ``MixedPrecisionPolicy`` fails on CPU with BatchNorm
models (ENVIRONMENT.md), and autocast works everywhere.

The process group is created by whoever starts the workers -- Ray Train's ``TorchConfig``
(gloo on CPU, nccl on GPU, chosen in ``workers.ray_train`` from ``use_gpu``) -- never here.
Without a process group everything runs as a single rank.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STRATEGIES = ("none", "ddp", "fsdp")


def device_for(use_gpu: bool) -> torch.device:
    """The device of this process: its current CUDA device when ``use_gpu``, else the CPU."""
    if not use_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("parallelism.use_gpu is true but this worker sees no CUDA device")
    return torch.device("cuda", torch.cuda.current_device())


def rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, or ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def wrap_model(model: torch.nn.Module, *, strategy: str, device: torch.device) -> torch.nn.Module:
    """Move ``model`` to ``device`` and wrap it for ``strategy`` (``none``, ``ddp`` or ``fsdp``).

    Call after surgery (algorithms at INIT): DDP registers gradient hooks on the parameters it
    sees at construction, and FSDP replaces them with sharded ones.
    """
    model = model.to(device)
    if strategy == "none":
        return model
    if strategy == "ddp":
        if not dist.is_initialized():
            raise RuntimeError("strategy 'ddp' needs a torch.distributed process group (started by Ray Train)")
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    if strategy == "fsdp":
        if not dist.is_initialized():
            raise RuntimeError("strategy 'fsdp' needs a torch.distributed process group (started by Ray Train)")
        return shard_model(model, device=device)
    raise ValueError(f"unknown parallelism strategy {strategy!r}; known: {', '.join(STRATEGIES)}")


def fsdp_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The units FSDP2 shards separately: residual blocks where the model has them (their
    class names end in Block or Bottleneck), else every direct child that holds parameters."""
    blocks = [m for m in model.modules() if m is not model and type(m).__name__.endswith(("Block", "Bottleneck"))]
    if blocks:
        return blocks
    return [child for child in model.children() if any(True for _ in child.parameters())]


def shard_model(model: torch.nn.Module, *, device: torch.device) -> torch.nn.Module:
    """FSDP2: ``fully_shard`` each block, then the root (which holds the remaining parameters)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in fsdp_blocks(model):
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def is_fsdp(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP wrapper (or the model itself; FSDP2 shards in place)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def no_sync(model: torch.nn.Module, skip: bool) -> ContextManager:
    """No gradient reduction when ``skip`` (accumulating microbatches): DDP's ``no_sync``, or
    FSDP2's ``set_requires_gradient_sync(False)`` for this backward."""
    if skip and isinstance(model, DistributedDataParallel):
        return model.no_sync()
    if is_fsdp(model):
        return _fsdp_gradient_sync(model, enabled=not skip)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_gradient_sync(model: torch.nn.Module, *, enabled: bool):
    model.set_requires_gradient_sync(enabled)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def all_reduce_max(value: int, device: torch.device) -> int:
    """The largest ``value`` over ranks."""
    tensor = torch.tensor([value], device=device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place (no-op on a single rank); returns it."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def average_buffers(model: torch.nn.Module) -> None:
    """Average floating-point buffers (BatchNorm running statistics) over ranks in place.

    DDP only broadcasts rank 0's buffers at the start of each forward, and each rank then
    updates its own; averaging before evaluation makes every rank evaluate the same model.
    """
    rank_count = rank_and_world_size()[1]
    if rank_count == 1:
        return
    for buffer in unwrap(model).buffers():
        if buffer.is_floating_point():
            all_reduce_sum(buffer.data).div_(rank_count)
