"""torchvision's ResNet-18, randomly initialised, with its stem adapted to the data.

The ImageNet stem (7x7 stride-2 convolution, then max-pool) shrinks a 32x32 image to 8x8 before
the first block; ``small_input_stem`` swaps it for a 3x3 stride-1 convolution without max-pool,
the usual choice for CIFAR-sized images.
"""

from __future__ import annotations

import torch.nn as nn
from torchvision.models import resnet18 as tv_resnet18


def resnet18(num_classes: int, in_channels: int = 3, small_input_stem: bool = True) -> nn.Module:
    """ResNet-18 (11.2M parameters) for ``in_channels``-channel images."""
    model = tv_resnet18(weights=None, num_classes=num_classes)
    if small_input_stem:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model
