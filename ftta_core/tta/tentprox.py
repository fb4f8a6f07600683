"""Source-proximal Tent (``tentprox``): Tent's entropy plus a proximal term towards the source parameters."""
from __future__ import annotations

from typing import Dict

import torch

from ..engine.bank import ForwardOutput
from .anchored_tent import AnchoredTent


def proximal_term(params: Dict[str, torch.Tensor], anchor: Dict[str, torch.Tensor], mu: float) -> torch.Tensor:
    """Per-client ``mu/2 * sum_k ||theta_k - anchor_k||^2`` [n] over the named parameters [n, ...]."""
    total = None
    for k, p in params.items():
        sq = (p - anchor[k].to(p.device, p.dtype)).pow(2).reshape(p.shape[0], -1).sum(1)
        total = sq if total is None else total + sq
    return 0.5 * mu * total


class TentProx(AnchoredTent):
    """Tent + ``mu/2 * ||theta_i - theta_source||^2`` in every client's loss (Wang et al., ICLR'21, Tent; the
    proximal term of FedProx, Li et al., MLSys'20, anchored at the source model).

    Per client i and step: ``L_i = mean_b H(softmax(f_theta_i(x_ib))) + mu/2 * sum_k ||theta_i,k - theta_source,k||^2``
    over the trained parameters k (``params``). ``theta_source`` is the clients' parameters at the first ``adapt``
    (the source model's), never the mixed model. The penalty is ``proximal_term`` (here, in the local-method layer),
    which the ``fedprox`` and ``fedprox_source`` strategies import: ``tentprox`` with FedAvg is the local-method form of
    ``fedprox_source`` with Tent (the same loss), usable beside any strategy. ``mu=0`` is Tent exactly.
    """

    name = "tentprox"

    def __init__(self, mu: float = 1.0, params: str = "all", optimizer: str = "sgd", lr: float = 1e-4,
                 momentum: float = 0.0, weight_decay: float = 0.0, steps: int = 1, bn: str = "batch",
                 bn_momentum: float = 0.1, seed: int = 0) -> None:
        super().__init__(params=params, optimizer=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay,
                         steps=steps, bn=bn, bn_momentum=bn_momentum, seed=seed)
        if mu < 0:
            raise ValueError(f"mu must be >= 0, got {mu}")
        self.mu = float(mu)

    def loss(self, out: ForwardOutput, params: Dict[str, torch.Tensor], x: torch.Tensor, clients: slice) -> torch.Tensor:
        anchor = {k: self.source[k][clients] for k in params}
        return super().loss(out, params, x, clients) + proximal_term(params, anchor, self.mu)
