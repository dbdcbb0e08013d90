"""ResNet-20 for 32x32 images (He et al. 2016, section 4.2): 3 stages x 3 basic blocks.

Stages have ``width``, ``2*width``, ``4*width`` channels (16/32/64 in the paper) at 32, 16 and 8
pixels; ~0.27M parameters at width 16. Where a stage halves the resolution, the shortcut is
option A (identity on every other pixel, zero-padded channels: no parameters, the paper's
CIFAR choice) or option B (1x1 strided convolution + BatchNorm).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from algorithms.stochastic_depth import register_residual_block

Shortcut = Literal["A", "B"]


class _ZeroPadShortcut(nn.Module):
    """Option A: subsample by 2 and pad the new channels with zeros."""

    def __init__(self, extra_channels: int):
        super().__init__()
        self.extra_channels = extra_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, ::2, ::2]
        half = self.extra_channels // 2
        return F.pad(x, (0, 0, 0, 0, half, self.extra_channels - half))


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, shortcut: Shortcut):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            if shortcut == "A":
                self.shortcut = _ZeroPadShortcut(out_channels - in_channels)
            else:
                self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                              nn.BatchNorm2d(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


# StochasticDepth splits a block into main branch and shortcut: post(main(x) + shortcut(x)).
register_residual_block("CifarResNetBasicBlock", BasicBlock, shortcut=lambda b, x: b.shortcut(x),
                        main=lambda b, x: b.bn2(b.conv2(F.relu(b.bn1(b.conv1(x))))))


class CifarResNet(nn.Module):
    """CIFAR-style ResNet with ``blocks_per_stage`` basic blocks in each of 3 stages."""

    def __init__(self, *, num_classes: int, in_channels: int = 3, width: int = 16,
                 blocks_per_stage: int = 3, shortcut: Shortcut = "A"):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        layers, channels = [], width
        for stage in range(3):
            out_channels = width * 2 ** stage
            for block in range(blocks_per_stage):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(channels, out_channels, stride, shortcut))
                channels = out_channels
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(channels, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def cifar_resnet20(num_classes: int, in_channels: int = 3, width: int = 16, shortcut: Shortcut = "A") -> CifarResNet:
    """ResNet-20 (3 stages x 3 basic blocks, 20 weighted layers)."""
    return CifarResNet(num_classes=num_classes, in_channels=in_channels, width=width,
                       blocks_per_stage=3, shortcut=shortcut)
