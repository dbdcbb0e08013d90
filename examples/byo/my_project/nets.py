"""The model Tessera builds on every worker: ``build(num_classes=..., in_channels=..., **params)``."""

import torch.nn as nn
import torch.nn.functional as F


class SmallConvNet(nn.Module):
    def __init__(self, num_classes: int, in_channels: int, width: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.Conv2d(2 * width, 4 * width, 3, stride=2, padding=1), nn.BatchNorm2d(4 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, images):
        return self.head(self.features(images))

    def loss(self, outputs, targets):
        # Optional: without this method Tessera uses soft cross-entropy. F.cross_entropy takes
        # class indices and, with CutMix/MixUp/label smoothing on, per-class probabilities.
        return F.cross_entropy(outputs, targets)


def build(num_classes: int, in_channels: int, width: int = 32) -> nn.Module:
    return SmallConvNet(num_classes, in_channels, width)
