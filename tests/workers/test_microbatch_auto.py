"""``microbatch_size: auto`` on two ranks of a real gloo group (spawned processes, no Ray): an
out-of-memory error on one rank makes both ranks halve their microbatches and retry the batch
together, and training ends where full-batch training ends."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from api.specs import RunSpec
from tests.workers.dist_helpers import spawn_ranks
from tests.workers.helpers_specs import tiny_spec

pytestmark = pytest.mark.integration


class _OutOfMemoryInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("CUDA out of memory (injected in backward)")


def _rank_main(rank: int, init_file: str, spec_json: str, out_dir: str, oom_rank: int, oom_above: int,
               oom_in: str) -> None:
    import torch.distributed as dist

    from workers.parallel import fsdp_blocks, unwrap
    from workers.reporter import MemorySink
    from workers.trainer import Trainer, process_settings

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        spec = RunSpec.model_validate_json(spec_json)
        with process_settings(spec):
            trainer = Trainer(spec, sink=MemorySink())
            model = unwrap(trainer.state.model)
            # Under FSDP the OOM strikes inside the model, between collectives: in the last
            # block's forward (the other rank goes on to backward's all-gathers), or in the first
            # block's backward (the other rank goes on to its reduce-scatter).
            target = model
            if spec.parallelism.strategy == "fsdp":
                target = fsdp_blocks(model)[-1 if oom_in == "forward" else 0]
            forward, sizes = target.forward, []

            def forward_that_runs_out_of_memory(x):
                runs_out = model.training and rank == oom_rank and x.shape[0] > oom_above
                if model.training:
                    sizes.append(x.shape[0])
                if runs_out and oom_in == "forward":
                    raise torch.OutOfMemoryError("CUDA out of memory (injected)")
                out = forward(x)
                return _OutOfMemoryInBackward.apply(out) if runs_out else out

            target.forward = forward_that_runs_out_of_memory
            trainer.fit()
            full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
        if rank == 0:
            torch.save(full, Path(out_dir) / "params.pt")
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({
            "sizes": sizes, "microbatch_size": trainer.microbatches.size, "batches": trainer.state.timestamp.batch}))
        dist.barrier()  # tear down together (see tests/workers/dist_helpers.py)
    finally:
        dist.destroy_process_group()


def run_two_ranks(spec: RunSpec, out_dir: Path, *, oom_rank: int = -1, oom_above: int = 1 << 30,
                  oom_in: str = "forward", timeout_s: float = 180) -> tuple[dict, list[dict]]:
    """Train on two spawned ranks; rank ``oom_rank`` runs out of memory (in ``oom_in``: forward
    or backward) on training microbatches larger than ``oom_above``. Returns rank 0's final
    parameters and each rank's record."""
    out_dir.mkdir(parents=True)
    init_file = out_dir / f"pg-{os.urandom(4).hex()}"
    spawn_ranks(_rank_main, [(rank, str(init_file), spec.model_dump_json(), str(out_dir), oom_rank, oom_above, oom_in)
                             for rank in range(2)], timeout_s=timeout_s)
    records = [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(2)]
    return torch.load(out_dir / "params.pt"), records


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_an_out_of_memory_error_on_one_rank_makes_both_halve_and_training_matches_the_full_batch(strategy, tmp_path):
    body = dict(max_duration="3ba", deterministic=True, parallelism={"strategy": strategy, "num_workers": 2})
    reference, _ = run_two_ranks(tiny_spec(**body), tmp_path / "full")
    for oom_in in ("forward", "backward"):
        params, records = run_two_ranks(tiny_spec(microbatch_size="auto", **body), tmp_path / oom_in,
                                        oom_rank=1, oom_above=2, oom_in=oom_in)

        # Each rank's batch is 8: 8 and 4 run out of memory on rank 1, then both train in 2s.
        assert [r["microbatch_size"] for r in records] == [2, 2], oom_in
        assert records[1]["sizes"][:3] == [8, 4, 2], oom_in
        assert records[0]["sizes"][0] == 8 and records[0]["sizes"][-12:] == [2] * 12, oom_in  # 3 batches x 4
        assert [r["batches"] for r in records] == [3, 3]
        assert params.keys() == reference.keys()
        for key in reference:
            torch.testing.assert_close(params[key], reference[key], rtol=1e-5, atol=1e-6,
                                       msg=f"{key} after an OOM in {oom_in}")
