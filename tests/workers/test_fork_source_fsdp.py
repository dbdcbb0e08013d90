"""A fork loads its parent's checkpoint onto two FSDP ranks (spawned gloo ranks, no Ray): a
one-worker parent's weights and Adam moments reshard onto the fork, which keeps its own lr."""

from __future__ import annotations

import os

import pytest
import torch

from api.lineage import ForkInfo
from tests.workers.checkpoint_helpers import latest_url
from tests.workers.dist_helpers import spawn_ranks
from tests.workers.test_distributed_checkpoints import resnet_spec
from workers.checkpoint import read_checkpoint
from workers.reporter import MemorySink
from workers.trainer import train

pytestmark = pytest.mark.integration


def _fork_on_rank(rank: int, world_size: int, init_file: str, spec_json: str, fork_json: str, out: str) -> None:
    import torch.distributed as dist

    from api.specs import RunSpec
    from workers.export import full_model_state
    from workers.trainer import Trainer

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        trainer = Trainer(RunSpec.model_validate_json(spec_json), fork=ForkInfo.model_validate_json(fork_json))
        trainer.resume()
        weights = full_model_state(trainer.state.model)
        group = trainer.state.optimizer.param_groups[0]
        # A fresh optimizer's moments are zeros (get_state_dict initializes them); loaded ones are not.
        moments = sum(float(state["exp_avg"].to_local().abs().sum()) for state in trainer.state.optimizer.state.values())
        if rank == 0:
            torch.save({"weights": weights, "lr": group["initial_lr"], "moments": moments}, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_a_one_worker_parent_forks_onto_two_fsdp_ranks_with_its_moments_and_the_new_lr(tmp_path):
    parent = resnet_spec("none", 1, max_duration="2ba", checkpoint={"interval": "2ba", "keep_last": 2})
    train(parent, checkpoint_url=f"file://{tmp_path}/parent", sink=MemorySink())
    source = latest_url(f"file://{tmp_path}/parent")
    child = resnet_spec("fsdp", 2, optimizer={"name": "adamw", "lr": 0.002})
    fork = ForkInfo(from_="latest", checkpoint_url=source, step=2, load_optimizer=True)
    out, init_file = tmp_path / "fork.pt", tmp_path / f"pg-{os.urandom(4).hex()}"
    spawn_ranks(_fork_on_rank, [(rank, 2, str(init_file), child.model_dump_json(), fork.model_dump_json(by_alias=True),
                                 str(out)) for rank in range(2)], timeout_s=240)
    loaded, saved = torch.load(out), read_checkpoint(source)
    assert loaded["lr"] == 0.002  # the fork's lr, not the parent's 0.01
    assert saved["model"].keys() <= loaded["weights"].keys()
    assert all(torch.equal(loaded["weights"][key], saved["model"][key]) for key in saved["model"])
    assert loaded["moments"] > 0  # rank 0's shard of the parent's Adam moments
