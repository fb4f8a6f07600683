"""FedProx (Li et al. 2020): FedAvg plus a proximal client term towards the model received at the last mix."""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ..engine.bank import ClientBank, ForwardOutput, LossFn
from .base import ClientHooks, RemembersStates
from ..tta.tentprox import proximal_term  # the penalty, shared with the tentprox local method
from .basic import FedAvg


class FedProx(ClientHooks, RemembersStates, FedAvg):
    """FedAvg + ``mu/2 ||theta_i - theta_received_i||^2`` in the client loss (TTA-grad; inert for TTA-bn)."""

    name = "fedprox"
    keep = ("received",)

    def __init__(self, mu: float = 1.0) -> None:
        if mu < 0:
            raise ValueError(f"mu must be >= 0, got {mu}")
        self.mu = mu

    def regularizer(self, bank: ClientBank, x: torch.Tensor) -> Optional[LossFn]:
        anchor = self.memory.params(bank, "received")
        if anchor is None or self.mu == 0:
            return None
        mu = self.mu

        def loss(out: ForwardOutput, params: Dict[str, torch.Tensor], x_: torch.Tensor, clients: slice) -> torch.Tensor:
            return proximal_term(params, {k: v[clients] for k, v in anchor.items()}, mu)

        return loss
