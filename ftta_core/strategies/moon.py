"""MOON (Li et al., CVPR 2021): FedAvg plus a model-contrastive client loss on the penultimate features."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ..engine.bank import ClientBank, ForwardOutput, LossFn
from .base import ClientHooks, InputRegularizer, RemembersStates
from .basic import FedAvg


def moon_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """Per-client ``mean_b -log(e^{cos(z,z_g)/tau} / (e^{cos(z,z_g)/tau} + e^{cos(z,z_p)/tau}))`` [n] from [n,B,D]."""
    pos = F.cosine_similarity(z, z_glob, dim=-1)
    neg = F.cosine_similarity(z, z_prev, dim=-1)
    logits = torch.stack([pos, neg], dim=-1) / tau
    return -logits.log_softmax(-1)[..., 0].mean(-1)


class MOON(ClientHooks, RemembersStates, FedAvg):
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
        mu, tau = self.mu, self.tau

        def targets(inputs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
            return (bank.forward(inputs, "batch", params=received).features,
                    bank.forward(inputs, "batch", params=previous).features)

        def loss(out: ForwardOutput, z: Tuple[torch.Tensor, torch.Tensor], clients: slice) -> torch.Tensor:
            return mu * moon_loss(out.features, z[0][clients], z[1][clients], tau)

        return InputRegularizer(targets, loss, x)
