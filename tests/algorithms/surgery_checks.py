"""Functional property checks of the surgery methods (ALiBi, BlurPool, Factorize).

Imported into ``test_functional_forms.PROPERTY_CHECKS``; each function is one defining property.
"""

import math

import pytest
import torch
import torch.nn as nn

import algorithms.functional as af
from algorithms.alibi import ALIBI_POLICIES, alibi_bias, alibi_slopes, register_alibi_policy
from algorithms.base import NoEffectWarning
from algorithms.blurpool import BlurConv2d, BlurMaxPool2d
from algorithms.factorize import FactorizedConv2d, FactorizedLinear, max_rank_with_speedup
from workers.models.cifar_resnet import cifar_resnet20
from workers.models.gpt import AlibiCausalSelfAttention, gpt_small
from workers.models.simple_cnn import simple_cnn

# --- alibi --------------------------------------------------------------------------------

def tiny_gpt(n_head=4):
    torch.manual_seed(0)
    return gpt_small(num_classes=20, n_layer=2, n_head=n_head, d_model=8 * n_head, max_seq_len=16).eval()

def alibi_zeroes_freezes_and_extends_position_embeddings_and_updates_the_optimizer():
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    old_wpe = model.wpe.weight
    assert af.apply_alibi(model, max_sequence_length=64, optimizers=optimizer) is model
    assert model.wpe.weight.shape == (64, 32)
    assert torch.count_nonzero(model.wpe.weight) == 0 and not model.wpe.weight.requires_grad
    assert all(isinstance(block.attn, AlibiCausalSelfAttention) for block in model.blocks)
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters()} and id(old_wpe) not in optimized
    # Longer than the model's original 16 positions: ALiBi extrapolates.
    assert model(torch.randint(0, 20, (2, 48))).shape == (2, 48, 20)
    model.train()
    model(torch.randint(0, 20, (2, 8))).sum().backward()
    assert model.wpe.weight.grad is None

def alibi_slopes_are_exact_for_8_and_6_heads():
    assert alibi_slopes(8) == [2.0 ** -(i + 1) for i in range(8)]
    # 6 heads: the 4-head slopes 2^-2, 2^-4, 2^-6, 2^-8, then every other 8-head slope: 2^-1, 2^-3.
    assert alibi_slopes(6) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]
    for heads in (6, 8):
        model = tiny_gpt(n_head=heads)
        af.apply_alibi(model, max_sequence_length=32)
        attention = model.blocks[0].attn
        assert torch.equal(attention.slopes, torch.tensor(alibi_slopes(heads)))
        bias = attention.attention_bias(5, torch.device("cpu"))
        assert bias.shape == (heads, 5, 5)
        for h, slope in enumerate(alibi_slopes(heads)):
            assert bias[h, 4, 1].item() == pytest.approx(-3 * slope)  # query 4, key 1: distance 3
            assert bias[h, 2, 2].item() == 0.0 and bias[h, 1, 3].item() == -math.inf  # future keys masked

def alibi_model_stays_causal():
    model = tiny_gpt()
    af.apply_alibi(model, max_sequence_length=32)
    x = torch.randint(0, 20, (1, 12))
    changed = x.clone()
    changed[0, 7:] = (changed[0, 7:] + 1) % 20
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert torch.allclose(a[0, :7], b[0, :7], atol=1e-6)  # earlier positions never see later tokens
    assert not torch.allclose(a[0, 7:], b[0, 7:])

def alibi_bias_without_causality_is_symmetric():
    bias = alibi_bias(torch.tensor([0.5]), 4, causal=False)
    assert torch.equal(bias[0], bias[0].T) and bias[0, 0, 3].item() == -1.5

