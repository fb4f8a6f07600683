"""Small convolutional networks: FedICON's two-layer CNN and the BN CNN for the embedded digits."""
from __future__ import annotations

import torch
from torch import nn

from .ops import MaxPool2d


class TwoLayerCNN(nn.Module):
    """FedICON Table 3: Conv(3,32,5)-ReLU-Pool, Conv(32,64,5)-ReLU-Pool, FC(1600,64)-ReLU, FC(64,C); 32x32 inputs."""

    feature_dim = 64

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5, 1)
        self.conv2 = nn.Conv2d(32, 64, 5, 1)
        self.pool = MaxPool2d(2, 2)
        self.fc1 = nn.Linear(64 * 5 * 5, 64)
        self.fc = nn.Linear(64, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The 64-d representation before the classifier."""
        out = self.pool(torch.relu(self.conv1(x)))
        out = self.pool(torch.relu(self.conv2(out)))
        return torch.relu(self.fc1(torch.flatten(out, 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.forward_features(x))


class DigitsCNN(nn.Module):
    """A three-block conv-BN-ReLU CNN with global pooling (64-d features) for the embedded 16x16 digits."""

    feature_dim = 64

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: int = 32) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

        self.block1 = block(in_channels, width)
        self.block2 = block(width, 2 * width)
        self.block3 = block(2 * width, 2 * width)
        self.pool = MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, num_classes)
        self.feature_dim = 2 * width

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Globally pooled features [B, 2*width]."""
        out = self.pool(self.block1(x))
        out = self.pool(self.block2(out))
        return torch.flatten(self.gap(self.block3(out)), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.forward_features(x))
