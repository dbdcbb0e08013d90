"""FSDP2 with fp16 autocast and a GradScaler, plus EMA and SWA, on two gloo ranks: a run resumed
from a checkpoint ends bitwise equal to the uninterrupted run, averages and scaler included."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.workers.checkpoint_helpers import assert_bitwise_equal, latest_url
from tests.workers.dist_helpers import run_on_ranks
from tests.workers.helpers_specs import tiny_spec
from workers.checkpoint import read_checkpoint, storage_for
from workers.checkpoint.manager import _from_bytes

pytestmark = pytest.mark.integration


def trainer_state(url: str) -> dict:
    return _from_bytes(storage_for(url).read_bytes(f"{url}/trainer.pt"))


ALGORITHMS = {"ema": {"name": "ema", "half_life": "2ba"},  # EMA and SWA do not compose: one run each
              "swa": {"name": "swa", "swa_start": "0.25dur", "swa_end": "0.97dur", "update_interval": "1ba"}}


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_fsdp_with_fp16_and_a_grad_scaler_resumes_exactly_with_its_weight_average(algorithm, tmp_path):
    # SWA on a model with BatchNorm, so its end-of-averaging pass over the data (each rank its
    # shard, running statistics all-reduced) runs on both ranks and is part of what must match.
    model = ({"name": "cifar_resnet20", "params": {"width": 4}} if algorithm == "swa"
             else {"name": "simple_cnn", "params": {"width": 8, "hidden": 16}})
    spec = tiny_spec(model=model, max_duration="8ba", deterministic=True, precision="amp_fp16",
                     parallelism={"strategy": "fsdp", "num_workers": 2}, algorithms=[ALGORITHMS[algorithm]],
                     checkpoint={"interval": "2ba", "keep_last": 10})
    whole = f"file://{tmp_path}/whole"
    run_on_ranks(spec, world_size=2, checkpoint_url=whole, work_dir=tmp_path)
    shutil.copytree(tmp_path / "whole" / "ep1-ba4", tmp_path / "cut" / "ep1-ba4")
    cut = f"file://{tmp_path}/cut"
    resumed = run_on_ranks(spec, world_size=2, checkpoint_url=cut, work_dir=tmp_path)
    assert resumed["resumed_from"] == f"{cut}/ep1-ba4" and resumed["loss_steps"] == [5, 6, 7, 8]

    assert_bitwise_equal(latest_url(whole), latest_url(cut))  # SWA's average is loaded into the final model
    a, b = trainer_state(latest_url(whole)), trainer_state(latest_url(cut))
    assert a["scaler"] == b["scaler"] and a["scaler"]["scale"] > 0
    if algorithm == "swa":
        assert b["algorithms"]["swa"]["completed"] and b["algorithms"]["swa"]["num_averaged"] == 7
        final = read_checkpoint(latest_url(cut))["model"]
        means = [name for name in final if name.endswith("running_mean")]
        assert means and not all(torch.equal(final[n], torch.zeros_like(final[n])) for n in means)
        return
    ema_a, ema_b = a["algorithms"]["ema"]["averaged"], b["algorithms"]["ema"]["averaged"]
    assert ema_a.keys() == ema_b.keys() and ema_a
    for name in ema_a:
        assert torch.equal(ema_a[name].tensor, ema_b[name].tensor), name
    # Stored whole, with both ranks' shards (trainer.pt is written by rank 0 alone).
    model_at_4 = read_checkpoint(f"{whole}/ep1-ba4")["model"]
    ema_at_4 = trainer_state(f"{whole}/ep1-ba4")["algorithms"]["ema"]["averaged"]
    assert {name: t.tensor.shape for name, t in ema_at_4.items()} == {name: t.shape for name, t in model_at_4.items()}


# One run with every method that acts on gradients or on BatchNorm/residual blocks, in the order
# that lets each see the others' work (after-events run in reverse: SAM, then clipping, then freezing).
GRADIENT_AND_BLOCK_METHODS = [
    {"name": "layer_freezing", "freeze_start": 0.0}, {"name": "gradient_clipping", "clipping_threshold": 0.5},
    {"name": "sam", "rho": 0.05}, {"name": "stochastic_depth", "drop_rate": 0.3},
    {"name": "ghost_batchnorm", "ghost_batch_size": 4}, {"name": "weight_standardization"},
    {"name": "channels_last"},  # NHWC weights, which FSDP2 cannot shard: wrap_model makes them contiguous
]


def test_fsdp_with_fp16_resumes_exactly_with_the_gradient_and_block_methods(tmp_path):
    spec = tiny_spec(model={"name": "cifar_resnet20", "params": {"width": 4}}, max_duration="8ba", deterministic=True,
                     precision="amp_fp16", parallelism={"strategy": "fsdp", "num_workers": 2},
                     algorithms=GRADIENT_AND_BLOCK_METHODS, checkpoint={"interval": "2ba", "keep_last": 10})
    whole = f"file://{tmp_path}/whole"
    run_on_ranks(spec, world_size=2, checkpoint_url=whole, work_dir=tmp_path)
    # Cut after the first epoch end (4 batches): layer freezing has frozen its first layers.
    (saved,) = [p for p in (tmp_path / "whole").iterdir() if p.name.endswith("-ba6")]
    shutil.copytree(saved, tmp_path / "cut" / saved.name)
    cut = f"file://{tmp_path}/cut"
    resumed = run_on_ranks(spec, world_size=2, checkpoint_url=cut, work_dir=tmp_path)
    assert resumed["resumed_from"] == f"{cut}/{saved.name}" and resumed["loss_steps"] == [7, 8]
    assert_bitwise_equal(latest_url(whole), latest_url(cut))
    state = trainer_state(latest_url(cut))
    assert state["algorithms"]["layer_freezing"]["frozen_layers"] > 0 and state["scaler"]["scale"] > 0
