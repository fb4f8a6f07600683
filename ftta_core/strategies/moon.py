"""MOON (Li et al., CVPR 2021): FedAvg plus a model-contrastive client loss on the penultimate features."""
from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.nn.functional as F

from ..engine.bank import ClientBank, ForwardOutput, LossFn
from .base import RemembersStates
from .basic import FedAvg


def moon_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """Per-client ``mean_b -log(e^{cos(z,z_g)/tau} / (e^{cos(z,z_g)/tau} + e^{cos(z,z_p)/tau}))`` [n] from [n,B,D]."""
    pos = F.cosine_similarity(z, z_glob, dim=-1)
    neg = F.cosine_similarity(z, z_prev, dim=-1)
    logits = torch.stack([pos, neg], dim=-1) / tau
    return -logits.log_softmax(-1)[..., 0].mean(-1)


class MOON(RemembersStates, FedAvg):
    """FedAvg + ``mu * moon_loss`` with z_glob from the model received at the last mix and z_prev from the
    client's previous local (pre-mix) model, both on the current batch (TTA-grad; inert for TTA-bn)."""

    name = "moon"
    keep = ("local", "received")

    def __init__(self, mu: float = 1.0, tau: float = 0.5) -> None:
        if mu < 0:
            raise ValueError(f"mu must be >= 0, got {mu}")
        if not tau > 0:
            raise ValueError(f"tau must be positive, got {tau}")
        self.mu, self.tau = mu, tau

    def regularizer(self, bank: ClientBank, x: torch.Tensor) -> Optional[LossFn]:
        received, previous = self.memory.params(bank, "received"), self.memory.params(bank, "local")
        if received is None or previous is None or self.mu == 0:
            return None
        with torch.no_grad():
            z_glob = bank.forward(x, "batch", params=received).features
            z_prev = bank.forward(x, "batch", params=previous).features
        mu, tau = self.mu, self.tau

        def loss(out: ForwardOutput, params: Dict[str, torch.Tensor], x_: torch.Tensor, clients: slice) -> torch.Tensor:
            return mu * moon_loss(out.features, z_glob[clients], z_prev[clients], tau)

        return loss
