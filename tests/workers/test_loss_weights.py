"""Padded text split into microbatches and over ranks trains on the whole batch's gradient: each
part's mean loss weighs by its kept tokens, not its items (``workers.loss_weights``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from api.specs import RunSpec
from tests.workers.dist_helpers import spawn_ranks
from workers.loss_weights import kept_tokens, microbatch_shares

SEQ_LEN, VOCAB, BATCH = 16, 84, 8


def text_spec(**overrides) -> str:
    body = {"name": "padded", "model": {"name": "gpt_small", "params": {"n_layer": 1, "n_head": 2, "d_model": 16,
                                                                       "max_seq_len": SEQ_LEN}},
            "data": {"train": {"name": "shakespeare", "seq_len": SEQ_LEN, "limit": 64}, "batch_size": BATCH},
            "optimizer": {"name": "sgd", "lr": 0.1}, "max_duration": "1ba", "seed": 3, **overrides}
    return RunSpec.model_validate(body).model_dump_json()


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """8 sequences padded unevenly: item i keeps its first 16 - 2*i targets (16, 14, ..., 2), so
    the first half of the batch holds 52 of its 72 kept tokens, not half of them."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, VOCAB, (BATCH, SEQ_LEN), generator=generator)
    targets = torch.randint(0, VOCAB, (BATCH, SEQ_LEN), generator=generator)
    for i in range(BATCH):
        targets[i, SEQ_LEN - 2 * i:] = -100
    return inputs, targets


def gradients_after_one_batch(spec_json: str, inputs: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
    from workers.trainer import Trainer, process_settings

    spec = RunSpec.model_validate_json(spec_json)
    with process_settings(spec):
        trainer = Trainer(spec)
        trainer.train_batch(inputs, targets)
        # FSDP: each rank holds a shard of each gradient; the whole one is a collective.
        return [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()
                for p in trainer.state.model.parameters()]


def test_shares_are_of_kept_tokens_for_text_and_of_items_otherwise():
    _, targets = padded_batch()
    bounds = [(0, 3), (3, 6), (6, 8)]
    assert kept_tokens(targets) == sum(SEQ_LEN - 2 * i for i in range(BATCH)) == 72
    by_tokens = microbatch_shares(targets, bounds, by_tokens=True)
    assert [round(float(share) * 72) for share in by_tokens] == [16 + 14 + 12, 10 + 8 + 6, 4 + 2]
    assert microbatch_shares(targets, bounds, by_tokens=False) == [3 / 8, 3 / 8, 2 / 8]
    assert microbatch_shares(targets, [(0, 8)], by_tokens=True) == [1.0]
    dense = torch.zeros(2, SEQ_LEN, VOCAB)
    dense[0, :5, 1] = 1.0  # a row of zeros is an ignored position after label smoothing
    assert kept_tokens(dense) == 5


def test_microbatches_of_padded_text_accumulate_the_whole_batch_gradient():
    inputs, targets = padded_batch()
    whole = gradients_after_one_batch(text_spec(), inputs, targets)
    micro = gradients_after_one_batch(text_spec(microbatch_size=3), inputs, targets)  # 3 + 3 + 2 items
    for full, accumulated in zip(whole, micro):
        assert torch.allclose(full, accumulated, atol=1e-6, rtol=1e-4)


def _rank_gradients(rank: int, init_file: str, spec_json: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        inputs, targets = padded_batch()
        half = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)  # rank 0 holds 52 kept tokens, rank 1 20
        grads = gradients_after_one_batch(spec_json, inputs[half], targets[half])
        if rank == 0:
            Path(out).write_text(json.dumps([g.flatten().tolist() for g in grads]))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("strategy,microbatch_size", [("ddp", None), ("ddp", 3), ("ddp", "auto"), ("fsdp", None),
                                                     ("fsdp", 3)])
def test_two_ranks_of_padded_text_train_on_the_whole_batch_gradient(strategy, microbatch_size, tmp_path):
    """Rank 0 holds 52 of the batch's 72 kept tokens: averaging the ranks' mean losses equally
    would weigh each of rank 1's tokens 2.6 times as much as one of rank 0's. Each rank's 4
    items go whole, or as microbatches of 3 and 1; ``auto`` on several ranks averages DDP's
    gradients itself, after the ranks agreed that the batch fit."""
    inputs, targets = padded_batch()
    whole = gradients_after_one_batch(text_spec(), inputs, targets)
    spec = text_spec(parallelism={"strategy": strategy, "num_workers": 2}, microbatch_size=microbatch_size)
    out = tmp_path / "grads.json"
    spawn_ranks(_rank_gradients, [(rank, str(tmp_path / "pg"), spec, str(out)) for rank in range(2)], timeout_s=180)
    ranks = [torch.tensor(g) for g in json.loads(out.read_text())]
    assert len(ranks) == len(whole)
    for full, averaged in zip(whole, ranks):
        assert torch.allclose(full.flatten(), averaged, atol=1e-6, rtol=1e-4)
