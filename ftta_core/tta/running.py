"""BatchNorm as the FL papers' reference clients ran it under TTA-grad (``bn="running"``).

The FedTSA/FedCTTA reference code adapts a standard ``nn.BatchNorm2d`` model in train mode and predicts in eval
mode: every adapting forward normalises with the batch's statistics (gradients flow through them) and updates the
layer's running statistics, ``r <- (1 - m) r + m s`` with momentum m = 0.1 and the batch's *unbiased* variance;
predictions (and FedCTTA's probes) use the running statistics; the server mixes the whole ``state_dict``, running
statistics included. ``RunningStatistics`` is that behaviour as a normaliser (``engine.layers.Normaliser``) with
per-client state [N, 2, C] per layer, so both client banks compute it and the local method shares it.
"""
from __future__ import annotations

from typing import Tuple

import torch

from .stateful import StatefulNormaliser

BN_SEMANTICS = ("batch", "running")
RUNNING_PREFIX = "running."  # key prefix of the running statistics in a method's shared state


class RunningStatistics(StatefulNormaliser):
    """Per-client running BN statistics: batch statistics + momentum update while ``training``, else the running ones.

    State ``state[layer]`` [N, 2, C] holds (running mean, running unbiased variance), initialised from the source
    model's running buffers. ``momentum`` is torch's (weight of the new batch).
    """

    def __init__(self, momentum: float = 0.1) -> None:
        super().__init__()
        if not 0.0 < momentum <= 1.0:
            raise ValueError(f"bn_momentum must be in (0, 1], got {momentum}")
        self.momentum = float(momentum)
        self.training = False

    def __call__(self, layer: str, x: torch.Tensor, clients: slice, source_mean: torch.Tensor,
                 source_var: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        state = self.get(layer, lambda: self.source_init(source_mean, source_var))
        if not self.training:
            own = state[clients]
            return own[:, 0], own[:, 1]
        mean = x.mean(dim=(1, 3))
        var = (x - mean[:, None, :, None]).square().mean(dim=(1, 3))
        count = x.shape[1] * x.shape[3]
        unbiased = var.detach() * (count / max(count - 1, 1))
        new = torch.stack([mean.detach(), unbiased], 1)
        with torch.no_grad():
            state[clients] = (1 - self.momentum) * state[clients] + self.momentum * new
        return mean, var
