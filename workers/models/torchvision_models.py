"""Any torchvision classification architecture by name, randomly initialised, adapted to the data.

``model: {name: torchvision, arch: resnet50, params: {...}}`` calls
``torchvision.models.get_model(arch, weights=None, num_classes=..., **params)`` (never downloads
weights), then adapts the stem:

- **channels**: the first ``Conv2d`` that takes 3 channels is rebuilt for the data's channels
  (1 for Fashion-MNIST) with the same kernel, stride and padding; every family has one.
- **small images** (< 64 px, or ``small_input_stem: true``): the ResNet family (resnet*,
  resnext*, wide_resnet*) gets a 3x3 stride-1 stem without max-pool, as ``resnet18`` does, so
  a 32 px image is not 8 px before the first block. Other families keep their ImageNet stem:
  most still train on small images (their global pooling adapts), at reduced accuracy; some
  need larger inputs or a parameter: ``inception_v3`` needs >= 75 px, ``vit_*`` need
  ``params: {image_size: <your size>}`` (a multiple of the patch size), ``maxvit_t`` needs 224 px
  and the ``swin_*`` models need at least 32 px.
- ``googlenet`` and ``inception_v3`` return auxiliary logits while training unless
  ``aux_logits`` is False, which is the default here (set it in ``params`` to get them back).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn
import torchvision

SMALL_IMAGE_PX = 64
_RESNET_FAMILY = ("resnet", "resnext", "wide_resnet")
_AUX_LOGITS = ("googlenet", "inception_v3")


def torchvision_model(num_classes: int, in_channels: int = 3, arch: str = "resnet18", *,
                      small_input_stem: bool | None = None, params: dict[str, Any] | None = None,
                      image_size: int | None = None) -> nn.Module:
    """``arch`` from torchvision's registry with random weights, for ``in_channels``-channel images
    of ``image_size`` px (``small_input_stem=None``: on when ``image_size`` < 64)."""
    kwargs = dict(params or {})
    if arch in _AUX_LOGITS:
        kwargs.setdefault("aux_logits", False)
        kwargs.setdefault("init_weights", True)  # silences torchvision's "init will change" warning
    model = torchvision.models.get_model(arch, weights=None, num_classes=num_classes, **kwargs)
    if small_input_stem is None:
        small_input_stem = image_size is not None and image_size < SMALL_IMAGE_PX
    if arch.startswith(_RESNET_FAMILY) and small_input_stem:
        model.conv1 = nn.Conv2d(in_channels, model.conv1.out_channels, kernel_size=3, stride=1, padding=1,
                                bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        _rebuild_first_conv(model, in_channels)
    return model


def _rebuild_first_conv(model: nn.Module, in_channels: int) -> None:
    """Replace the first 3-channel ``Conv2d`` with one taking ``in_channels``, same geometry."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d) and module.in_channels == 3:
            new = nn.Conv2d(in_channels, module.out_channels, kernel_size=module.kernel_size, stride=module.stride,
                            padding=module.padding, dilation=module.dilation, groups=1,
                            bias=module.bias is not None, padding_mode=module.padding_mode)
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, new)
            return
    raise ValueError(f"{type(model).__name__} has no 3-channel Conv2d to adapt to {in_channels} input channels")
