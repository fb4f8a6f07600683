"""Models for the FedICON study: the paper's two-layer CNN, its BN variant (FedBN) and a torchvision ResNet-18.

Every model exposes ``forward_features`` (the encoder ``h(x; theta)``, eq. 1) and a linear head ``fc``, so the
encoder is "every parameter not under ``fc.``".
"""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from ..models import build_model
from ..models.cnn import TwoLayerCNN
from ..models.ops import MaxPool2d
from ..rng import derive_seed
from ..validation import check_choice

FEDICON_ARCHS = ("cnn2", "cnn2_bn", "resnet18")
HEAD_PREFIX = "fc."


class TwoLayerCNNBN(TwoLayerCNN):
    """FedICON's two-layer CNN with BatchNorm after each convolution (how the paper runs FedBN, App. A.3)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__(num_classes, in_channels)
        self.bn1, self.bn2 = nn.BatchNorm2d(32), nn.BatchNorm2d(64)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        out = self.pool(torch.relu(self.bn1(self.conv1(x))))
        out = self.pool(torch.relu(self.bn2(self.conv2(out))))
        return torch.relu(self.fc1(torch.flatten(out, 1)))


class ResNet18(nn.Module):
    """torchvision's ResNet-18 (ImageNet stem, random init: no pretrained weights exist here), 512-d features."""

    feature_dim = 512

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        from torchvision.models import resnet18

        net = resnet18(weights=None, num_classes=num_classes)
        net.maxpool = MaxPool2d(3, 2, 1)
        self.body = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3,
                                  net.layer4, net.avgpool)
        self.fc = net.fc

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.body(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.forward_features(x))


def make_model(arch: str, seed: int, num_classes: int = 10) -> nn.Module:
    """A freshly initialised ``arch`` whose initial weights depend only on ``seed``."""
    check_choice("arch", arch, FEDICON_ARCHS)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "fedicon-init", arch))  # nn.Module init draws from the global generator
        if arch == "cnn2":
            return build_model("cnn2", num_classes)
        if arch == "cnn2_bn":
            return TwoLayerCNNBN(num_classes)
        return ResNet18(num_classes)


def encoder_names(model: nn.Module) -> List[str]:
    """Names of the encoder's parameters (everything except the linear head ``fc``)."""
    return [n for n, _ in model.named_parameters() if not n.startswith(HEAD_PREFIX)]


def head_names(model: nn.Module) -> List[str]:
    """Names of the linear head's parameters."""
    return [n for n, _ in model.named_parameters() if n.startswith(HEAD_PREFIX)]


def bn_state_names(model: nn.Module) -> List[str]:
    """State-dict keys of every BatchNorm layer (weights, biases and running statistics): FedBN keeps them local."""
    layers = [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    return [k for k in model.state_dict() if any(k.startswith(layer + ".") for layer in layers)]
