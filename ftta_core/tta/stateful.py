"""Per-client normaliser state (``StatefulNormaliser``) shared by the methods that bring their own BN statistics."""
from __future__ import annotations

from typing import Callable, Dict

import torch


class StatefulNormaliser:
    """Base of normalisers with per-layer state [N, ...] created on first use from the layer's source statistics."""

    def __init__(self) -> None:
        self.n_clients = 0  # set by the method when it installs the normaliser
        self.state: Dict[str, torch.Tensor] = {}

    def get(self, key: str, init: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The state tensor ``key``, created with ``init()`` ([N, ...]) when missing."""
        if key not in self.state:
            if self.n_clients < 1:
                raise RuntimeError("normaliser used before its method installed it (n_clients unknown)")
            self.state[key] = init()
        return self.state[key]

    def source_init(self, source_mean: torch.Tensor, source_var: torch.Tensor, *inner: int) -> torch.Tensor:
        """Source (mean, var) repeated to [N, *inner, 2, C]."""
        stats = torch.stack([source_mean, source_var]).detach()
        return stats.reshape(*[1] * (len(inner) + 1), *stats.shape).repeat(self.n_clients, *inner, 1, 1).clone()

    def state_dict(self) -> dict:
        """Copies of the state tensors."""
        return {k: v.clone() for k, v in self.state.items()}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict`` (variances clamped to >= 0, in case a server step made them negative)."""
        self.state = {k: clamp_variance(v.clone()) for k, v in state.items()}


def clamp_variance(stats: torch.Tensor) -> torch.Tensor:
    """``stats`` [..., 2, C] (mean, var) with the variances clamped to >= 0."""
    return torch.stack([stats[..., 0, :], stats[..., 1, :].clamp_min(0)], -2)
