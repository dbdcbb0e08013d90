"""Functional and event-form checks of the surgery methods added after the first three
(StochasticDepth, SqueezeExcite, GhostBatchNorm, WeightStandardization, the norm swaps,
GatedLinearUnits, GyroDropout); ``test_functional_forms`` and ``test_algorithm_events`` merge these
dicts into their registry-parametrized tables."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.models.resnet import BasicBlock, Bottleneck

import algorithms.functional as af
from algorithms.base import NoEffectWarning
from algorithms.events import Event
from algorithms.stochastic_depth import StochasticResidual
from algorithms.weight_standardization import standardize_weights
from tests.algorithms.checks_optimization import run_for
from workers.models.simple_cnn import simple_cnn
from workers.parallel import unwrap

RESNET = {"name": "cifar_resnet20", "params": {"width": 4}}

# --- stochastic_depth ---------------------------------------------------------------------


def three_blocks():
    torch.manual_seed(0)
    return nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 8), Bottleneck(8, 2))  # Bottleneck: 2 * 4 = 8 out


def stochastic_depth_converts_blocks_in_place_with_linear_drop_rates_and_same_parameters():
    model = three_blocks()
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    assert af.apply_stochastic_depth(model, "auto", drop_rate=0.3) is model
    assert [type(m).__name__ for m in model] == ["StochasticBasicBlock", "StochasticBasicBlock", "StochasticBottleneck"]
    assert [m.drop_rate.item() for m in model] == pytest.approx([0.1, 0.2, 0.3])
    assert all(a is b for a, b in zip(params, model.parameters())) and names == [n for n, _ in model.named_parameters()]
    assert "0.drop_rate" in model.state_dict()  # a stochastic checkpoint never loads silently into a plain model
    uniform = af.apply_stochastic_depth(three_blocks(), "ResNetBottleneck", drop_rate=0.3, drop_distribution="uniform")
    assert [isinstance(m, StochasticResidual) for m in uniform] == [False, False, True]
    assert uniform[2].drop_rate.item() == pytest.approx(0.3)


def stochastic_depth_block_mode_skips_or_keeps_whole_blocks_and_scales_at_evaluation():
    plain, x = three_blocks(), torch.randn(4, 8, 6, 6)
    kept = af.apply_stochastic_depth(copy.deepcopy(plain), "auto", drop_rate=0.0)
    assert torch.equal(kept.train()(x), plain.train()(x))  # drop_rate 0: the original blocks
    dropped = af.apply_stochastic_depth(copy.deepcopy(plain), "auto", drop_rate=1.0, drop_distribution="uniform")
    out = dropped.train()(x)
    assert torch.equal(out, torch.relu(x))  # every block skipped: only the shortcuts (and ReLU) remain
    assert not out.requires_grad  # skipped blocks are not in the graph: no backward runs through them
    half = af.apply_stochastic_depth(copy.deepcopy(plain), "ResNetBasicBlock", drop_rate=0.5,
                                     drop_distribution="uniform").eval()
    block = plain[0].eval()
    main = block.bn2(block.conv2(block.relu(block.bn1(block.conv1(x)))))
    assert torch.allclose(half[0](x), torch.relu(0.5 * main + x), atol=1e-6)  # paper: scale by survival


def stochastic_depth_sample_mode_drops_the_branch_per_example():
    plain, x = three_blocks(), torch.randn(64, 8, 4, 4)
    block = copy.deepcopy(plain[0]).train()
    full = block(x)
    af.apply_stochastic_depth(plain, "ResNetBasicBlock", "sample", drop_rate=0.5, drop_distribution="uniform")
    torch.manual_seed(1)
    out = plain[0].train()(x)
    as_full = torch.isclose(out, full, atol=1e-6).flatten(1).all(1)
    as_skipped = torch.isclose(out, torch.relu(x), atol=1e-6).flatten(1).all(1)
    assert torch.all(as_full | as_skipped) and 10 < as_skipped.sum() < 54  # each example: one or the other


def stochastic_depth_warns_without_residual_blocks():
    with pytest.warns(NoEffectWarning, match="no residual block"):
        af.apply_stochastic_depth(simple_cnn(num_classes=3), "auto")


class CountCalls:
    def __init__(self, modules):
        self.calls = 0
        for module in modules:
            module.register_forward_hook(self.hook)

    def hook(self, *args):
        self.calls += 1


def stochastic_depth_skips_blocks_in_training_with_warmup_and_keeps_all_at_evaluation():
    trainer = run_for({"name": "stochastic_depth", "drop_rate": 0.6, "drop_distribution": "uniform",
                       "drop_warmup": 0.5}, model=RESNET, max_duration="6ba")
    model = unwrap(trainer.state.model)
    blocks = [m for m in model.modules() if isinstance(m, StochasticResidual)]
    assert len(blocks) == 9 and all(type(b).__name__ == "StochasticBasicBlock" for b in blocks)
    main_convs = CountCalls([b.conv1 for b in blocks])
    rates = []

    class Rates:
        def run_event(self, event, state):
            if event is Event.BEFORE_FORWARD:
                rates.append(blocks[0].drop_rate.item())
    trainer.engine.callbacks.append(Rates())
    trainer.fit()
    # Warm-up over the first half (3 of 6 batches): 0, 0.2, 0.4, then 0.6.
    assert rates == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.6, 0.6])
    assert main_convs.calls < 6 * 9  # some blocks were skipped ...
    assert main_convs.calls >= 9  # ... not before the rate rose (the first batch runs every block)
    calls = main_convs.calls
    with torch.no_grad():
        model.eval()(torch.randn(2, 3, 8, 8))
    assert main_convs.calls == calls + 9  # evaluation runs every block


# --- squeeze_excite -----------------------------------------------------------------------


def squeeze_excite_gates_wide_convs_channelwise_and_updates_the_optimizer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 16, 3), nn.Conv2d(16, 32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    old = model[2]
    assert af.apply_squeeze_excite(model, latent_channels=0.25, min_channels=16, optimizers=optimizer) is model
    assert isinstance(model[0], nn.Conv2d)  # 3 input channels: below min_channels
    assert type(model[2]).__name__ == "SqueezeExciteConv2d" and model[2].conv is old
    assert model[2].se.latent_channels == 4 and model[3].se.latent_channels == 8
    assert {n for n in model.state_dict() if n.startswith("2.")} == {
        "2.conv.weight", "2.conv.bias", "2.se.pool_and_mlp.2.weight", "2.se.pool_and_mlp.4.weight"}  # Composer's names
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters()}
    x = torch.randn(2, 16, 5, 5)
    conv_out = old(x)
    gates = torch.sigmoid(model[2].se.pool_and_mlp[4].weight @ torch.relu(
        model[2].se.pool_and_mlp[2].weight @ conv_out.mean(dim=(2, 3)).T)).T  # (N, C)
    assert torch.allclose(model[2](x), conv_out * gates[:, :, None, None], atol=1e-6)
    before = sum(p.numel() for p in model.parameters())
    with pytest.warns(NoEffectWarning):  # idempotent: converted convs are not converted again
        af.apply_squeeze_excite(model, latent_channels=0.25, min_channels=16)
    assert sum(p.numel() for p in model.parameters()) == before


def squeeze_excite_warns_when_no_conv_is_wide_enough():
    with pytest.warns(NoEffectWarning, match="SqueezeExcite found no Conv2d"):
        af.apply_squeeze_excite(simple_cnn(num_classes=3, width=8), min_channels=128)


def squeeze_excite_adds_blocks_at_init_that_train():
    trainer = run_for({"name": "squeeze_excite", "latent_channels": 4, "min_channels": 8}, model=RESNET)
    model = unwrap(trainer.state.model)
    se = [m for m in model.modules() if type(m).__name__ == "SqueezeExciteConv2d"]
    # Stages of 4, 8 and 16 channels: 5 convs of stage 2 (not its first, 4 -> 8) and all 6 of stage 3.
    assert len(se) == 11
    optimized = {id(p) for group in trainer.state.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters()}
    before = [m.se.pool_and_mlp[2].weight.detach().clone() for m in se]
    trainer.fit()
    assert all(not torch.equal(b, m.se.pool_and_mlp[2].weight) for b, m in zip(before, se))


# --- ghost_batchnorm ----------------------------------------------------------------------


def ghost_batchnorm_normalizes_each_ghost_batch_with_its_own_statistics():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 6),
                          nn.BatchNorm1d(6))
    bn2d = model[1]
    plain = copy.deepcopy(bn2d)
    assert af.apply_ghost_batchnorm(model, ghost_batch_size=4) is model
    assert [type(model[i]).__name__ for i in (1, 4)] == ["GhostBatchNorm2d", "GhostBatchNorm1d"]
    assert model[1].batchnorm is bn2d and "1.batchnorm.weight" in model.state_dict()  # Composer's names
    x = torch.randn(12, 4, 4, 4) * 3 + 1
    out = model[1].train()(x)
    for chunk in range(3):  # every ghost batch of 4 is normalized on its own: mean 0, var 1 per channel
        part = out[4 * chunk:4 * chunk + 4]
        assert torch.allclose(part.mean(dim=(0, 2, 3)), torch.zeros(4), atol=1e-5)
        assert torch.allclose(part.var(dim=(0, 2, 3), unbiased=False), torch.ones(4), atol=1e-3)
    # The running statistics move about as much as one plain step's (momentum / 3, three times).
    plain.train()(x)
    assert torch.allclose(bn2d.running_mean, plain.running_mean, atol=0.05)
    assert bn2d.momentum == plain.momentum  # restored after the forward
    small = torch.randn(3, 4, 4, 4)
    assert torch.allclose(model[1](small), plain(small), atol=1e-6)  # <= ghost_batch_size: plain BatchNorm
    model.eval()
    assert torch.equal(model[1](x), plain.eval()(x)) or torch.allclose(model[1](x), bn2d(x))


def ghost_batchnorm_warns_without_batchnorm():
    with pytest.warns(NoEffectWarning, match="no BatchNorm"):
        af.apply_ghost_batchnorm(simple_cnn(num_classes=3), ghost_batch_size=8)


def ghost_batchnorm_wraps_every_batchnorm_at_init_and_trains():
    trainer = run_for({"name": "ghost_batchnorm", "ghost_batch_size": 4}, model=RESNET)
    model = unwrap(trainer.state.model)
    ghosts = [m for m in model.modules() if type(m).__name__ == "GhostBatchNorm2d"]
    assert len(ghosts) == 19  # the stem's and two per block
    calls = CountCalls([ghosts[0].batchnorm])
    trainer.fit()
    assert calls.calls == 3 * 16 // 4  # 3 batches of 16: four ghost batches each


# --- weight_standardization ---------------------------------------------------------------


def weight_standardization_standardizes_filters_skipping_the_last_convs_in_execution_order():
    torch.manual_seed(0)

    class Net(nn.Module):  # defined in one order, run in another
        def __init__(self):
            super().__init__()
            self.late = nn.Conv2d(4, 2, 1)
            self.early = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return self.late(self.early(x))
    model = Net()
    weight = model.early.weight
    assert af.apply_weight_standardization(model, n_last_layers_ignore=1) == 1
    assert not torch.nn.utils.parametrize.is_parametrized(model.late)  # last executed, not last defined
    assert model.early.parametrizations.weight.original is weight  # the same Parameter: optimizers unaffected
    standardized = model.early.weight
    assert torch.allclose(standardized.mean(dim=(1, 2, 3)), torch.zeros(4), atol=1e-6)
    assert torch.allclose(standardized.var(dim=(1, 2, 3), unbiased=False), torch.ones(4), atol=1e-3)
    x = torch.randn(2, 3, 5, 5)
    expected = torch.nn.functional.conv2d(x, standardize_weights(weight), model.early.bias)
    assert torch.allclose(model.early(x), expected, atol=1e-5)
    assert "early.parametrizations.weight.original" in model.state_dict()  # Composer's names
    assert af.apply_weight_standardization(model) == 1  # only the one not yet standardized


def weight_standardization_warns_when_every_conv_is_ignored():
    with pytest.warns(NoEffectWarning, match="ignores the last 5"):
        af.apply_weight_standardization(simple_cnn(num_classes=3), n_last_layers_ignore=5)


def weight_standardization_trains_standardized_convs():
    trainer = run_for({"name": "weight_standardization", "n_last_layers_ignore": 1}, model=RESNET)
    model = unwrap(trainer.state.model)
    parametrized = [m for m in model.modules() if torch.nn.utils.parametrize.is_parametrized(m, "weight")]
    assert len(parametrized) == 18  # 19 convolutions, the last one executed left alone
    stored = model.conv1.parametrizations.weight.original
    before = stored.detach().clone()
    trainer.fit()
    assert not torch.equal(before, stored)  # the stored weight trains; its standardized view is used
    assert torch.allclose(model.conv1.weight.mean(dim=(1, 2, 3)), torch.zeros(4), atol=1e-5)


# --- low_precision_layernorm / low_precision_groupnorm ------------------------------------


def low_precision_norm_runs_in_the_autocast_dtype_and_is_plain_outside_autocast(apply, norm):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 1), norm)
    reference = copy.deepcopy(model)
    params = list(model.parameters())
    assert apply(model, "amp_bf16") is model and type(model[1]).__name__.startswith("LP")
    assert all(a is b for a, b in zip(params, model.parameters()))
    assert model.state_dict().keys() == reference.state_dict().keys()
    x = torch.randn(2, 3, 4, 4)
    assert torch.equal(model(x), reference(x))  # without autocast: the plain layer
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(x)
    assert low.dtype == torch.bfloat16  # CPU autocast alone keeps layer_norm in fp32
    assert torch.allclose(low.float(), reference(x), atol=0.1)
    with pytest.warns(NoEffectWarning, match="precision fp32"):
        apply(copy.deepcopy(reference), "fp32")


def low_precision_layernorm_functional():
    low_precision_norm_runs_in_the_autocast_dtype_and_is_plain_outside_autocast(
        af.apply_low_precision_layernorm, nn.LayerNorm([8, 4, 4]))


def low_precision_groupnorm_functional():
    low_precision_norm_runs_in_the_autocast_dtype_and_is_plain_outside_autocast(
        af.apply_low_precision_groupnorm, nn.GroupNorm(2, 8))


def low_precision_norms_are_a_noted_no_op_on_cpu():
    from algorithms.low_precision_layernorm import low_precision_effective
    assert low_precision_effective("amp_bf16", "cuda") and not low_precision_effective("amp_bf16", "cpu")
    assert not low_precision_effective("fp32", "cuda")
    trainer = run_for({"name": "low_precision_layernorm"}, {"name": "low_precision_groupnorm"}, max_duration="1ba",
                      precision="amp_bf16", model={"name": "gpt_small", "params": {"n_layer": 1, "n_head": 2,
                                                                                  "d_model": 16, "max_seq_len": 16}},
                      data={"train": {"name": "shakespeare", "seq_len": 16, "limit": 32}, "batch_size": 8})
    assert len(trainer.surgery_notes) == 2 and all("no-op here" in n and "amp_bf16 on cpu" in n
                                                   for n in trainer.surgery_notes)
    assert not any(type(m).__name__.startswith("LP") for m in trainer.state.model.modules())
    trainer.fit()


# --- fused_layernorm ----------------------------------------------------------------------


def fused_layernorm_without_apex_or_cuda_changes_nothing_and_says_so():
    from algorithms.fused_layernorm import apex_fused_layernorm
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8))
    before = copy.deepcopy(model.state_dict())
    with pytest.warns(NoEffectWarning, match="apex" if apex_fused_layernorm() is None else "CUDA"):
        assert af.apply_fused_layernorm(model) is model  # apex absent here, or the weights are on the CPU
    assert type(model[1]) is nn.LayerNorm and all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def fused_layernorm_is_a_noted_no_op_on_cpu():
    trainer = run_for({"name": "fused_layernorm"}, max_duration="1ba",
                      model={"name": "gpt_small", "params": {"n_layer": 1, "n_head": 2, "d_model": 16, "max_seq_len": 16}},
                      data={"train": {"name": "shakespeare", "seq_len": 16, "limit": 32}, "batch_size": 8})
    assert trainer.surgery_notes == ["FusedLayerNorm is a no-op here: it needs a CUDA device and NVIDIA apex, "
                                     "and this run is on cpu"]
    assert any(type(m) is nn.LayerNorm for m in trainer.state.model.modules())  # left as it was
    trainer.fit()


# --- gated_linear_units -------------------------------------------------------------------

GPT_TINY = {"name": "gpt_small", "params": {"n_layer": 2, "n_head": 2, "d_model": 16, "max_seq_len": 16}}
TEXT_TINY = {"train": {"name": "shakespeare", "seq_len": 16, "limit": 64}, "batch_size": 8}


def ffn_model():
    """Two residual feed-forward blocks (one with a dropout) and a classifier head that is not one."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(6, 24), nn.GELU(), nn.Linear(24, 6)),
                         nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 6), nn.Dropout(0.0)),
                         nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)))


