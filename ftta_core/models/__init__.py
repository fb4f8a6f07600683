"""Model architectures and the committed source-model checkpoints."""
from __future__ import annotations

from typing import Callable, Dict

from torch import nn

from .cnn import DigitsCNN, TwoLayerCNN
from .resnet import ResNet8

ARCHITECTURES: Dict[str, Callable[..., nn.Module]] = {
    "resnet8": ResNet8,
    "cnn2": TwoLayerCNN,
    "digits_cnn": DigitsCNN,
}


def build_model(arch: str, num_classes: int = 10) -> nn.Module:
    """Instantiate architecture ``arch`` (one of ``ARCHITECTURES``) with a ``num_classes`` head."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; valid: {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[arch](num_classes=num_classes)


__all__ = ["ARCHITECTURES", "build_model", "ResNet8", "TwoLayerCNN", "DigitsCNN"]
