"""Local test-time adaptation methods: what a client does with its batch, and what it can share."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Dict, List, Optional, Protocol, runtime_checkable

import torch
from torch import nn

from ..engine.bank import ClientBank, ForwardOutput, LossFn, OptimizerSpec
from ..validation import check_choice
from .running import BN_SEMANTICS, RUNNING_PREFIX, RunningStatistics
from .stateful import clamp_variance

PARAM_GROUPS = ("bn_affine", "all")


def select_parameters(model: nn.Module, group: str) -> List[str]:
    """Names of the parameters in ``group``: 'bn_affine' (BatchNorm weight/bias) or 'all'."""
    if group == "all":
        return [n for n, _ in model.named_parameters()]
    if group == "bn_affine":
        bn_layers = [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
        return [f"{layer}.{p}" for layer in bn_layers for p in ("weight", "bias")]
    raise ValueError(f"params must be one of {PARAM_GROUPS}, got {group!r}")


@runtime_checkable
class BNStatisticsSource(Protocol):
    """A local method that defines the BN statistics its clients stand for (BBN's class-balanced ones, RoTTA's
    teacher RobustBN ones): pFedBBN compares these instead of the statistics of the clients' last BN forward. A
    method provides them by defining ``bn_statistics`` (no base class to add; checked with ``isinstance``)."""

    def bn_statistics(self, bank: ClientBank) -> Dict[str, torch.Tensor]:
        """Every client's (mean, var) [N, 2, C] per BN layer name."""
        ...


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

    @torch.no_grad()
    def eval_forward(self, bank: ClientBank, x: torch.Tensor) -> ForwardOutput:
        """The client models as ``model.eval()`` runs them in the reference code (FedCTTA's probes, ``probe_bn=
        'eval'``): by default the prediction's normalisation; TTA-bn and ``bn='running'`` override it."""
        return self.predict(bank, x)


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
                 weight_decay: float = 0.0, steps: int = 1, bn: str = "batch", bn_momentum: float = 0.1) -> None:
        check_choice("params", params, PARAM_GROUPS)
        check_choice("bn", bn, BN_SEMANTICS)
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.params = params
        self.optimizer_spec = OptimizerSpec(optimizer, lr, momentum, weight_decay)
        self.steps = steps
        # bn="batch": every forward normalises with its batch's statistics, nothing is kept (shared: parameters).
        # bn="running": the reference clients' train/eval BatchNorm (``tta.running``): adapting forwards update
        # per-client running statistics, predictions use them, and they are shared with the parameters.
        self.bn = bn
        self.running: Optional[RunningStatistics] = RunningStatistics(bn_momentum) if bn == "running" else None
        if self.running is not None:
            self.bn_mode = "custom"

    def trainable(self, model: nn.Module) -> List[str]:
        return select_parameters(model, self.params)

    def optimizer(self) -> Optional[OptimizerSpec]:
        return self.optimizer_spec

    @abstractmethod
    def loss(self, out: ForwardOutput, params: Dict[str, torch.Tensor], x: torch.Tensor, clients: slice) -> torch.Tensor:
        """Per-client unsupervised loss [n]."""

    def adapt(self, bank: ClientBank, x: torch.Tensor, regularizer: Optional[LossFn] = None) -> ForwardOutput:
        loss = combine(self.loss, regularizer)
        first: Optional[ForwardOutput] = None
        with self.training(bank):
            for update in range(self.steps):
                out = bank.adapt(x, loss, self.bn_mode)
                self.after_update(bank, update)
                first = out if first is None else first
        return first

    def after_update(self, bank: ClientBank, update: int) -> None:
        """Called after optimiser update ``update`` (0 .. steps-1) of every ``adapt``; nothing by default (an
        anchored method restores parameters here, ``tta.tentrestore``)."""

    def training(self, bank: ClientBank) -> "_Training":
        """Context in which the bank's forwards are the reference code's train-mode ones (``bn='running'``: running
        statistics updated); outside it they are eval-mode ones. A no-op with ``bn='batch'``."""
        if self.running is not None:
            self.running.n_clients = bank.n_clients
            bank.set_normaliser(self.running)
        return _Training(self.running)

    @torch.no_grad()
    def predict(self, bank: ClientBank, x: torch.Tensor) -> ForwardOutput:
        if self.running is not None:
            self.running.n_clients = bank.n_clients
            bank.set_normaliser(self.running)
        return super().predict(bank, x)

    def shared_state(self, bank: ClientBank) -> Dict[str, torch.Tensor]:
        """The trained parameters, plus with ``bn='running'`` the running statistics [N, 2, C] per BN layer (as
        ``running.<layer>``): the reference code's whole ``state_dict``."""
        state = super().shared_state(bank)
        if self.running is not None:
            state.update({RUNNING_PREFIX + k: v.clone() for k, v in self.running.state.items()})
        return state

    def load_state(self, bank: ClientBank, state: Dict[str, torch.Tensor]) -> None:
        super().load_state(bank, {k: v for k, v in state.items() if not k.startswith(RUNNING_PREFIX)})
        if self.running is not None:
            for k, v in state.items():
                if k.startswith(RUNNING_PREFIX):
                    self.running.state[k[len(RUNNING_PREFIX):]] = clamp_variance(v.clone())

    def state_dict(self) -> dict:
        return {} if self.running is None else {"running": self.running.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.running is not None and state.get("running") is not None:
            self.running.load_state_dict(state["running"])


class _Training:
    """Sets ``RunningStatistics.training`` for the duration of a ``with`` block (nothing without one)."""

    def __init__(self, running: Optional[RunningStatistics]) -> None:
        self.running = running

    def __enter__(self) -> None:
        if self.running is not None:
            self.running.training = True

    def __exit__(self, *exc) -> None:
        if self.running is not None:
            self.running.training = False
