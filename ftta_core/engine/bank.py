"""The client bank: N copies of a model as one batched computation (vectorized) or a list of modules (loop).

The loop backend is the executable specification; the vectorized backend must agree with it (tests).
Parameter names are the source model's ``state_dict`` names in both backends; tensors exchanged with the bank
carry a leading client dimension ``[N, ...]``.
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import nn
from torch.func import functional_call

from .layers import (BN_MODES, PER_CLIENT_CONV, ClientBatchNorm2d, ClientConv2d, ClientLinear, Normaliser,
                     StatBatchNorm2d, expand_clients)
from ..validation import check_choice


@dataclass(frozen=True)
class OptimizerSpec:
    """The client optimiser: ``sgd`` or ``adam`` with its learning rate and constants."""

    name: str = "sgd"
    lr: float = 1e-4
    momentum: float = 0.0
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)

    def __post_init__(self) -> None:
        if self.name not in ("sgd", "adam"):
            raise ValueError(f"optimizer.name must be 'sgd' or 'adam', got {self.name!r}")
        if not self.lr > 0:
            raise ValueError(f"optimizer.lr must be positive, got {self.lr}")

    def build(self, params: Sequence[torch.Tensor], fused: bool = False) -> torch.optim.Optimizer:
        """A torch optimiser over ``params`` (element-wise, so stacked clients = independent optimisers). ``fused``:
        Adam's update in one pass over each tensor (torch's fused kernel, on CPU and CUDA floating-point tensors)
        instead of the eight element-wise passes of its reference loop; the same update to float rounding
        (tests/test_oracle_tent_step.py)."""
        if self.name == "adam":
            fused = fused and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
            return torch.optim.Adam(params, lr=self.lr, betas=self.betas, weight_decay=self.weight_decay,
                                    fused=fused or None)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)


@dataclass
class ForwardOutput:
    """Outputs of all clients on their batches: logits [N,B,K] and penultimate features [N,B,D]."""

    logits: torch.Tensor
    features: torch.Tensor


# loss(out, params, x, clients) -> per-client loss [n]: ``out``, the live trainable ``params`` and ``x`` hold the
# ``n`` clients selected by ``clients`` (all N in the vectorized bank, one at a time in the loop bank), so a loss
# can index per-client reference tensors [N, ...] computed before the step with ``ref[clients]``.
LossFn = Callable[[ForwardOutput, Dict[str, torch.Tensor], torch.Tensor, slice], torch.Tensor]


class _WithFeatures(nn.Module):
    """Wraps a model exposing ``forward_features`` and ``fc`` so one call returns (logits, features)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor):
        feats = self.net.forward_features(x)
        return self.net.fc(feats), feats


def check_model(model: nn.Module) -> None:
    """Raise if ``model`` lacks the ``forward_features``/``fc`` interface the bank needs."""
    if not hasattr(model, "forward_features") or not isinstance(getattr(model, "fc", None), nn.Linear):
        raise TypeError("bank models need forward_features(x) and an nn.Linear attribute fc")