def gated_linear_units_gate_ffn_blocks_keeping_names_and_updating_the_optimizer():
    from algorithms.gated_linear_units import GatedFeedForward
    model = ffn_model()
    up, down, head = model[0][0], model[0][2], model[2]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert af.apply_gated_linear_units(model, optimizers=optimizer) is model
    assert [type(m).__name__ for m in model] == ["GatedFeedForward", "GatedFeedForward", "Sequential"]
    assert model[2] is head  # 6 -> 8 -> 3 does not map its width back: a head, not a block
    assert model[0][0] is up and model[0][2] is down and up.bias is None  # Composer: no non-gated bias by default
    assert set(model.state_dict()) == {"0.0.weight", "0.2.weight", "0.2.bias", "0.gate.weight", "1.0.weight",
                                       "1.2.weight", "1.2.bias", "1.gate.weight", "2.0.weight", "2.0.bias",
                                       "2.2.weight", "2.2.bias"}
    gate = model[0].gate
    assert gate.bias is None and gate.weight.std().item() == pytest.approx(up.weight.std().item(), rel=0.3)
    x = torch.randn(5, 6)
    expected = down(F.gelu(gate(x)) * up(x))
    assert torch.allclose(model[0](x), expected, atol=1e-6)
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters()}  # gates in, removed biases out
    with pytest.warns(NoEffectWarning):  # idempotent: gated blocks are not gated again
        af.apply_gated_linear_units(model)
    assert isinstance(model[0], GatedFeedForward) and not isinstance(model[0][2], GatedFeedForward)
    # Biases on request, another activation; torchvision's ViT MLPs are found too.
    swiglu = af.apply_gated_linear_units(ffn_model(), act_fn="silu", gated_layer_bias=True, non_gated_layer_bias=True)
    assert type(swiglu[0][1]) is nn.SiLU and swiglu[0].gate.bias is not None and swiglu[0][0].bias is not None
    from torchvision.models import VisionTransformer
    vit = VisionTransformer(image_size=8, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16,
                            num_classes=3)
    keys = set(vit.state_dict())
    af.apply_gated_linear_units(vit, non_gated_layer_bias=True)
    assert sum(isinstance(m, GatedFeedForward) for m in vit.modules()) == 2
    assert set(vit.state_dict()) - keys == {f"encoder.layers.encoder_layer_{i}.mlp.gate.weight" for i in (0, 1)}
    assert vit(torch.randn(2, 3, 8, 8)).shape == (2, 3)


