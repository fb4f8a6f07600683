"""FedProx anchored at the source model: the proximal term pulls each client towards the parameters it started the
run with, for the whole run, instead of towards the model it received at the last mix."""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ..engine.bank import ClientBank, ForwardOutput, LossFn
from .base import clone_state
from .fedprox import FedProx, proximal_term


class FedProxSource(FedProx):
    """FedAvg + ``mu/2 ||theta_i - theta_source||^2`` in the client loss (TTA-grad; inert for TTA-bn).

    Under one adaptation step per round from the received model, FedProx's own anchor contributes no gradient and
    FedProx equals FedAvg (``tests/test_strategies.py``), whereas FedTSA's Table 1 reports the two apart. A FedProx
    client that copies its anchor once, when it is built, and never again (the public Fling client refreshes it at
    each ``train`` call; the reference TTA code's FedProx client is not public) is this strategy: one candidate,
    run beside the paper's FedProx - FedAvg in notebook 10. The anchor is the bank's trainable parameters at the
    first local step, i.e. the source model's, kept in the strategy's state so a resumed run keeps it.
    """

    name = "fedprox_source"
    keep = ()

    def __init__(self, mu: float = 1.0) -> None:
        super().__init__(mu)
        self.source: Optional[Dict[str, torch.Tensor]] = None

    def reset(self, n_clients: int) -> None:
        super().reset(n_clients)
        self.source = None

    def regularizer(self, bank: ClientBank, x: torch.Tensor) -> Optional[LossFn]:
        if not bank.trainable or self.mu == 0:
            return None
        if self.source is None:  # the first local step: the clients still hold the source model
            self.source = bank.get_params()
        anchor, mu = self.source, self.mu

        def loss(out: ForwardOutput, params: Dict[str, torch.Tensor], x_: torch.Tensor, clients: slice) -> torch.Tensor:
            return proximal_term(params, {k: v[clients] for k, v in anchor.items()}, mu)

        return loss

    def state_dict(self) -> dict:
        return {**super().state_dict(), "source": None if self.source is None else clone_state(self.source)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.source = None if state.get("source") is None else clone_state(state["source"])
