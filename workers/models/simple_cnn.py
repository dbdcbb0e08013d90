"""A small CNN for tests and quick experiments: two conv layers, then a two-layer MLP head.

No BatchNorm on purpose: without batch statistics, splitting a batch into microbatches gives
exactly the full batch's gradients, which tests of gradient accumulation rely on.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class SimpleCNN(nn.Module):
    def __init__(self, *, num_classes: int, in_channels: int = 3, width: int = 32, hidden: int = 128):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),  # any input size >= 4 pixels gives a 4x4 map
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 16, hidden), nn.ReLU(),
                                  nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def simple_cnn(num_classes: int, in_channels: int = 3, width: int = 32, hidden: int = 128) -> SimpleCNN:
    """The small CNN (about 0.1M parameters at the defaults)."""
    return SimpleCNN(num_classes=num_classes, in_channels=in_channels, width=width, hidden=hidden)