def gated_linear_units_find_blocks_whose_norm_is_a_layernorm_subclass():
    """MaxViT-style blocks normalize inside; low_precision_layernorm listed earlier turns the norm
    into an LPLayerNorm (a LayerNorm subclass), which must not hide the block. A factorized
    projection is not an nn.Linear, so factorize listed earlier does hide it (the method card says so)."""
    from algorithms.gated_linear_units import GatedFeedForward
    from algorithms.low_precision_layernorm.low_precision_layernorm import LPLayerNorm
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(LPLayerNorm(8), nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)))
    af.apply_gated_linear_units(model)
    assert isinstance(model[0], GatedFeedForward) and type(model[0][0]) is LPLayerNorm
    factorized = af.apply_factorization(nn.Sequential(nn.Sequential(nn.Linear(64, 256), nn.GELU(),
                                                                    nn.Linear(256, 64))),
                                        min_features=32, latent_features=16)
    with pytest.warns(NoEffectWarning, match="GatedLinearUnits found no feed-forward block"):
        af.apply_gated_linear_units(factorized)


def gated_linear_units_warn_without_feed_forward_blocks():
    with pytest.warns(NoEffectWarning, match="GatedLinearUnits found no feed-forward block"):
        af.apply_gated_linear_units(simple_cnn(num_classes=3))
    with pytest.raises(ValueError, match="act_fn 'swish' is not one of gelu, relu, silu"):
        af.apply_gated_linear_units(ffn_model(), act_fn="swish")