def alibi_surgery_registry_is_extensible_and_warns_when_nothing_matches():
    with pytest.warns(NoEffectWarning, match="register_alibi_policy"):
        af.apply_alibi(simple_cnn(num_classes=3), max_sequence_length=16)

    class MyAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)

    seen = []

    @register_alibi_policy(MyAttention)
    def convert(module: nn.Module, max_sequence_length: int) -> nn.Module:
        seen.append(max_sequence_length)
        return module

    try:
        af.apply_alibi(nn.Sequential(MyAttention()), max_sequence_length=99)
        assert seen == [99]
        with pytest.raises(ValueError, match="already registered"):
            register_alibi_policy(MyAttention)(lambda m, n: m)
    finally:
        del ALIBI_POLICIES[MyAttention]

# --- blurpool -----------------------------------------------------------------------------

def blurpool_replaces_strided_convs_and_maxpools_keeping_weights_and_shapes():
    model = cifar_resnet20(num_classes=10).eval()
    strided = {name: m for name, m in model.named_modules()
               if isinstance(m, nn.Conv2d) and m.stride == (2, 2) and m.in_channels >= 16}
    weights = {name: m.weight for name, m in strided.items()}
    x = torch.randn(2, 3, 32, 32)
    shape = model(x).shape
    af.apply_blurpool(model)
    blurred = {name: m for name, m in model.named_modules() if isinstance(m, BlurConv2d)}
    assert set(blurred) == set(strided) and len(blurred) == 2
    assert all(blurred[name].conv.weight is weights[name] for name in blurred)  # the same Parameters
    assert model(x).shape == shape
    # The stem (3 input channels, stride 1) and stride-1 convs stay plain Conv2d.
    assert type(model.conv1) is nn.Conv2d
    cnn = simple_cnn(num_classes=3)
    af.apply_blurpool(cnn)
    assert isinstance(cnn.features[2], BlurMaxPool2d) and cnn(torch.randn(2, 3, 32, 32)).shape == (2, 3)

def blurpool_blurs_with_the_binomial_filter():
    conv = nn.Conv2d(16, 4, 3, stride=2, padding=1)
    model = nn.Sequential(conv)
    x = torch.randn(1, 16, 9, 9)
    af.apply_blurpool(model)
    kernel = torch.tensor([1.0, 2.0, 1.0])
    blur = (kernel[:, None] * kernel[None, :] / 16).expand(16, 1, 3, 3)
    expected = conv(torch.nn.functional.conv2d(x, blur, padding=1, groups=16))
    assert torch.allclose(model(x), expected, atol=1e-6)
    after = nn.Sequential(nn.Conv2d(16, 4, 3, stride=2, padding=1))
    reference = nn.Conv2d(16, 4, 3, stride=1, padding=1)
    reference.load_state_dict(after[0].state_dict())
    af.apply_blurpool(after, blur_first=False)
    blur4 = (kernel[:, None] * kernel[None, :] / 16).expand(4, 1, 3, 3)
    expected = torch.nn.functional.conv2d(reference(x), blur4, stride=2, padding=1, groups=4)
    assert torch.allclose(after(x), expected, atol=1e-6)

def blurpool_keeps_optimizers_in_step_and_is_idempotent():
    model = cifar_resnet20(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    af.apply_blurpool(model, optimizers=optimizer)
    optimized = [p for group in optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in optimized} == {id(p) for p in model.parameters()}
    assert all(p in optimizer.state for p in model.parameters())  # momentum kept
    with pytest.warns(NoEffectWarning):  # a second application wraps nothing again
        af.apply_blurpool(model)
    assert sum(isinstance(m, BlurConv2d) for m in model.modules()) == 2

def blurpool_warns_when_nothing_qualifies():
    with pytest.warns(NoEffectWarning, match="BlurPool found no"):
        af.apply_blurpool(nn.Sequential(nn.Conv2d(3, 8, 3), nn.Linear(2, 2)))

# --- factorize ----------------------------------------------------------------------------

def factorize_drops_the_parameter_count_of_wide_layers():
    model = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.Flatten(), nn.Linear(64 * 4 * 4, 128),
                          nn.Linear(128, 4))
    before = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    af.apply_factorization(model, min_channels=32, latent_channels=0.25, min_features=64, latent_features=0.25,
                           optimizers=optimizer)
    assert isinstance(model[0], FactorizedConv2d) and model[0].latent_channels == 16
    assert isinstance(model[2], FactorizedLinear) and model[2].latent_features == 32
    assert type(model[3]) is nn.Linear  # 4 output features < min_features
    assert sum(p.numel() for p in model.parameters()) < before
    assert model(torch.randn(2, 64, 4, 4)).shape == (2, 4)
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters()}