def bn_layer_names(model: nn.Module) -> List[str]:
    """Names of the BatchNorm2d layers of ``model`` in forward order."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]


class ClientBank(ABC):
    """N clients' models. Subclasses: ``LoopBank`` (specification) and ``VectorizedBank`` (one batched call)."""

    n_clients: int
    trainable: List[str]

    @abstractmethod
    def forward(self, x: torch.Tensor, bn_mode: str, params: Optional[Dict[str, torch.Tensor]] = None) -> ForwardOutput:
        """Run every client on its batch ``x`` [N,B,C,H,W]; ``params`` overrides named parameters [N,...]."""

    def forward_shared(self, z: torch.Tensor, bn_mode: str) -> ForwardOutput:
        """Every client on the same inputs ``z`` [M,C,H,W]: ``forward`` of ``z`` expanded to [N,M,C,H,W] (to float
        rounding; FedCTTA's shared probes). Backends may skip the work that does not depend on the client."""
        return self.forward(z.unsqueeze(0).expand(self.n_clients, *z.shape), bn_mode)

    @abstractmethod
    def adapt(self, x: torch.Tensor, loss_fn: LossFn, bn_mode: str = "batch") -> ForwardOutput:
        """One optimiser step on ``sum_i loss_i``; returns the (detached) outputs of the adapting forward."""

    @abstractmethod
    def bn_stats(self) -> Dict[str, torch.Tensor]:
        """Per-layer statistics [N,2,C] (mean, biased var) recorded by the last batch-mode forward."""

    @abstractmethod
    def set_bn_stats(self, stats: Dict[str, torch.Tensor]) -> None:
        """Statistics [N,2,C] used by the next forward in ``given`` mode."""

    @abstractmethod
    def set_normaliser(self, normaliser: Optional[Normaliser]) -> None:
        """The object every BN layer asks for its (mean, var) in ``custom`` mode (see ``layers.Normaliser``)."""

    @abstractmethod
    def get_params(self, names: Optional[Sequence[str]] = None) -> Dict[str, torch.Tensor]:
        """Detached copies of named parameters stacked over clients [N,...] (default: the trainable ones)."""

    @abstractmethod
    def set_params(self, values: Dict[str, torch.Tensor]) -> None:
        """Overwrite named parameters of every client with ``values`` [N,...]."""

    @abstractmethod
    def reset_optimizer(self) -> None:
        """Forget the optimiser state (momentum, Adam moments) of every client."""

    @abstractmethod
    def state_dict(self) -> dict:
        """Everything needed to resume the bank."""

    @abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict``."""


def _check_mode(bn_mode: str) -> None:
    check_choice("bn_mode", bn_mode, BN_MODES)


class VectorizedBank(ClientBank):
    """All clients in one module: shared layers run once over N*B images, per-client layers are batched."""

    def __init__(self, model: nn.Module, n_clients: int, trainable: Sequence[str] = (),
                 optimizer: Optional[OptimizerSpec] = None, per_client: Sequence[str] = ()) -> None:
        check_model(model)
        self.n_clients = n_clients
        self.trainable = list(trainable)
        stacked = set(trainable) | set(per_client)
        net = copy.deepcopy(model)
        for parent_name, parent in list(net.named_modules()):
            for child_name, child in list(parent.named_children()):
                full = f"{parent_name}.{child_name}" if parent_name else child_name
                own = any(p.startswith(full + ".") for p in stacked)
                if isinstance(child, nn.Conv2d):
                    setattr(parent, child_name, ClientConv2d(child, n_clients, own))
                elif isinstance(child, nn.Linear):
                    setattr(parent, child_name, ClientLinear(child, n_clients, own))
                elif isinstance(child, nn.BatchNorm2d):
                    setattr(parent, child_name, ClientBatchNorm2d(child, n_clients, own))
        self.module = _WithFeatures(net)
        names = dict(net.named_parameters())
        for name, p in names.items():
            p.requires_grad_(name in self.trainable)
            if name in stacked and p.shape[0] != n_clients:
                raise ValueError(f"parameter {name} could not be stacked per client")
        self._params = names
        self._stacked = {f"{m_name}.{p_name}" for m_name, m in net.named_modules()
                         if isinstance(m, (ClientConv2d, ClientLinear, ClientBatchNorm2d)) and m.per_client
                         for p_name, _ in m.named_parameters(recurse=False)}
        self._bns = {n: m for n, m in net.named_modules() if isinstance(m, ClientBatchNorm2d)}
        for n, m in self._bns.items():
            m.layer = n
        self.optimizer_spec = optimizer
        # the stacked clients' tensors are large (all of ResNet-8 x N): Adam's fused one-pass update (the loop bank,
        # the specification, keeps torch's reference loop)
        self.optimizer = optimizer.build([names[n] for n in self.trainable], fused=True) \
            if optimizer and self.trainable else None

    def set_per_client_conv(self, kernel: Optional[str]) -> None:
        """How per-client convolution weights run: 'grouped' (one grouped convolution), 'split' (one convolution
        per client), 'unfold' (im2col + batched matmul) or None (per layer, ``client_conv.auto_kernel``); results
        agree to float rounding (tests/test_oracle_client_conv.py)."""
        if kernel is not None:
            check_choice("per-client convolution", kernel, PER_CLIENT_CONV)
        for m in self.module.modules():
            if isinstance(m, ClientConv2d):
                m.kernel = kernel

    def _set_mode(self, bn_mode: str) -> None:
        _check_mode(bn_mode)
        for m in self._bns.values():
            m.mode = bn_mode

    def forward(self, x: torch.Tensor, bn_mode: str, params: Optional[Dict[str, torch.Tensor]] = None) -> ForwardOutput:
        self._set_mode(bn_mode)
        n, b = x.shape[:2]
        flat = x.reshape(n * b, *x.shape[2:])
        if params:
            logits, feats = functional_call(self.module, {f"net.{k}": v for k, v in params.items()}, (flat,))
        else:
            logits, feats = self.module(flat)
        return ForwardOutput(logits.view(n, b, -1), feats.view(n, b, -1))

    def forward_shared(self, z: torch.Tensor, bn_mode: str) -> ForwardOutput:
        """Every client on the same inputs ``z`` [M,C,H,W], the layers before the first client-dependent one (a
        BatchNorm, a per-client weight) run once on the M inputs instead of N times (``layers.shared_input``)."""
        self._set_mode(bn_mode)
        layers = [m for m in self.module.modules() if isinstance(m, (ClientConv2d, ClientLinear, ClientBatchNorm2d))]
        for m in layers:
            m.shared_rows = z.shape[0]
        try:
            logits, feats = self.module(z)
        except RuntimeError:  # shared and per-client activations met (e.g. a residual add): the reference pass
            logits = feats = None
        finally:
            for m in layers:
                m.shared_rows = None
        if logits is None:
            return super().forward_shared(z, bn_mode)
        n, b = self.n_clients, z.shape[0]
        if n > 1 and logits.shape[0] == b:  # no client-dependent layer at all: the same outputs for every client
            logits, feats = expand_clients(logits, n), expand_clients(feats, n)
        return ForwardOutput(logits.view(n, b, -1), feats.view(n, b, -1))

    def adapt(self, x: torch.Tensor, loss_fn: LossFn, bn_mode: str = "batch") -> ForwardOutput:
        if self.optimizer is None:
            raise RuntimeError("adapt() needs trainable parameters and an optimizer")
        with torch.enable_grad():
            out = self.forward(x, bn_mode)
            live = {n: self._params[n] for n in self.trainable}
            loss = loss_fn(out, live, x, slice(None))
            self.optimizer.zero_grad(set_to_none=True)
            loss.sum().backward()
            self.optimizer.step()
        return ForwardOutput(out.logits.detach(), out.features.detach())

    def bn_stats(self) -> Dict[str, torch.Tensor]:
        return {n: m.last for n, m in self._bns.items()}

    def set_bn_stats(self, stats: Dict[str, torch.Tensor]) -> None:
        for n, m in self._bns.items():
            m.given = stats[n]

    def set_normaliser(self, normaliser: Optional[Normaliser]) -> None:
        for m in self._bns.values():
            m.normaliser = normaliser

    def get_params(self, names: Optional[Sequence[str]] = None) -> Dict[str, torch.Tensor]:
        out = {}
        for n in self.trainable if names is None else names:
            p = self._params[n].detach()
            out[n] = p.clone() if n in self._stacked else p.unsqueeze(0).expand(self.n_clients, *p.shape).clone()
        return out

    def set_params(self, values: Dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, v in values.items():
                if n not in self._stacked:
                    raise ValueError(f"parameter {n} is shared by all clients in this bank; list it as trainable "
                                     "or per_client to give clients their own values")
                self._params[n].copy_(v)

    def reset_optimizer(self) -> None:
        if self.optimizer is not None:
            self.optimizer.state.clear()

    def state_dict(self) -> dict:
        """Parameters, buffers and optimiser state (for resuming a run)."""
        return {"module": self.module.state_dict(),
                "optimizer": None if self.optimizer is None else self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""
        self.module.load_state_dict(state["module"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])


class LoopBank(ClientBank):
    """N deep copies of the model (BN swapped for ``StatBatchNorm2d``), each with its own torch optimiser."""

    def __init__(self, model: nn.Module, n_clients: int, trainable: Sequence[str] = (),
                 optimizer: Optional[OptimizerSpec] = None, per_client: Sequence[str] = ()) -> None:
        check_model(model)
        self.n_clients = n_clients
        self.trainable = list(trainable)
        self.models: List[_WithFeatures] = []
        self.optimizers: List[torch.optim.Optimizer] = []
        for _ in range(n_clients):
            net = copy.deepcopy(model)
            for parent in list(net.modules()):
                for child_name, child in list(parent.named_children()):
                    if isinstance(child, nn.BatchNorm2d) and not isinstance(child, StatBatchNorm2d):
                        setattr(parent, child_name, StatBatchNorm2d(child))
            for name, m in net.named_modules():
                if isinstance(m, StatBatchNorm2d):
                    m.layer, m.client = name, len(self.models)
            params = dict(net.named_parameters())
            for name, p in params.items():
                p.requires_grad_(name in self.trainable)
            self.models.append(_WithFeatures(net))
            if optimizer and self.trainable:
                self.optimizers.append(optimizer.build([params[n] for n in self.trainable]))
        self.optimizer_spec = optimizer
        self._bn_names = bn_layer_names(model)

    def _bns(self, i: int) -> Dict[str, StatBatchNorm2d]:
        return {n: m for n, m in self.models[i].net.named_modules() if isinstance(m, StatBatchNorm2d)}

    def _forward_one(self, i: int, x: torch.Tensor, bn_mode: str,
                     params: Optional[Dict[str, torch.Tensor]] = None):
        _check_mode(bn_mode)
        for m in self._bns(i).values():
            m.mode = bn_mode
        if params:
            return functional_call(self.models[i], {f"net.{k}": v[i] for k, v in params.items()}, (x,))
        return self.models[i](x)

    def forward(self, x: torch.Tensor, bn_mode: str, params: Optional[Dict[str, torch.Tensor]] = None) -> ForwardOutput:
        outs = [self._forward_one(i, x[i], bn_mode, params) for i in range(self.n_clients)]
        return ForwardOutput(torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs]))

    def adapt(self, x: torch.Tensor, loss_fn: LossFn, bn_mode: str = "batch") -> ForwardOutput:
        if not self.optimizers:
            raise RuntimeError("adapt() needs trainable parameters and an optimizer")
        logits, feats = [], []
        with torch.enable_grad():
            for i in range(self.n_clients):
                lg, ft = self._forward_one(i, x[i], bn_mode)
                params = dict(self.models[i].net.named_parameters())
                live = {n: params[n].unsqueeze(0) for n in self.trainable}
                loss = loss_fn(ForwardOutput(lg[None], ft[None]), live, x[i:i + 1], slice(i, i + 1))
                self.optimizers[i].zero_grad(set_to_none=True)
                loss.sum().backward()
                self.optimizers[i].step()
                logits.append(lg.detach())
                feats.append(ft.detach())
        return ForwardOutput(torch.stack(logits), torch.stack(feats))

    def bn_stats(self) -> Dict[str, torch.Tensor]:
        per_client = [self._bns(i) for i in range(self.n_clients)]
        return {n: torch.stack([bns[n].last for bns in per_client]) for n in self._bn_names}

    def set_bn_stats(self, stats: Dict[str, torch.Tensor]) -> None:
        for i in range(self.n_clients):
            for n, m in self._bns(i).items():
                m.given = stats[n][i]

    def set_normaliser(self, normaliser: Optional[Normaliser]) -> None:
        for i in range(self.n_clients):
            for m in self._bns(i).values():
                m.normaliser = normaliser

    def get_params(self, names: Optional[Sequence[str]] = None) -> Dict[str, torch.Tensor]:
        names = self.trainable if names is None else names
        per_client = [dict(m.net.named_parameters()) for m in self.models]
        return {n: torch.stack([p[n].detach().clone() for p in per_client]) for n in names}

    def set_params(self, values: Dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for i, m in enumerate(self.models):
                params = dict(m.net.named_parameters())
                for n, v in values.items():
                    params[n].copy_(v[i])

    def reset_optimizer(self) -> None:
        for opt in self.optimizers:
            opt.state.clear()

    def state_dict(self) -> dict:
        """Parameters, buffers and optimiser states of every client (for resuming a run)."""
        return {"modules": [m.state_dict() for m in self.models], "optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""
        for m, s in zip(self.models, state["modules"]):
            m.load_state_dict(s)
        for o, s in zip(self.optimizers, state["optimizers"]):
            o.load_state_dict(s)


BACKENDS = {"loop": LoopBank, "vectorized": VectorizedBank}


def make_bank(backend: str, model: nn.Module, n_clients: int, trainable: Sequence[str] = (),
              optimizer: Optional[OptimizerSpec] = None) -> ClientBank:
    """Build the client bank of ``backend`` ('loop' or 'vectorized')."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {backend!r}")
    return BACKENDS[backend](model, n_clients, trainable, optimizer)