def gated_linear_units_gate_gpt_small_at_init_and_train():
    trainer = run_for({"name": "gated_linear_units", "act_fn": "silu"}, model=GPT_TINY, data=TEXT_TINY,
                      max_duration="2ba", optimizer={"name": "adamw", "lr": 0.01})
    model = unwrap(trainer.state.model)
    blocks = [b.mlp for b in model.blocks]
    assert all(type(m).__name__ == "GatedFeedForward" and type(m[1]) is nn.SiLU for m in blocks)
    optimized = {id(p) for group in trainer.state.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters()}
    before = [m.gate.weight.detach().clone() for m in blocks]
    trainer.fit()
    assert all(not torch.equal(b, m.gate.weight) for b, m in zip(before, blocks))


# --- gyro_dropout -------------------------------------------------------------------------


def gyro_dropout_trains_tau_of_sigma_fixed_masks_and_changes_them_every_period():
    from algorithms.gyro_dropout import GyroDropoutLayer
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.Dropout(0.1))
    # 4 iterations x 2 epochs over 4 subnetworks: the active pair changes every 2 steps.
    assert af.apply_gyro_dropout(model, iters_per_epoch=4, max_epoch=2, p=0.25, sigma=4, tau=2) is model
    layer = model[1]
    assert type(layer) is GyroDropoutLayer and layer.change_every == 2 and layer.p == 0.25
    masks = layer.masks(32).float() / 0.75
    ones, seen = torch.ones(8, 32), []
    for step in range(8):
        out = layer.train()(ones)
        active = masks[layer.active_indices(step)]
        assert torch.equal(out[:4], active[0].expand(4, 32)) and torch.equal(out[4:], active[1].expand(4, 32))
        seen.append(layer.active_indices(step).tolist())
    assert int(layer.step) == 8  # the functional form counts its training forwards, as Composer's
    assert seen[0] == seen[1] and seen[2] == seen[3] and len({tuple(s) for s in seen[::2]}) > 1
    assert all(len(set(s)) == 2 for s in seen)  # tau distinct subnetworks at a time
    # Sequences (N, T, C): one mask per example over the channels; feature maps (N, C, H, W): channels.
    seq = layer(torch.ones(2, 3, 32))
    assert torch.equal(seq[:, 0], seq[:, 2]) and set(seq.unique().tolist()) <= {0.0, masks.max().item()}
    maps = layer(torch.ones(2, 32, 3, 3))
    assert torch.equal(maps[..., 0, 0], maps[..., 2, 1])
    assert torch.equal(layer.eval()(ones), ones)  # evaluation: the identity
    # Seed and step are in the state dict: a fresh layer loaded from it continues identically.
    fresh = af.apply_gyro_dropout(nn.Sequential(nn.Linear(4, 32), nn.Dropout()), 4, 2, p=0.25, sigma=4, tau=2)
    fresh.load_state_dict(model.state_dict())
    assert torch.equal(fresh[1].train()(ones), layer.train()(ones))
    # The period is saved too: a rebuild that does not know the run's length (load_model) keeps it.
    rebuilt = af.apply_gyro_dropout(nn.Sequential(nn.Linear(4, 32), nn.Dropout()), 1, 1, p=0.25, sigma=4, tau=2)
    assert rebuilt[1].change_every == 1
    rebuilt.load_state_dict(model.state_dict())
    assert rebuilt[1].change_every == 2 and int(model.state_dict()["1.period"]) == 2


