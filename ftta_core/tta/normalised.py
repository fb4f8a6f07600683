"""Shared pieces of local methods that bring their own BatchNorm statistics (engine BN mode ``custom``).

A *normaliser* (``engine.layers.Normaliser``) answers every BN layer's request for (mean, var); the ones here keep
per-client state with a leading client dimension ``[N, ...]`` and read/write ``state[clients]``, so the loop and
vectorized banks give the same results. ``NormalisedMethod`` is the base of RoTTA and BBN: it trains the BN affine
parameters only, installs its normaliser in the bank, keeps a step counter for its random draws, and shares the
parameters (plus, with ``mix_statistics``, the normaliser's statistics) with the server.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from ..engine.bank import ClientBank
from ..rng import torch_generator
from .base import GradientMethod
from .stateful import StatefulNormaliser, clamp_variance


def class_moments(x: torch.Tensor, labels: torch.Tensor, n_classes: int,
                  weights: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-class channel moments of activations ``x`` [n, B, C, HW] with hard ``labels`` [n, B].

    Returns mean [n, K, C], biased variance [n, K, C] (two passes: mean, then mean squared deviation from the
    sample's class mean) and the weight of each class [n, K] (samples, times ``weights`` [n, B] if given: a weight
    0 leaves a sample out). Classes without weight get mean 0 and variance 0 (callers keep their old values).
    """
    onehot = F.one_hot(labels, n_classes).to(x.dtype)
    if weights is not None:
        onehot = onehot * weights.to(x.dtype)[..., None]
    counts = onehot.sum(1)  # [n, K]
    per_value = (counts * x.shape[-1]).clamp_min(1e-12)[..., None]
    mean = torch.einsum("nbk,nbc->nkc", onehot, x.sum(-1)) / per_value
    own = mean.gather(1, labels[..., None].expand(-1, -1, x.shape[2]))  # [n, B, C]: each sample's class mean
    sq = (x - own[..., None]).square().sum(-1)
    var = torch.einsum("nbk,nbc->nkc", onehot, sq) / per_value
    return mean, var, counts


class NormalisedMethod(GradientMethod):
    """Base of methods with a normaliser: BN affine training, normaliser installation, shared statistics, resume."""

    bn_mode = "custom"
    stats_prefix = "norm."  # key prefix of the normaliser's statistics in the shared state

    def __init__(self, normaliser: StatefulNormaliser, optimizer: str = "adam", lr: float = 1e-3,
                 momentum: float = 0.0, weight_decay: float = 0.0, mix_statistics: bool = True, seed: int = 0) -> None:
        super().__init__("bn_affine", optimizer, lr, momentum, weight_decay, 1)
        self.normaliser = normaliser
        self.mix_statistics, self.seed = bool(mix_statistics), int(seed)
        self.step = 0  # adapt() calls so far (keys the random draws)

    def install(self, bank: ClientBank) -> StatefulNormaliser:
        """Make ``bank``'s BN layers ask this method's normaliser (idempotent); return it."""
        self.normaliser.n_clients = bank.n_clients
        bank.set_normaliser(self.normaliser)
        return self.normaliser

    def generator(self, purpose: str, *keys) -> torch.Generator:
        """A generator for this method's draws at the current step."""
        return torch_generator(self.seed, self.name, purpose, self.step, *keys)

    def extra_state(self) -> Dict[str, torch.Tensor]:
        """Method tensors [N, ...] mixed with the parameters (e.g. a teacher); none by default."""
        return {}

    def load_extra_state(self, state: Dict[str, torch.Tensor]) -> None:
        """Install mixed ``extra_state`` tensors."""

    def shared_state(self, bank: ClientBank) -> Dict[str, torch.Tensor]:
        state = {**bank.get_params(), **self.extra_state()}
        if self.mix_statistics:
            state.update({self.stats_prefix + k: v.clone() for k, v in self.normaliser.state.items()})
        return state

    def load_state(self, bank: ClientBank, state: Dict[str, torch.Tensor]) -> None:
        bank.set_params({k: state[k] for k in bank.trainable if k in state})
        self.load_extra_state(state)
        for k, v in state.items():
            if k.startswith(self.stats_prefix):
                self.normaliser.state[k[len(self.stats_prefix):]] = clamp_variance(v.clone())

    def state_dict(self) -> dict:
        return {"step": self.step, "normaliser": self.normaliser.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        self.step = int(state["step"])
        self.normaliser.load_state_dict(state["normaliser"])
