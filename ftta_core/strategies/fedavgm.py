"""FedAvgM (Hsu et al. 2019): FedAvg with server momentum on the global model."""
from __future__ import annotations

from typing import Dict, Optional

import torch

from .base import ServerInputs, StateDict, clone_state, is_bn_stats
from .basic import FedAvg
from ..validation import check_choice

MOMENTUM_ON = ("all", "params")


class FedAvgM(FedAvg):
    """Server momentum: ``v <- beta v + (g - avg)``, ``g <- g - lr v``; every client receives g (W reported = FedAvg).

    The server starts with no global model: at the first mix ``g_prev := avg`` and ``v := 0``, so step 1 equals
    FedAvg. Momentum can push a mixed BN variance below zero, so variance rows of BN-statistics entries are clamped
    at 0 (TTA-bn only; parameters are never clamped).

    ``momentum_on``: "all" (default: every shared tensor, BN statistics included, as a server optimiser applied to
    the whole uploaded state) or "params" (momentum on parameters only; normalisation statistics, i.e. TTA-bn's
    [N, 2, C] entries and ``bn='running'`` statistics, are plain FedAvg). Under TTA-bn "params" equals FedAvg.
    """

    name = "fedavgm"
    robust_mixing_aware = True  # the average its momentum follows is ``mean_state`` (robust with robust mixing)

    def __init__(self, beta: float = 0.9, server_lr: float = 1.0, momentum_on: str = "all") -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        if not server_lr > 0:
            raise ValueError(f"server_lr must be positive, got {server_lr}")
        check_choice("momentum_on", momentum_on, MOMENTUM_ON)
        self.beta, self.server_lr, self.momentum_on = beta, server_lr, momentum_on
        self.global_model: Optional[StateDict] = None
        self.momentum: Optional[StateDict] = None
        self._valid: Optional[torch.Tensor] = None

    def reset(self, n_clients: int) -> None:
        super().reset(n_clients)
        self.global_model, self.momentum, self._valid = None, None, None

    def collaboration(self, inputs: ServerInputs) -> torch.Tensor:
        self._valid = inputs.valid.cpu().bool()
        return super().collaboration(inputs)

    def mix(self, state: Dict[str, torch.Tensor], weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        n = weights.shape[0]
        valid = self._valid if self._valid is not None and len(self._valid) == n else torch.ones(n, dtype=torch.bool)
        if not bool(valid.any()):
            return clone_state(state)
        avg = self.mean_state(state, weights[int(torch.nonzero(valid)[0])])  # a valid client's FedAvg row
        if self.global_model is None or set(self.global_model) != set(avg):
            self.global_model = avg
            self.momentum = {k: torch.zeros_like(v) for k, v in avg.items()}
        new_global = {}
        for k, a in avg.items():
            if self.momentum_on == "params" and is_bn_stats(k, a):
                new_global[k] = a
                continue
            self.momentum[k] = self.beta * self.momentum[k] + (self.global_model[k] - a)
            g = self.global_model[k] - self.server_lr * self.momentum[k]
            if is_bn_stats(k, g):
                g = torch.stack([g[:, 0], g[:, 1].clamp_min(0)], 1)
            new_global[k] = g
        self.global_model = new_global
        return {k: v.expand_as(state[k]).clone() for k, v in new_global.items()}

    def state_dict(self) -> dict:
        if self.global_model is None:
            return {}
        return {"global": clone_state(self.global_model), "momentum": clone_state(self.momentum)}

    def load_state_dict(self, state: dict) -> None:
        self.global_model = clone_state(state["global"]) if "global" in state else None
        self.momentum = clone_state(state["momentum"]) if "momentum" in state else None