def gyro_dropout_warns_without_dropout():
    with pytest.warns(NoEffectWarning, match="GyroDropout found no torch.nn.Dropout"):
        af.apply_gyro_dropout(simple_cnn(num_classes=3), iters_per_epoch=10, max_epoch=1)
    with pytest.raises(ValueError, match="tau 8 must lie in"):
        af.apply_gyro_dropout(nn.Dropout(), iters_per_epoch=10, max_epoch=1, sigma=4, tau=8)


def gyro_dropout_follows_the_batch_counter_not_the_forward_count():
    from algorithms.gyro_dropout import GyroDropoutLayer
    one_layer = {"name": "gpt_small", "params": {**GPT_TINY["params"], "n_layer": 1}}
    trainer = run_for({"name": "gyro_dropout", "p": 0.5, "sigma": 2, "tau": 2}, model=one_layer, data=TEXT_TINY,
                      max_duration="4ba", microbatch_size=4, optimizer={"name": "adamw", "lr": 0.01})
    layers = [m for m in unwrap(trainer.state.model).modules() if isinstance(m, GyroDropoutLayer)]
    assert len(layers) == 2 and all(m.change_every == 2 and not m.count_forwards for m in layers)  # 4 batches / 2
    steps = []

    class Steps:
        def run_event(self, event, state):
            if event is Event.BEFORE_FORWARD:
                steps.append(int(layers[0].step))
    trainer.engine.callbacks.append(Steps())
    trainer.fit()
    assert steps == [0, 0, 1, 1, 2, 2, 3, 3]  # two microbatches per batch, one step


