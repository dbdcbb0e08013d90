"""Model builders: shapes, sizes and stems."""

import pytest
import torch

from api.catalog import MODELS
from api.specs import CifarResNet20Spec, GPTSmallSpec, ResNet18Spec, SimpleCNNSpec
from workers.models import MODEL_BUILDERS, build_model, cifar_resnet20, resnet18

VISION = sorted(n for n in MODEL_BUILDERS if MODELS[n].domain == "vision")
TEXT = sorted(n for n in MODEL_BUILDERS if MODELS[n].domain == "text")


@pytest.mark.parametrize("name", VISION)
@pytest.mark.parametrize("in_channels", [1, 3])
def test_every_vision_model_maps_images_to_one_logit_per_class(name, in_channels):
    model = MODEL_BUILDERS[name](num_classes=7, in_channels=in_channels)
    assert model(torch.randn(2, in_channels, 32, 32)).shape == (2, 7)


def test_build_model_passes_spec_params():
    spec = SimpleCNNSpec(name="simple_cnn", params={"width": 8, "hidden": 16})
    model = build_model(spec, num_classes=3, in_channels=1)
    assert model.features[0].out_channels == 8 and model.head[1].out_features == 16


def test_resnet20_has_the_papers_depth_and_size():
    model = build_model(CifarResNet20Spec(name="cifar_resnet20"), num_classes=10, in_channels=3)
    convs_and_fc = [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert len(convs_and_fc) == 20
    assert 0.26e6 < sum(p.numel() for p in model.parameters()) < 0.28e6


def test_resnet20_option_b_shortcuts_add_projection_convolutions():
    option_a = cifar_resnet20(num_classes=10, shortcut="A")
    option_b = cifar_resnet20(num_classes=10, shortcut="B")
    count = lambda m: sum(isinstance(x, torch.nn.Conv2d) for x in m.modules())  # noqa: E731
    assert count(option_b) == count(option_a) + 2
    assert option_b(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_resnet18_small_input_stem_keeps_resolution_and_drops_the_max_pool():
    small = resnet18(num_classes=10, in_channels=1, small_input_stem=True)
    assert small.conv1.kernel_size == (3, 3) and small.conv1.stride == (1, 1)
    assert isinstance(small.maxpool, torch.nn.Identity)
    imagenet = build_model(ResNet18Spec(name="resnet18", params={"small_input_stem": False}),
                           num_classes=10, in_channels=1)
    assert imagenet.conv1.kernel_size == (7, 7) and imagenet.conv1.in_channels == 1


@pytest.mark.parametrize("name", TEXT)
def test_every_text_model_maps_token_ids_to_next_token_logits(name):
    model = MODEL_BUILDERS[name](num_classes=11)
    assert model(torch.randint(0, 11, (2, 9))).shape == (2, 9, 11)


def test_gpt_small_is_causal_and_limited_to_its_positions():
    model = build_model(GPTSmallSpec(name="gpt_small", params={"n_layer": 2, "d_model": 32, "max_seq_len": 16}),
                        num_classes=20, in_channels=16).eval()
    x = torch.randint(0, 20, (1, 10))
    later_changed = torch.cat([x[:, :6], (x[:, 6:] + 1) % 20], dim=1)
    with torch.no_grad():
        assert torch.allclose(model(x)[:, :6], model(later_changed)[:, :6], atol=1e-6)
    assert model.wpe.weight.shape == (16, 32)
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len 16"):
        model(torch.randint(0, 20, (1, 17)))
