"""A fork's first attempt: load another run's checkpoint as the starting point of new training.

The service resolves the fork's ``from`` to one committed checkpoint of the parent (same
project) and hands its URL over in ``RunView.fork``; this module loads it into a freshly built
(surgery replayed, wrapped) model. Unlike a resume it takes only what a new run should inherit:

- the model weights, always (the checkpoint's fingerprint must match but for the optimizer);
- the optimizer state (momentum, Adam moments) when the optimizer is the same kind, with the
  fork's own hyperparameters (lr, weight decay, betas, ...) put back over the parent's;
- the state of the algorithms both runs have (``trainer.pt``'s ``algorithms``), returned for the
  trainer to apply.

The step counter, data position, LR schedule, grad scaler and RNG start afresh: a fork is new
training from those weights (as in Determined), counted from batch 0.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict, set_model_state_dict,
                                                     set_state_dict)

from workers.checkpoint.contents import check_compatible
from workers.checkpoint.manager import MARKER, _distributed, _from_bytes, _mesh_and_device, _redistribute
from workers.checkpoint.reader import ParallelFsspecReader
from workers.checkpoint.storage import FsspecStorage, join

log = logging.getLogger(__name__)


def load_fork_source(url: str, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     fingerprint: dict[str, Any], load_optimizer: bool, unshaped: tuple[str, ...] = ()
                     ) -> dict[str, Any]:
    """Load the checkpoint folder ``url`` into ``model`` (and ``optimizer`` with
    ``load_optimizer``) on every rank; return its saved algorithm states by name. Raises
    ``IncompatibleCheckpoint`` naming each shape-bearing field that differs; the fingerprint's
    ``unshaped`` fields may differ (text's ``in_channels`` is its sequence length, which no
    tensor's shape depends on: a fork may train at another one)."""
    storage = FsspecStorage(url)
    meta = json.loads(storage.read_bytes(join(url, MARKER)))
    saved = {k: v for k, v in meta["fingerprint"].items() if k not in unshaped}
    same_optimizer = saved.pop("optimizer", None) == fingerprint.get("optimizer")
    check_compatible(saved, {k: v for k, v in fingerprint.items() if k not in ("optimizer", *unshaped)}, url=url)
    load_optimizer = load_optimizer and same_optimizer
    hyperparameters = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    if load_optimizer:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
    else:  # get_state_dict would initialize the optimizer's state (a zero step): leave it untouched
        state = {"model": get_model_state_dict(model)}
    dcp.load(state, storage_reader=ParallelFsspecReader(url), no_dist=not _distributed())
    if load_optimizer:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        # The parent's param groups came with its state; the fork's spec says the hyperparameters.
        for group, own in zip(optimizer.param_groups, hyperparameters):
            group.update(own)
    else:
        set_model_state_dict(model, state["model"])
    trainer_state = _redistribute(_from_bytes(storage.read_bytes(join(url, "trainer.pt")), join(url, "trainer.pt")),
                                  *_mesh_and_device(model))
    log.info("loaded %s from %s (batch %s)", "weights and optimizer state" if load_optimizer else "weights", url,
             meta.get("step"))
    return dict(trainer_state.get("algorithms") or {})