def gyro_dropout_sets_the_step_before_selective_backprop_scores_in_either_order():
    """Selective backprop scores the batch with a training-mode forward at AFTER_DATALOADER, an
    event that runs algorithms in reverse list order: in either order it must see the batch's step."""
    from algorithms.gyro_dropout import GyroDropout, GyroDropoutLayer
    from algorithms.selective_backprop import SelectiveBackprop
    from workers.engine import Engine
    from workers.state import State
    for gyro_first in (True, False):
        torch.manual_seed(0)
        gyro = GyroDropout(p=0.5, sigma=4, tau=2)
        select = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interval=1)
        algorithms = [gyro, select] if gyro_first else [select, gyro]
        state = State(model=nn.Sequential(nn.Linear(4, 8), nn.Dropout(), nn.Linear(8, 3)), num_classes=3,
                      max_batches=8, loss_fn=nn.functional.cross_entropy, algorithms=algorithms)
        engine = Engine(algorithms)
        engine.run_event(Event.INIT, state)
        layer = state.model[1]
        assert isinstance(layer, GyroDropoutLayer) and layer.change_every == 2  # 8 batches / 4 subnetworks
        seen = []  # (batch counter, layer's step) at every forward of the layer
        layer.register_forward_pre_hook(lambda m, args: seen.append((state.timestamp.batch, m._step)))
        engine.run_event(Event.FIT_START, state)
        engine.run_event(Event.EPOCH_START, state)
        for _ in range(4):
            state.inputs, state.targets = torch.randn(8, 4), torch.randint(0, 3, (8,))
            engine.run_event(Event.AFTER_DATALOADER, state)  # selective backprop's scoring forward
            state.model(state.inputs)  # the training forward
            state.timestamp = state.timestamp.after_batch(samples=8)
            engine.run_event(Event.BATCH_END, state)
        assert [batch for batch, _ in seen] == [0, 0, 1, 1, 2, 2, 3, 3]
        assert all(batch == step for batch, step in seen), (gyro_first, seen)


