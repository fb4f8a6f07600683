"""Per-client parameter dicts ``{name: [N, ...]}`` shared by the teacher/source-based methods (EATA, CoTTA, ROID).

Everything here works through the public ``ClientBank`` API, so a method built on it behaves the same on the loop
and vectorized backends: gradients through ``bank.forward(..., params=...)``, an optimiser step with precomputed
gradients, EMA updates, stochastic restore, and ``AnchoredMethod`` (source snapshot, step counter, state_dict).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch

from ..engine.bank import ClientBank, ForwardOutput, LossFn
from ..rng import torch_generator
from .base import GradientMethod, combine

Params = Dict[str, torch.Tensor]


def ema(old: Params, new: Params, momentum: float) -> Params:
    """``momentum * old + (1 - momentum) * new`` per name (a teacher update; momentum 1 keeps ``old``)."""
    return {k: momentum * old[k] + (1.0 - momentum) * new[k].to(old[k].device) for k in old}


def restore_masks(params: Params, prob: float, generator: torch.Generator) -> Dict[str, torch.Tensor]:
    """Boolean masks, one Bernoulli(``prob``) draw per element (drawn on the CPU, so identical on any device)."""
    return {k: (torch.rand(v.shape, generator=generator) < prob).to(v.device) for k, v in params.items()}


def stochastic_restore(params: Params, source: Params, prob: float, generator: torch.Generator) -> Params:
    """CoTTA's stochastic restore: each element goes back to its source value with probability ``prob``."""
    masks = restore_masks(params, prob, generator)
    return {k: torch.where(masks[k], source[k].to(v.device), v) for k, v in params.items()}


def param_grads(bank: ClientBank, loss_of: Callable[[Params], torch.Tensor],
                names: Optional[Sequence[str]] = None) -> Params:
    """Gradients [N, ...] of ``loss_of(params).sum()`` w.r.t. copies of the clients' current parameters.

    ``loss_of`` gets leaf tensors [N, ...] requiring grad and must compute per-client losses [N] with
    ``bank.forward(x, mode, params=...)``; clients are independent, so slice i of a gradient is client i's own.
    """
    params = {k: v.requires_grad_(True) for k, v in bank.get_params(names).items()}
    with torch.enable_grad():
        loss = loss_of(params)
        grads = torch.autograd.grad(loss.sum(), list(params.values()), allow_unused=True)
    return {k: torch.zeros_like(p) if g is None else g.detach() for (k, p), g in zip(params.items(), grads)}


def gradient_step(bank: ClientBank, x: torch.Tensor, grads: Params, bn_mode: str,
                  regularizer: Optional[LossFn] = None) -> ForwardOutput:
    """One step of the bank's own optimiser with precomputed per-client gradients (plus a strategy regulariser).

    The loss handed to ``bank.adapt`` is the linear surrogate ``sum_k <g_k, theta_k>``, whose gradient is exactly
    ``g``: a method whose loss needs several forward passes (an augmented view) runs them through
    ``param_grads`` and still updates with the bank's optimiser state (Adam moments, momentum).
    """
    def surrogate(out: ForwardOutput, params: Params, x: torch.Tensor, clients: slice) -> torch.Tensor:
        terms = [(params[k] * grads[k][clients]).flatten(1).sum(1) for k in params]
        return torch.stack(terms).sum(0)

    return bank.adapt(x, combine(surrogate, regularizer), bn_mode)


def _apply(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``fn`` on a tensor or on every tensor of a dict (None stays None)."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: fn(v) for k, v in value.items()}
    return fn(value)


class AnchoredMethod(GradientMethod):
    """A gradient method with per-client state [N, ...] that starts from the source parameters.

    On the first ``adapt`` the clients' parameters are the source's: ``prepare`` snapshots them as ``source`` and
    calls ``initialize`` for the method's own state. The attributes named in ``state_names`` (tensors or dicts of
    tensors) and the step counter make up ``state_dict``; random draws come from ``generator(purpose, ...)``,
    derived from (seed, method, purpose, step, ...).
    """

    state_names: Tuple[str, ...] = ("source",)

    def __init__(self, seed: int = 0, **optim: Any) -> None:
        super().__init__(**optim)
        self.seed = int(seed)
        self.step = 0
        self.source: Optional[Params] = None

    def initialize(self, bank: ClientBank, x: torch.Tensor) -> None:
        """Create the method's state on the first batch (the clients still hold the source parameters)."""

    def prepare(self, bank: ClientBank, x: torch.Tensor) -> None:
        """Snapshot the source and initialise state on the first call; afterwards move state to ``x``'s device."""
        if self.source is None:
            self.source = bank.get_params()
            self.initialize(bank, x)
        for name in self.state_names:
            setattr(self, name, _apply(getattr(self, name), lambda t: t.to(x.device)))

    def generator(self, purpose: str, *keys: Any) -> torch.Generator:
        """A CPU generator for ``purpose`` at the current step."""
        return torch_generator(self.seed, self.name, purpose, self.step, *keys)

    def state_dict(self) -> dict:
        """The step, the ``state_names`` and, with ``bn='running'``, the running statistics (``GradientMethod``)."""
        state = {name: _apply(getattr(self, name), lambda t: t.detach().cpu().clone()) for name in self.state_names}
        return {**super().state_dict(), "step": self.step, **state}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        super().load_state_dict(state)
        self.step = int(state["step"])
        for name in self.state_names:
            setattr(self, name, _apply(state[name], lambda t: t.clone()))