def factorize_with_the_weights_rank_reproduces_the_layer():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 6) @ torch.randn(6, 64))  # rank 6
    x = torch.randn(5, 64)
    conv = nn.Conv2d(32, 40, 3, stride=2, padding=1)
    with torch.no_grad():
        conv.weight.copy_((torch.randn(40, 5) @ torch.randn(5, 32 * 9)).view(40, 32, 3, 3))  # rank 5
    images = torch.randn(2, 32, 9, 9)
    for init in ("svd", "lowrank"):  # the randomized SVD finds a rank-r weight exactly too
        assert torch.allclose(FactorizedLinear.from_linear(linear, 6, init=init)(x), linear(x), atol=1e-4), init
        factorized = FactorizedConv2d.from_conv2d(conv, 5, init=init)
        assert torch.allclose(factorized(images), conv(images), atol=1e-4), init
    # Below the weight's rank it is the best approximation, no longer exact.
    assert not torch.allclose(FactorizedLinear.from_linear(linear, 3, init="svd")(x), linear(x), atol=1e-2)

def factorize_lowrank_init_is_nearly_the_best_approximation():
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(96, 64))
    v, _ = torch.linalg.qr(torch.randn(80, 64))
    weight = (u * 0.8 ** torch.arange(64.0)) @ v.T  # singular values 1, 0.8, 0.64, ...
    linear = nn.Linear(80, 96)
    with torch.no_grad():
        linear.weight.copy_(weight)

    def error(init):
        factorized = FactorizedLinear.from_linear(linear, 8, init=init)
        return (factorized.module1.weight @ factorized.module0.weight - weight).norm().item()

    best = error("svd")
    assert best == pytest.approx((0.8 ** torch.arange(8.0, 64.0)).norm().item(), rel=1e-3)  # Eckart-Young
    assert 0.9999 * best <= error("lowrank") < 1.01 * best  # (float rounding may land just below)

def factorize_random_init_is_composers_fresh_layers_and_computes_no_svd():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.linalg, "svd", _refuse_svd)
        patch.setattr(torch, "svd_lowrank", _refuse_svd)
        _check_random_init()

def _refuse_svd(*args, **kwargs):
    raise AssertionError("init='random' must not compute an SVD")

def _check_random_init():
    linear, conv = nn.Linear(64, 48), nn.Conv2d(32, 40, 3, padding=1)
    torch.manual_seed(7)
    factorized = FactorizedLinear.from_linear(linear, 8)  # the default
    torch.manual_seed(7)
    fresh = FactorizedLinear(64, 48, 8)
    assert all(torch.equal(a, b) for a, b in zip(factorized.state_dict().values(), fresh.state_dict().values()))
    torch.manual_seed(7)
    factorized_conv = FactorizedConv2d.from_conv2d(conv, 5)
    torch.manual_seed(7)
    fresh_conv = FactorizedConv2d(32, 40, 3, 5, padding=1)
    assert all(torch.equal(a, b) for a, b in zip(factorized_conv.state_dict().values(),
                                                 fresh_conv.state_dict().values()))
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    af.apply_factorization(model, min_features=16, latent_features=8)
    assert all(isinstance(m, FactorizedLinear) for m in model)

def factorize_refuses_an_unknown_init():
    with pytest.raises(ValueError, match="init 'qr' is not one of 'random', 'lowrank', 'svd'"):
        af.apply_factorization(nn.Sequential(nn.Linear(64, 64)), min_features=16, latent_features=8, init="qr")
    with pytest.raises(ValueError, match="init 'qr'"):
        FactorizedLinear.from_linear(nn.Linear(64, 48), 8, init="qr")
    with pytest.raises(ValueError, match="init 'qr' is not one of"):  # even with no layer wide enough
        af.apply_factorization(nn.Sequential(nn.Linear(8, 8)), init="qr")