BLOCK_SURGERY_PROPERTY_CHECKS = {
    "stochastic_depth": [stochastic_depth_converts_blocks_in_place_with_linear_drop_rates_and_same_parameters,
                         stochastic_depth_block_mode_skips_or_keeps_whole_blocks_and_scales_at_evaluation,
                         stochastic_depth_sample_mode_drops_the_branch_per_example,
                         stochastic_depth_warns_without_residual_blocks],
    "squeeze_excite": [squeeze_excite_gates_wide_convs_channelwise_and_updates_the_optimizer,
                       squeeze_excite_warns_when_no_conv_is_wide_enough],
    "ghost_batchnorm": [ghost_batchnorm_normalizes_each_ghost_batch_with_its_own_statistics,
                        ghost_batchnorm_warns_without_batchnorm],
    "weight_standardization": [weight_standardization_standardizes_filters_skipping_the_last_convs_in_execution_order,
                               weight_standardization_warns_when_every_conv_is_ignored],
    "low_precision_layernorm": [low_precision_layernorm_functional],
    "low_precision_groupnorm": [low_precision_groupnorm_functional],
    "fused_layernorm": [fused_layernorm_without_apex_or_cuda_changes_nothing_and_says_so],
    "gated_linear_units": [gated_linear_units_gate_ffn_blocks_keeping_names_and_updating_the_optimizer,
                           gated_linear_units_find_blocks_whose_norm_is_a_layernorm_subclass,
                           gated_linear_units_warn_without_feed_forward_blocks],
    "gyro_dropout": [gyro_dropout_trains_tau_of_sigma_fixed_masks_and_changes_them_every_period,
                     gyro_dropout_warns_without_dropout,
                     gyro_dropout_sets_the_step_before_selective_backprop_scores_in_either_order],
}

