"""Tent with CoTTA's stochastic restore (``tentrestore``), without CoTTA's teacher and augmentations."""
from __future__ import annotations

from ..engine.bank import ClientBank
from .anchored_tent import AnchoredTent
from .client_params import stochastic_restore


class TentRestore(AnchoredTent):
    """Tent + stochastic restore (Wang et al., CVPR'22, CoTTA: its stochastic restoration, probability 0.01 there).

    Rule: after each optimiser update of Tent, every element of every trained parameter of every client goes back to
    its source value (the clients' parameters at the first ``adapt``, never the mixed model) independently with
    probability ``p``: ``theta <- m * theta_source + (1 - m) * theta`` with ``m ~ Bernoulli(p)`` per element. The
    masks come from ``client_params.stochastic_restore`` (CoTTA's) with the generator
    ``generator("restore", update)`` for (seed, 'tentrestore', 'restore', step, update), drawn on the CPU over all
    clients at once, so both backends draw the same masks. Only parameters are restored (as in CoTTA), not the
    optimiser state or running BN statistics. ``p=0`` is Tent exactly; ``p=1`` gives the source after each update.
    """

    name = "tentrestore"

    def __init__(self, p: float = 0.01, params: str = "all", optimizer: str = "sgd", lr: float = 1e-4,
                 momentum: float = 0.0, weight_decay: float = 0.0, steps: int = 1, bn: str = "batch",
                 bn_momentum: float = 0.1, seed: int = 0) -> None:
        super().__init__(params=params, optimizer=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay,
                         steps=steps, bn=bn, bn_momentum=bn_momentum, seed=seed)
        if not 0 <= p <= 1:
            raise ValueError(f"p must be a probability in [0, 1], got {p}")
        self.p = float(p)

    def after_update(self, bank: ClientBank, update: int) -> None:
        if self.p > 0:
            bank.set_params(stochastic_restore(bank.get_params(), self.source, self.p,
                                               self.generator("restore", update)))
