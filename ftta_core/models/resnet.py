"""ResNet-8 of the FedTSA/Fling code: BasicBlock x [1,1,1], ImageNet stem, widths 64/128/256, 256-d features."""
from __future__ import annotations

import torch
from torch import nn

from .ops import MaxPool2d


class BasicBlock(nn.Module):
    """The standard two-conv residual block with an optional 1x1 projection shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet8(nn.Module):
    """Fling's ResNet(BasicBlock, [1,1,1]) with a 7x7/2 conv + maxpool stem; inputs in [0,1], no normalisation."""

    feature_dim = 256

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = MaxPool2d(3, 2, 1)
        self.layer1 = BasicBlock(64, 64, 1)
        self.layer2 = BasicBlock(64, 128, 2)
        self.layer3 = BasicBlock(128, 256, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(256, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features [B, 256] (the FedTSA indicator is their batch mean)."""
        out = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        out = self.layer3(self.layer2(self.layer1(out)))
        return torch.flatten(self.pool(out), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.forward_features(x))