BLOCK_SURGERY_EVENT_CHECKS = {
    "stochastic_depth": [stochastic_depth_skips_blocks_in_training_with_warmup_and_keeps_all_at_evaluation],
    "squeeze_excite": [squeeze_excite_adds_blocks_at_init_that_train],
    "ghost_batchnorm": [ghost_batchnorm_wraps_every_batchnorm_at_init_and_trains],
    "weight_standardization": [weight_standardization_trains_standardized_convs],
    "low_precision_layernorm": [low_precision_norms_are_a_noted_no_op_on_cpu],
    "low_precision_groupnorm": [low_precision_norms_are_a_noted_no_op_on_cpu],
    "fused_layernorm": [fused_layernorm_is_a_noted_no_op_on_cpu],
    "gated_linear_units": [gated_linear_units_gate_gpt_small_at_init_and_train],
    "gyro_dropout": [gyro_dropout_follows_the_batch_counter_not_the_forward_count],
}

BLOCK_SURGERY_FUNCTIONAL_NAMES = {"stochastic_depth": "apply_stochastic_depth", "squeeze_excite": "apply_squeeze_excite",
                                  "ghost_batchnorm": "apply_ghost_batchnorm",
                                  "weight_standardization": "apply_weight_standardization",
                                  "low_precision_layernorm": "apply_low_precision_layernorm",
                                  "low_precision_groupnorm": "apply_low_precision_groupnorm",
                                  "fused_layernorm": "apply_fused_layernorm",
                                  "gated_linear_units": "apply_gated_linear_units",
                                  "gyro_dropout": "apply_gyro_dropout"}