def factorize_replay_skips_the_init_that_loaded_weights_overwrite():
    """At an INIT whose weights are loaded right after (``state.loads_weights``: resume, fork,
    load_model), ``svd``/``lowrank`` are not computed; a fresh run's INIT computes them."""
    import types
    from algorithms.events import Event
    from algorithms.factorize import Factorize
    algorithm = Factorize(min_features=16, latent_features=8, init="svd")
    replay = types.SimpleNamespace(model=nn.Sequential(nn.Linear(64, 64)), loads_weights=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.linalg, "svd", _refuse_svd)
        patch.setattr(torch, "svd_lowrank", _refuse_svd)
        algorithm.apply(Event.INIT, replay)
    assert isinstance(replay.model[0], FactorizedLinear)
    linear = nn.Linear(64, 64)
    fresh = types.SimpleNamespace(model=nn.Sequential(linear), loads_weights=False)
    algorithm.apply(Event.INIT, fresh)
    u, s, vh = torch.linalg.svd(linear.weight.detach())
    best = (u[:, :8] * s[:8]) @ vh[:8]
    factorized = fresh.model[0]
    assert torch.allclose(factorized.module1.weight @ factorized.module0.weight, best, atol=1e-4)

def factorize_refuses_latent_sizes_that_do_not_shrink_the_layer():
    assert max_rank_with_speedup(64, 64) == 31  # 64*64/(64+64) = 32 is break-even
    with pytest.raises(ValueError, match=r"latent size 32 does not shrink Linear\(64 -> 64\).*at most 31"):
        FactorizedLinear.from_linear(nn.Linear(64, 64), 32)
    with pytest.raises(ValueError, match="does not shrink Conv2d"):
        FactorizedConv2d.from_conv2d(nn.Conv2d(16, 16, 1), 0.75)
    with pytest.raises(ValueError, match="grouped"):
        FactorizedConv2d.from_conv2d(nn.Conv2d(16, 16, 3, groups=2), 2)
    model = nn.Sequential(nn.Linear(64, 64))
    with pytest.warns(NoEffectWarning, match=r"would not shrink: Linear\(64 -> 64\) at latent 40"):
        af.apply_factorization(model, min_features=16, latent_features=40)
    assert type(model[0]) is nn.Linear

def factorize_warns_when_no_layer_is_wide_enough():
    with pytest.warns(NoEffectWarning, match="Factorize changed nothing"):
        af.apply_factorization(simple_cnn(num_classes=3))

SURGERY_PROPERTY_CHECKS = {
    "alibi": [alibi_zeroes_freezes_and_extends_position_embeddings_and_updates_the_optimizer,
              alibi_slopes_are_exact_for_8_and_6_heads,
              alibi_model_stays_causal,
              alibi_bias_without_causality_is_symmetric,
              alibi_surgery_registry_is_extensible_and_warns_when_nothing_matches],
    "blurpool": [blurpool_replaces_strided_convs_and_maxpools_keeping_weights_and_shapes,
                 blurpool_blurs_with_the_binomial_filter,
                 blurpool_keeps_optimizers_in_step_and_is_idempotent,
                 blurpool_warns_when_nothing_qualifies],
    "factorize": [factorize_drops_the_parameter_count_of_wide_layers,
                  factorize_with_the_weights_rank_reproduces_the_layer,
                  factorize_lowrank_init_is_nearly_the_best_approximation,
                  factorize_random_init_is_composers_fresh_layers_and_computes_no_svd,
                  factorize_refuses_an_unknown_init,
                  factorize_replay_skips_the_init_that_loaded_weights_overwrite,
                  factorize_refuses_latent_sizes_that_do_not_shrink_the_layer,
                  factorize_warns_when_no_layer_is_wide_enough],
}

SURGERY_FUNCTIONAL_NAMES = {"alibi": "apply_alibi", "blurpool": "apply_blurpool",
                            "factorize": "apply_factorization"}

