"""Comparing checkpoints tensor by tensor, and making a run folder look interrupted."""

from __future__ import annotations

from typing import Any

import torch

from workers.checkpoint import Checkpointer, read_checkpoint, storage_for


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    if isinstance(tree, (list, tuple)):
        out = {}
        for index, value in enumerate(tree):
            out.update(flatten(value, f"{prefix}{index}."))
        return out
    return {prefix.rstrip("."): tree}


def assert_bitwise_equal(url_a: str, url_b: str) -> int:
    """Every model and optimizer tensor of two checkpoints is identical; returns how many."""
    a, b = flatten(read_checkpoint(url_a)), flatten(read_checkpoint(url_b))
    assert a.keys() == b.keys()
    tensors = [key for key, value in a.items() if isinstance(value, torch.Tensor)]
    unequal = [key for key in tensors if not torch.equal(a[key], b[key])]
    assert not unequal, f"{len(unequal)} of {len(tensors)} tensors differ, e.g. {unequal[:5]}"
    assert tensors
    return len(tensors)


def latest_url(checkpoints_url: str) -> str:
    info = Checkpointer(checkpoints_url, fingerprint={}).latest_committed()
    assert info is not None, f"no committed checkpoint under {checkpoints_url}"
    return info.url


def forget_after(checkpoints_url: str, step: int) -> None:
    """Delete every checkpoint newer than ``step``: the folder of a run that stopped there."""
    checkpointer = Checkpointer(checkpoints_url, fingerprint={})
    for info in checkpointer.checkpoints():
        if info.step > step:
            storage_for(checkpoints_url).remove(info.url)
