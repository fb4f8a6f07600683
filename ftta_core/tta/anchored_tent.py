"""Tent with a source anchor: the common base of the anchored local methods (``tentprox``, ``rdumb``,
``tentrestore``), clients that cannot drift far from the source model.

``AnchoredTent`` is Tent (its entropy loss and every option: params 'all'/'bn_affine', sgd/adam, lr, momentum,
weight decay, steps, bn 'batch'/'running') with ``AnchoredMethod``'s source snapshot, step counter and generator.
The anchor is the clients' trainable parameters at the first ``adapt`` -- the source model's -- and stays that for
the whole run: a strategy that mixes parameters (FedAvg, ...) changes the clients' parameters, never the anchor.
Everything goes through the public ``ClientBank`` API, so the loop and vectorized backends compute the same thing.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..engine.bank import ClientBank, ForwardOutput, LossFn
from .base import GradientMethod
from .basic import Tent
from .client_params import AnchoredMethod


class AnchoredTent(AnchoredMethod, Tent):
    """Tent whose clients know the source parameters (``source``, snapshotted at the first ``adapt``).

    ``adapt`` is ``GradientMethod.adapt`` (``steps`` optimiser updates on the entropy, plus a strategy regulariser,
    each followed by the ``after_update`` hook) after ``before_adapt``, a hook called once per call before the first
    update; then the step counter (one per ``adapt`` call) advances. ``state_dict`` (``AnchoredMethod``'s)
    holds the step, the source and, with ``bn='running'``, the running statistics.
    """

    name = "anchoredtent"

    def __init__(self, params: str = "all", optimizer: str = "sgd", lr: float = 1e-4, momentum: float = 0.0,
                 weight_decay: float = 0.0, steps: int = 1, bn: str = "batch", bn_momentum: float = 0.1,
                 seed: int = 0) -> None:
        super().__init__(seed=seed, params=params, optimizer=optimizer, lr=lr, momentum=momentum,
                         weight_decay=weight_decay, steps=steps, bn=bn, bn_momentum=bn_momentum)

    def before_adapt(self, bank: ClientBank) -> None:
        """Called at the start of every ``adapt`` (after ``prepare``, before the first update); nothing here."""

    def adapt(self, bank: ClientBank, x: torch.Tensor, regularizer: Optional[LossFn] = None) -> ForwardOutput:
        self.prepare(bank, x)
        self.before_adapt(bank)
        first = GradientMethod.adapt(self, bank, x, regularizer)
        self.step += 1
        return first
