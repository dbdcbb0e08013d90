"""``model: {name: torchvision, arch: ...}``: the shipped name list, stems, and a training step."""

from __future__ import annotations

import pytest
import torch
import torchvision

from api.specs import RunSpec
from api.torchvision_archs import TORCHVISION_ARCHS, TORCHVISION_VERSION
from workers.models import build_model, torchvision_model
from workers.reporter import MemorySink
from workers.trainer import train


def test_the_shipped_arch_list_equals_torchvisions_classification_models():
    assert torchvision.__version__.split("+")[0] == TORCHVISION_VERSION
    assert list(TORCHVISION_ARCHS) == torchvision.models.list_models(module=torchvision.models)


def test_resnets_get_the_small_image_stem_under_64px_and_keep_imagenets_above():
    small = torchvision_model(10, 1, "resnet50", image_size=28)
    assert small.conv1.kernel_size == (3, 3) and small.conv1.in_channels == 1
    assert isinstance(small.maxpool, torch.nn.Identity)
    large = torchvision_model(10, 3, "resnext50_32x4d", image_size=96)
    assert large.conv1.kernel_size == (7, 7) and isinstance(large.maxpool, torch.nn.MaxPool2d)
    forced = torchvision_model(10, 3, "wide_resnet50_2", image_size=96, small_input_stem=True)
    assert forced.conv1.stride == (1, 1)


@pytest.mark.parametrize(("arch", "params", "size"), [("mobilenet_v3_small", {}, 32), ("squeezenet1_1", {}, 32),
                                                       ("vit_b_32", {"image_size": 32}, 32),
                                                       ("googlenet", {}, 32)])
def test_other_families_adapt_their_first_conv_to_the_channels(arch, params, size):
    model = torchvision_model(5, 1, arch, params=params, image_size=size).train()
    assert model(torch.randn(2, 1, size, size)).shape == (2, 5)  # googlenet: no aux logits by default


def test_a_torchvision_arch_trains_a_step_from_a_spec():
    spec = RunSpec.model_validate({
        "name": "tv-step", "model": {"name": "torchvision", "arch": "resnet18"},
        "data": {"train": {"name": "synthetic", "num_samples": 16, "image_size": 16, "channels": 1}, "batch_size": 8},
        "optimizer": {"name": "sgd", "lr": 0.01}, "max_duration": "2ba"})
    model = build_model(spec.model, num_classes=10, in_channels=1, image_size=16)
    assert model.conv1.kernel_size == (3, 3)
    sink = MemorySink()
    train(spec, sink=sink)
    losses = [value for _, value in sink.values("train/loss")]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
