"""Data parallelism: the device, wrapping the model, and the few collectives the loop needs.

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
    """Move ``model`` to ``device`` and wrap it for ``strategy`` (``none`` or ``ddp``).

    Call after surgery (algorithms at INIT): DDP registers gradient hooks on the parameters it
    sees at construction.
    """
    model = model.to(device)
    if strategy == "none":
        return model
    if strategy == "ddp":
        if not dist.is_initialized():
            raise RuntimeError("strategy 'ddp' needs a torch.distributed process group (started by Ray Train)")
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    raise ValueError(f"unknown parallelism strategy {strategy!r}; known: none, ddp")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP wrapper (or the model itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def no_sync(model: torch.nn.Module, skip: bool) -> ContextManager:
    """DDP's ``no_sync`` when ``skip`` (accumulating microbatches), else nothing."""
    if skip and isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


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
