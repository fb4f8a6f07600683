"""The basic local methods: no adaptation, BN adaptation, Tent and hard pseudo-labels."""
from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.nn.functional as F

from ..engine.bank import ClientBank, ForwardOutput, LossFn
from .base import GradientMethod, LocalMethod


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of softmax(logits) along the last dimension."""
    return -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)


class Source(LocalMethod):
    """No adaptation: the frozen source model with its training BN statistics."""

    name = "source"
    bn_mode = "source"

    @torch.no_grad()
    def adapt(self, bank: ClientBank, x: torch.Tensor, regularizer: Optional[LossFn] = None) -> ForwardOutput:
        return bank.forward(x, "source")


class BatchNormAdapt(LocalMethod):
    """TTA-bn: normalise with the current batch's statistics; clients share per-layer BN mean/variance."""

    name = "bn"
    shares = "bn_stats"

    @torch.no_grad()
    def adapt(self, bank: ClientBank, x: torch.Tensor, regularizer: Optional[LossFn] = None) -> ForwardOutput:
        return bank.forward(x, "batch")


class Tent(GradientMethod):
    """Tent: minimise the mean prediction entropy (BN affine only, or all parameters as in FedTSA/FedCTTA)."""

    name = "tent"

    def loss(self, out: ForwardOutput, params: Dict[str, torch.Tensor], x: torch.Tensor, clients: slice) -> torch.Tensor:
        return entropy(out.logits).mean(1)


class PseudoLabel(GradientMethod):
    """Hard pseudo-label cross-entropy on the model's own argmax (the FedTSA/FedCTTA reference code's 'fedpl')."""

    name = "pl"

    def loss(self, out: ForwardOutput, params: Dict[str, torch.Tensor], x: torch.Tensor, clients: slice) -> torch.Tensor:
        target = out.logits.argmax(-1).detach()
        return F.cross_entropy(out.logits.flatten(0, 1), target.flatten(), reduction="none").view(target.shape).mean(1)
