"""DDP and FSDP checkpoints on real gloo process groups (spawned ranks, no Ray): exact resume on
the same world size, and elastic resume on another (2→1, 1→2), with sync and async saves; a
checkpointer whose peer died before it fails at once."""

from __future__ import annotations

import shutil

import pytest

from tests.workers.checkpoint_helpers import assert_bitwise_equal, latest_url
from tests.workers.dist_helpers import run_on_ranks
from tests.workers.helpers_specs import tiny_spec

pytestmark = pytest.mark.integration


def resnet_spec(strategy: str, num_workers: int, **overrides):
    """cifar_resnet20 (BatchNorm, residual blocks for FSDP to shard one by one), 8 batches."""
    body = dict(model={"name": "cifar_resnet20", "params": {"width": 4}}, max_duration="8ba", deterministic=True,
                optimizer={"name": "adamw", "lr": 0.01}, scheduler={"name": "cosine"},
                checkpoint={"interval": "2ba", "keep_last": 10},
                parallelism={"strategy": strategy, "num_workers": num_workers})
    body.update(overrides)
    return tiny_spec(**body)


def copy_checkpoint(tmp_path, name: str, source: str, target: str) -> str:
    """A run folder holding only ``source``'s checkpoint ``name``: a run that stopped after it."""
    shutil.copytree(tmp_path / source / name, tmp_path / target / name)
    return f"file://{tmp_path}/{target}"


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_resume_on_the_same_world_size_is_exact_and_on_another_one_finishes(strategy, tmp_path):
    async_save = strategy == "fsdp"  # covers async saves of sharded state as well
    spec = resnet_spec(strategy, 2, checkpoint={"interval": "2ba", "keep_last": 10, "async_save": async_save})
    whole = f"file://{tmp_path}/whole"
    first = run_on_ranks(spec, world_size=2, checkpoint_url=whole, work_dir=tmp_path)
    assert [(c["step"], c["committed"], c["world_size"]) for c in first["checkpoints"]] == \
        [(2, True, 2), (4, True, 2), (6, True, 2), (8, True, 2)]
    assert first["groups_freed_by_close"] == 1  # the checkpointer's own gloo group

    # 2 → 2 from batch 4: bitwise equal to the uninterrupted run.
    cut = copy_checkpoint(tmp_path, "ep1-ba4", "whole", "cut")
    resumed = run_on_ranks(spec, world_size=2, checkpoint_url=cut, work_dir=tmp_path)
    assert resumed["resumed_from"] == f"{cut}/ep1-ba4" and resumed["loss_steps"] == [5, 6, 7, 8]
    assert_bitwise_equal(latest_url(whole), latest_url(cut))

    # 2 → 1 (elastic): the 2-worker checkpoint reshards onto one worker and training finishes.
    one = resnet_spec(strategy, 1, checkpoint=spec.checkpoint.model_dump())
    shrunk = copy_checkpoint(tmp_path, "ep1-ba4", "whole", "shrunk")
    elastic = run_on_ranks(one, world_size=1, checkpoint_url=shrunk, work_dir=tmp_path)
    assert elastic["resumed_from"] == f"{shrunk}/ep1-ba4" and elastic["loss_steps"] == [5, 6, 7, 8]
    assert elastic["checkpoints"][-1]["world_size"] == 1 and elastic["metrics"]["time/batch"] == 8
    if strategy == "fsdp":
        return

    # 1 → 2: the one-worker checkpoint of batch 6 resumes on two DDP workers.
    grown = copy_checkpoint(tmp_path, "ep1-ba6", "shrunk", "grown")
    two = run_on_ranks(spec, world_size=2, checkpoint_url=grown, work_dir=tmp_path)
    assert two["resumed_from"] == f"{grown}/ep1-ba6" and two["loss_steps"] == [7, 8]
    assert two["checkpoints"][-1]["world_size"] == 2 and two["metrics"]["time/batch"] == 8


def _checkpointer_after_a_dead_peer(rank: int, init_file: str, url: str, result_path: str) -> None:
    """Rank 1 dies right after the group is made; rank 0 then makes a checkpointer."""
    import os
    import time
    from pathlib import Path

    import torch.distributed as dist

    from workers.checkpoint import Checkpointer

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    if rank == 1:
        os._exit(0)
    started = time.monotonic()
    try:
        Checkpointer(url, fingerprint={}, rank=0, world_size=2)
        outcome = "made"
    except RuntimeError as exc:
        outcome = str(exc)
    Path(result_path).write_text(f"{time.monotonic() - started:.1f} {outcome}")


def test_a_checkpointer_fails_at_once_when_a_peer_died_before_it(tmp_path):
    # Making the checkpointer's gloo group waits on the store for every rank (30 minutes for a
    # dead one); its barrier first fails as soon as the peer's connection is gone.
    from tests.workers.dist_helpers import spawn_ranks

    result = tmp_path / "result"
    spawn_ranks(_checkpointer_after_a_dead_peer,
                [(rank, str(tmp_path / "pg"), f"file://{tmp_path}/ck", str(result)) for rank in (0, 1)],
                timeout_s=120)
    seconds, outcome = result.read_text().split(" ", 1)
    # "Connection closed by peer" or "Connection reset by peer", as the peer's socket went.
    assert float(seconds) < 60 and "by peer" in outcome, outcome
