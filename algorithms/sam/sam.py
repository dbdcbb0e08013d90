"""SAM (Foret et al. 2021): step with the gradient taken at the worst nearby weights.

Each SAM step takes two forward/backward passes: the gradient ``g`` at the weights ``w``
gives the ascent ``e = rho * g / (|g| + epsilon)``; the gradient at ``w + e`` is then applied
to ``w`` by the base optimizer. Minimizing the loss of the neighbourhood's worst point prefers
flat minima, which generalize better.

Two forms: ``SAMOptimizer`` wraps any optimizer in a plain loop (``step(closure)`` as in
Composer), and the ``SAM`` algorithm, which needs no optimizer change: at ``AFTER_TRAIN_BATCH``
(the batch's gradient synced across ranks and unscaled) it ascends, asks the trainer to run the
batch's forward/backward again (``state.recompute_gradients``: every microbatch, DDP's
all-reduce), descends back and leaves the new gradient for the step. With an fp16 GradScaler
the second gradient is unscaled here; if it is not finite, the step falls back to the first
gradient (without a host sync), so an overflow never reaches the weights.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event


def _global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    # FSDP2: the norm of DTensor shards is a DTensor; every rank needs the whole value.
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


@torch.no_grad()
def ascend(parameters: list[torch.Tensor], rho: float = 0.05, epsilon: float = 1e-12
           ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Move each parameter with a gradient by ``e = rho * grad / (|grad| + epsilon)`` (global
    norm over all of them); returns ``(parameter, its value before)`` pairs for ``descend``."""
    with_grads = [p for p in parameters if p.grad is not None]
    if not with_grads:
        return []
    scale = rho / (_global_norm([p.grad for p in with_grads]) + epsilon)
    moved = []
    for p in with_grads:
        moved.append((p, p.detach().clone()))  # restored by copy: w + e - e is not always w in floating point
        p.add_(p.grad * scale.to(p.grad.dtype))
    return moved


@torch.no_grad()
def descend(moved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Undo ``ascend``: put back each parameter's value from before the ascent, exactly."""
    for p, before in moved:
        p.copy_(before)


class SAMOptimizer(torch.optim.Optimizer):
    """Wraps ``base_optimizer``: ``step(closure)`` runs SAM every ``interval`` steps.

    ``closure()`` must zero the gradients, run forward and backward and return the loss (as in
    ``torch.optim.LBFGS``). Its state is the base optimizer's plus ``global_step``.
    """

    def __init__(self, base_optimizer: torch.optim.Optimizer, rho: float = 0.05, epsilon: float = 1e-12,
                 interval: int = 1):
        if rho < 0:
            raise ValueError(f"rho {rho} must be >= 0")
        if interval < 1:
            raise ValueError(f"interval {interval} must be >= 1")
        self.base_optimizer, self.rho, self.epsilon, self.interval = base_optimizer, rho, epsilon, interval
        self.global_step = 0
        super().__init__(base_optimizer.param_groups, {})
        self.state = base_optimizer.state  # one state: momentum buffers live in the base optimizer

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        if closure is None:
            raise ValueError("SAMOptimizer.step needs a closure that runs forward and backward")
        loss = torch.enable_grad()(closure)()
        if (self.global_step + 1) % self.interval == 0:
            params = [p for group in self.param_groups for p in group["params"]]
            moved = ascend(params, self.rho, self.epsilon)
            torch.enable_grad()(closure)()
            descend(moved)
        self.base_optimizer.step()
        self.global_step += 1
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"base": self.base_optimizer.state_dict(), "global_step": self.global_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.base_optimizer.load_state_dict(state_dict["base"])
        self.global_step = int(state_dict["global_step"])


class SAM(Algorithm):
    """Replaces the batch's gradient by SAM's at AFTER_TRAIN_BATCH, every ``interval`` steps."""

    name = "sam"
    events = frozenset({Event.AFTER_TRAIN_BATCH})

    def __init__(self, rho: float = 0.05, epsilon: float = 1e-12, interval: int = 1):
        if not rho > 0:
            raise ValueError(f"rho {rho} must be > 0")
        if interval < 1:
            raise ValueError(f"interval {interval} must be >= 1")
        self.rho, self.epsilon, self.interval = rho, epsilon, interval

    def apply(self, event: Event, state: AlgorithmState) -> None:
        # The step counter is the timestamp (checkpointed with the run), as Composer's global_step.
        if (state.timestamp.batch + 1) % self.interval:
            return
        params = [p for p in state.model.parameters() if p.grad is not None]
        scaler = getattr(state, "scaler", None)
        fp16 = scaler is not None and scaler.is_enabled()
        first = [p.grad.clone() for p in params] if fp16 else []
        moved = ascend(params, self.rho, self.epsilon)
        state.recompute_gradients()
        descend(moved)
        if fp16:
            _unscale_or_fall_back(params, first, scaler.get_scale())


@torch.no_grad()
def _unscale_or_fall_back(params: list[torch.Tensor], first: list[torch.Tensor], scale: float) -> None:
    """Unscale the second pass's gradients; keep the first pass's (already unscaled and checked by
    the GradScaler) if any second-pass value is not finite, on any rank."""
    for p, g1 in zip(params, first):
        if p.grad is None:  # no gradient in the second pass (e.g. a block StochasticDepth skipped)
            p.grad = torch.zeros_like(g1)
    # FSDP2 shards are DTensors: work on the local shards, agree on finiteness across ranks.
    grads = [_local(p.grad) for p in params]
    first = [_local(g) for g in first]
    torch._foreach_mul_(grads, 1.0 / scale)
    finite = torch.stack([torch.isfinite(g).all() for g in grads]).all()
    if any(hasattr(p.grad, "to_local") for p in params) and dist.is_available() and dist.is_initialized():
        flag = finite.to(torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        finite = flag.bool()
    for g2, g1 in zip(grads, first):
        g2.copy_(torch.where(finite, g2, g1))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor
