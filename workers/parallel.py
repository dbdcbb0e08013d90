"""Data parallelism: the device, wrapping the model, and the few collectives the loop needs.

``ddp`` replicates the model; ``fsdp`` shards parameters, gradients and optimizer state with
FSDP2 (``fully_shard`` on every block, then on the root). Mixed precision comes from autocast
in the loop for every strategy: FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16)`` fails
on CPU with BatchNorm models ("expected scalar type BFloat16 but found Float", torch 2.14 on
gloo), while FSDP2 with autocast bf16/fp16 (fp16 with a CPU ``GradScaler``) works everywhere.

The process group is created by whoever starts the workers -- Ray Train's ``TorchConfig``
(gloo on CPU, nccl on GPU, chosen in ``workers.ray_train`` from ``use_gpu``), or a sweep's trial
actor for its peer ranks (gloo, ``workers.tune.actor_ranks``) -- never here.
Without a process group everything runs as a single rank.
"""

from __future__ import annotations

import contextlib
import sys
from typing import ContextManager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from algorithms.distributed import average_across_ranks

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
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # FSDP2 shards only contiguous parameters ("FSDP does not support non-contiguous parameters
    # yet", torch 2.14): ChannelsLast's NHWC weights go back to NCHW here. Its NHWC inputs still
    # make the convolutions (and so the activations) run NHWC.
    # Only those: another non-contiguous parameter may share storage on purpose, and FSDP's own
    # error names it.
    for param in model.parameters():
        if param.dim() == 4 and not param.is_contiguous() and param.is_contiguous(memory_format=torch.channels_last):
            param.data = param.data.contiguous()
    if device.type == "cpu":
        # The default (gloo) group itself: where CUDA is visible, init_device_mesh("cpu") makes a
        # new gloo group on every call (torch 2.14, DeviceMesh's "mesh_default"), one more per
        # trial for a sweep's ranks that keep their process group (workers.tune.actor_ranks).
        mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    else:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in fsdp_blocks(model):
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def is_fsdp(model: torch.nn.Module) -> bool:
    # Asked per microbatch (``no_sync``): until FSDP's module is imported no model can be sharded,
    # and an ``import`` statement here would cost more than the check itself.
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


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
    The collective is ``algorithms.distributed.average_across_ranks`` (SWA's too).
    """
    average_across_ranks(buffer.data for buffer in unwrap(model).buffers() if buffer.is_floating_point())


# --- out-of-memory agreement (microbatch_size: auto on several ranks) ----------------------
class OutOfMemoryOnAnotherRank(torch.OutOfMemoryError):
    """Raised at a sync point on a rank that did not run out of memory itself, so that it
    abandons the batch together with the rank that did."""


class OomAgreement:
    """Lets every rank agree, once per batch, whether any rank ran out of memory.

    A rank that runs out of memory leaves the batch early; the others are still computing and
    would next block in a collective (a DDP buffer broadcast, an FSDP all-gather or
    reduce-scatter) the first rank never joins. So every such collective is preceded by a sync
    point, armed only while a batch is being tried, where all ranks exchange ``[ran_out,
    busy]``; a rank that learns of an out-of-memory error elsewhere raises
    ``OutOfMemoryOnAnotherRank``. A rank whose attempt has ended calls ``agree``, which keeps
    answering the sync points of busy ranks until every rank has ended (the scheme of
    Composer's auto microbatching).

    Sync points: before the forward of the DDP wrapper (its buffer broadcast; the caller defers
    DDP's gradient all-reduce to ``average_gradients`` after ``agree``), and for FSDP before
    each module's forward (all-gather), before its backward (all-gather) and before its
    gradient reduce-scatter. Each is a 2-element all-reduce and a host sync: the price of
    ``auto`` on several ranks, paid only while it is on.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.device = device
        self.armed = False
        self._callback_queued = False
        fsdp_modules = [m for m in model.modules() if is_fsdp(m)]
        self._handles = [m.register_forward_pre_hook(self._sync_point, prepend=True)
                         for m in fsdp_modules or [model]]
        for module in fsdp_modules:
            # Runs after FSDP's pre-forward, so in backward our function runs before FSDP's
            # post-backward (its reduce-scatter).
            self._handles.append(module.register_forward_pre_hook(self._guard_reduce_scatter))
            # Runs before FSDP's post-forward, so our gradient hook on the outputs runs before
            # FSDP's pre-backward (its all-gather).
            self._handles.append(module.register_forward_hook(self._guard_backward, prepend=True))

    @contextlib.contextmanager
    def attempt(self):
        """Arm the sync points for one try of a batch."""
        self.armed = True
        self._callback_queued = False
        try:
            yield
        finally:
            self.armed = False

    def _exchange(self, ran_out: bool, busy: bool) -> tuple[bool, bool]:
        flags = torch.tensor([int(ran_out), int(busy)], device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        any_ran_out, any_busy = flags.tolist()  # host sync: the answer decides control flow
        return bool(any_ran_out), bool(any_busy)

    def _sync_point(self, *_: object) -> None:
        if not self.armed:
            return
        any_ran_out, _ = self._exchange(False, True)
        if any_ran_out:
            raise OutOfMemoryOnAnotherRank("another rank ran out of memory on this batch")

    def _guard_reduce_scatter(self, module: torch.nn.Module, args: tuple) -> tuple | None:
        if not (self.armed and torch.is_grad_enabled()):
            return None
        return tuple(_SyncInBackward.apply(self, a) if isinstance(a, torch.Tensor) and a.requires_grad else a
                     for a in args)

    def _guard_backward(self, module: torch.nn.Module, args: tuple, output: object) -> None:
        if not (self.armed and torch.is_grad_enabled()):
            return
        tensors = [output] if isinstance(output, torch.Tensor) else [
            t for t in (output if isinstance(output, (tuple, list)) else ()) if isinstance(t, torch.Tensor)]
        for tensor in tensors:
            if tensor.requires_grad:
                tensor.register_hook(self._sync_before_backward)

    def _sync_before_backward(self, grad: torch.Tensor) -> None:
        if not self._callback_queued:
            # FSDP reduce-scatters the gradients of modules whose inputs need none (the first
            # block) in a callback at the end of backward; ours, queued first, runs before it.
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._sync_at_end_of_backward)
        self._sync_point()

    def _sync_at_end_of_backward(self) -> None:
        self._callback_queued = False
        self._sync_point()

    def agree(self, ran_out: bool) -> bool:
        """Call once this rank's attempt has ended: whether any rank ran out of memory."""
        any_ran_out = ran_out
        while True:
            others_ran_out, any_busy = self._exchange(ran_out, False)
            any_ran_out = any_ran_out or others_ran_out
            if not any_busy:
                return any_ran_out

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class _SyncInBackward(torch.autograd.Function):
    """Identity whose backward is a sync point of ``agreement``."""

    @staticmethod
    def forward(ctx, agreement: OomAgreement, tensor: torch.Tensor) -> torch.Tensor:
        ctx.agreement = agreement
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.agreement._sync_point()
        return None, grad


# Gradients averaged per bucket of this many bytes: bounded extra memory, few collectives.
GRADIENT_BUCKET_BYTES = 25 << 20


def average_gradients(model: torch.nn.Module) -> None:
    """Average ``.grad`` over ranks in place, as DDP's reducer would (divide, then sum), for
    steps whose gradient sync was deferred with ``no_sync``."""
    world_size = rank_and_world_size()[1]
    if world_size == 1:
        return
    grads = [p.grad for p in unwrap(model).parameters() if p.grad is not None]
    bucket: list[torch.Tensor] = []
    size = 0
    for i, grad in enumerate(grads):
        bucket.append(grad)
        size += grad.numel() * grad.element_size()
        last = i == len(grads) - 1
        if size >= GRADIENT_BUCKET_BYTES or last or grads[i + 1].dtype != grad.dtype:
            flat = torch.cat([g.reshape(-1) for g in bucket]).div_(world_size)
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            bucket, size = [], 0


def reset_after_failed_step(model: torch.nn.Module) -> None:
    """Return FSDP to rest after a forward or backward abandoned midway (out of memory): a
    module left unsharded, or in its backward state, would skip collectives the other ranks
    make (FSDP2's ``reset_iter_state``); and gradients left on unsharded parameters by a
    backward whose reduce-scatter never ran would be added to the retry's (FSDP2 internals,
    torch 2.14)."""
    if not is_fsdp(model):
        return
    model.reset_iter_state()
    for module in model.modules():
        if is_fsdp(module):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                for fsdp_param in group.fsdp_params:
                    fsdp_param.unsharded_accumulated_grad = None
                    if getattr(fsdp_param, "_unsharded_param", None) is not None:
                        fsdp_param._unsharded_param.grad = None
