"""Module surgery: replace modules by type, and keep existing optimizers pointing at the model.

A *policy* maps a module type to a replacement function ``fn(module) -> module | None``:
``None`` (or the module itself, changed in place) means "keep this one". Types match exactly,
not by subclass, so a replacement that subclasses the type it replaces is never replaced again
when surgery runs twice.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

import torch

ReplacementFunction = Callable[[torch.nn.Module], "torch.nn.Module | None"]


def replace_modules(model: torch.nn.Module, policies: Mapping[type[torch.nn.Module], ReplacementFunction], *,
                    optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
                    ) -> list[tuple[torch.nn.Module, torch.nn.Module]]:
    """Apply ``policies`` to every module of ``model`` (the root included), in place.

    Returns the ``(old, new)`` pairs of modules that were swapped or changed in place (for an
    in-place change ``old is new``). The root can be changed in place but not swapped. With
    ``optimizers``, parameters that left the model are removed from them and new ones added
    to the param group that held the replaced module's parameters.
    """
    params_before = list(model.parameters())
    replaced: list[tuple[torch.nn.Module, torch.nn.Module]] = []
    # Snapshot first: replacements must not be visited (and replaced again) in the same pass.
    for name, module in list(model.named_modules()):
        policy = policies.get(type(module))
        if policy is None:
            continue
        new = policy(module)
        if new is None:
            continue
        if new is not module:
            if not name:
                raise ValueError(f"surgery on {type(model).__name__} must change the root module in place")
            parent_name, _, child_name = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child_name, new)
        replaced.append((module, new))
    if optimizers is not None and replaced:
        _update_optimizers(optimizers, params_before, list(model.parameters()), replaced)
    return replaced


def _update_optimizers(optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
                       before: Iterable[torch.nn.Parameter], after: Iterable[torch.nn.Parameter],
                       replaced: list[tuple[torch.nn.Module, torch.nn.Module]]) -> None:
    before_ids = {id(p) for p in before}
    after_list = list(after)
    after_ids = {id(p) for p in after_list}
    removed = before_ids - after_ids
    added = [p for p in after_list if id(p) not in before_ids]
    if isinstance(optimizers, torch.optim.Optimizer):
        optimizers = [optimizers]
    for optimizer in optimizers:
        # Where each new parameter goes: the group that held a parameter of the module it replaced.
        group_of = {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
        targets: dict[int, int] = {}
        for old, new in replaced:
            group = next((group_of[id(p)] for p in old.parameters(recurse=True) if id(p) in group_of), 0)
            for p in new.parameters():
                targets.setdefault(id(p), group)
        for group in optimizer.param_groups:
            group["params"] = [p for p in group["params"] if id(p) not in removed]
        for p in list(optimizer.state):
            if id(p) in removed:
                del optimizer.state[p]
        for p in added:
            optimizer.param_groups[targets.get(id(p), 0)]["params"].append(p)


def count_instances(model: torch.nn.Module, module_type: type[torch.nn.Module] | tuple[type, ...]) -> int:
    """How many submodules of ``model`` (the root included) are instances of ``module_type``."""
    return sum(isinstance(m, module_type) for m in model.modules())
