"""The simplest strategies: no collaboration (Local) and uniform or size-weighted averaging (FedAvg)."""
from __future__ import annotations

import torch

from .base import ServerInputs, Strategy


class Local(Strategy):
    """No collaboration: W = I."""

    name = "local"

    def collaboration(self, inputs: ServerInputs) -> torch.Tensor:
        n = inputs.valid.shape[0]
        return torch.eye(n)


class FedAvg(Strategy):
    """FedAvg: every client receives the sample-weighted mean (uniform for equal batches)."""

    name = "fedavg"

    def collaboration(self, inputs: ServerInputs) -> torch.Tensor:
        n = inputs.valid.shape[0]
        sizes = torch.ones(n) if inputs.sizes is None else inputs.sizes.float()
        return (sizes / sizes.sum()).unsqueeze(0).repeat(n, 1)


class FedAvgFT(FedAvg):
    """FedAvg+FT: FedAvg, then each client adapts again on its batch before predicting."""

    name = "fedavg_ft"
    finetune_after_mix = True
