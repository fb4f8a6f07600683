"""FedAcross+ model: backbone f (torchvision ResNet-18) -> adaptation module A (eq. 1) -> classifier g."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List

import torch
import torchvision
from torch import nn

from ..validation import check_choice

STEMS = ("imagenet", "cifar")
BACKBONES = ("resnet18", "resnet34")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a FedAcross+ model.

    ``stem``: 'imagenet' is torchvision's 7x7/2 conv + max-pool (cheap at 32x32: 8x8 maps after the stem);
    'cifar' is a 3x3/1 conv without max-pool (the usual CIFAR ResNet stem, ~10x the compute at 32x32).
    Backbones are randomly initialised: no ImageNet weights exist on these machines.
    """

    backbone: str = "resnet18"
    stem: str = "imagenet"
    num_classes: int = 10
    embed_dim: int = 512

    def __post_init__(self) -> None:
        check_choice("backbone", self.backbone, BACKBONES)
        check_choice("stem", self.stem, STEMS)
        for name in ("num_classes", "embed_dim"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")

    def to_dict(self) -> Dict[str, object]:
        """JSON-friendly fields."""
        return asdict(self)


def adaptation_module(in_dim: int, out_dim: int) -> nn.Sequential:
    """A = ReLU(BN1d(W x + b)) (eq. 1: linear layer with its own batch normalisation, then ReLU as in the code)."""
    return nn.Sequential(nn.Linear(in_dim, out_dim), nn.BatchNorm1d(out_dim), nn.ReLU())


def build_backbone(spec: ModelSpec) -> nn.Module:
    """torchvision ResNet without its head (output: the pooled 512-d features), randomly initialised."""
    net = getattr(torchvision.models, spec.backbone)(weights=None)
    if spec.stem == "cifar":
        net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    net.fc = nn.Identity()
    return net


class FedAcrossNet(nn.Module):
    """``g(A(f(x)))``; ``features`` = f(x), ``embed`` = tau(x) = A(f(x)) (the prototype space)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.backbone = build_backbone(spec)
        self.adapter = adaptation_module(512, spec.embed_dim)
        self.classifier = nn.Linear(spec.embed_dim, spec.num_classes)
        # the paper: normal init for the linear layers, Xavier-normal for the BN weights. We draw the BN weights
        # as 1 + Xavier-normal noise of a [1, m] matrix (pure Xavier would start gamma near 0 with random signs,
        # which stalls a backbone trained from scratch); a stated deviation.
        nn.init.normal_(self.adapter[0].weight, std=0.01)
        nn.init.zeros_(self.adapter[0].bias)
        nn.init.normal_(self.classifier.weight, std=0.01)
        nn.init.zeros_(self.classifier.bias)
        with torch.no_grad():
            w = torch.empty(1, spec.embed_dim)
            nn.init.xavier_normal_(w)
            self.adapter[1].weight.copy_(1.0 + w[0])

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Backbone features f(x) [B, 512]."""
        return self.backbone(x)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """tau(x) = A(f(x)) [B, embed_dim]."""
        return self.adapter(self.features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embed(x))


def adapter_names(model: FedAcrossNet) -> List[str]:
    """Names (in ``state_dict``) of A's parameters and BN buffers: what a client trains and uploads."""
    return [f"adapter.{k}" for k in model.adapter.state_dict()]


def adapter_state(model: FedAcrossNet) -> Dict[str, torch.Tensor]:
    """Detached copies of A's parameters and buffers (keys without the 'adapter.' prefix)."""
    return {k: v.detach().clone() for k, v in model.adapter.state_dict().items()}


def load_adapter(model: FedAcrossNet, state: Dict[str, torch.Tensor]) -> None:
    """Install A's parameters and buffers (keys as ``adapter_state`` returns them)."""
    model.adapter.load_state_dict(state)


def count_parameters(module: nn.Module) -> int:
    """Number of trainable-kind parameters (all ``nn.Parameter`` elements) of ``module``."""
    return sum(p.numel() for p in module.parameters())
