"""Local test-time adaptation methods: what a client does with its batch, and what it can share."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Dict, List, Optional

import torch
from torch import nn

from ..engine.bank import ClientBank, ForwardOutput, LossFn, OptimizerSpec
from ..validation import check_choice

PARAM_GROUPS = ("bn_affine", "all")


def select_parameters(model: nn.Module, group: str) -> List[str]:
    """Names of the parameters in ``group``: 'bn_affine' (BatchNorm weight/bias) or 'all'."""
    if group == "all":
        return [n for n, _ in model.named_parameters()]
    if group == "bn_affine":
        bn_layers = [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
        return [f"{layer}.{p}" for layer in bn_layers for p in ("weight", "bias")]
    raise ValueError(f"params must be one of {PARAM_GROUPS}, got {group!r}")


class LocalMethod(ABC):
    """A client-side TTA method. ``shares`` says what the server can mix: 'bn_stats', 'params' or 'nothing'."""

    name: str = "base"
    shares: str = "nothing"
    bn_mode: str = "batch"

    def trainable(self, model: nn.Module) -> List[str]:
        """Parameters the method trains (none by default)."""
        return []

    def optimizer(self) -> Optional[OptimizerSpec]:
        """The client optimiser (None when nothing is trained)."""
        return None

    @abstractmethod
    def adapt(self, bank: ClientBank, x: torch.Tensor, regularizer: Optional[LossFn] = None) -> ForwardOutput:
        """Adapt every client on its batch ``x`` [N,B,C,H,W]; return the outputs of the local prediction."""

    def shared_state(self, bank: ClientBank) -> Dict[str, torch.Tensor]:
        """The state the server mixes, stacked over clients ([N, ...] per name)."""
        if self.shares == "bn_stats":
            return bank.bn_stats()
        if self.shares == "params":
            return bank.get_params()
        return {}

    def load_state(self, bank: ClientBank, state: Dict[str, torch.Tensor]) -> None:
        """Install mixed state into every client."""
        if self.shares == "bn_stats":
            bank.set_bn_stats(state)
        elif self.shares == "params":
            bank.set_params(state)

    def state_dict(self) -> dict:
        """Method state beyond the bank (teachers, memories, EMA statistics) for resuming; none by default."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``."""

    @torch.no_grad()
    def predict(self, bank: ClientBank, x: torch.Tensor) -> ForwardOutput:
        """Predict with the (mixed) client models: BN-adapt uses the installed statistics."""
        return bank.forward(x, "given" if self.shares == "bn_stats" else self.bn_mode)


def regularizer_on(regularizer: Optional[LossFn], x: torch.Tensor) -> Optional[LossFn]:
    """``regularizer`` for clients that train on inputs ``x`` other than the step's batch (its targets recomputed
    there when they depend on the inputs, ``strategies.base.InputRegularizer``; FedProx's does not)."""
    return regularizer.on(x) if hasattr(regularizer, "on") else regularizer


def combine(loss: LossFn, regularizer: Optional[LossFn]) -> LossFn:
    """The method's loss plus an optional strategy regulariser (FedProx, MOON, pFedSD)."""
    if regularizer is None:
        return loss
    return lambda out, params, x, clients: loss(out, params, x, clients) + regularizer(out, params, x, clients)


class GradientMethod(LocalMethod):
    """A method that takes optimiser steps on an unsupervised loss of its own outputs (TTA-grad)."""

    shares = "params"

    def __init__(self, params: str = "all", optimizer: str = "sgd", lr: float = 1e-4, momentum: float = 0.0,
                 weight_decay: float = 0.0, steps: int = 1) -> None:
        check_choice("params", params, PARAM_GROUPS)
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.params = params
        self.optimizer_spec = OptimizerSpec(optimizer, lr, momentum, weight_decay)
        self.steps = steps

    def trainable(self, model: nn.Module) -> List[str]:
        return select_parameters(model, self.params)

    def optimizer(self) -> Optional[OptimizerSpec]:
        return self.optimizer_spec

    @abstractmethod
    def loss(self, out: ForwardOutput, params: Dict[str, torch.Tensor], x: torch.Tensor, clients: slice) -> torch.Tensor:
        """Per-client unsupervised loss [n]."""

    def adapt(self, bank: ClientBank, x: torch.Tensor, regularizer: Optional[LossFn] = None) -> ForwardOutput:
        loss = combine(self.loss, regularizer)
        first = bank.adapt(x, loss, self.bn_mode)
        for _ in range(self.steps - 1):
            bank.adapt(x, loss, self.bn_mode)
        return first
