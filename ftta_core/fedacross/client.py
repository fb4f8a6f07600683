"""Client adaptation: freeze f and g, train only A on the k-shot support set (eq. 3), then prototypes (eq. 4)."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..engine.average import average_models
from ..rng import torch_generator
from .model import FedAcrossNet, adapter_state, load_adapter
from .prototypes import Prototypes, class_prototypes, nearest_prototype

AdapterState = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class ClientSpec:
    """Client optimiser (paper: as the server's, lr 0.1, batch 32, 200 epochs; SGD Nesterov momentum 0.9, wd 1e-3).

    ``max_steps`` caps the number of optimiser steps (the new-client experiment uses a few steps only). Clients
    train on cached backbone features f(x) of the (unaugmented) support images: f is frozen, so this is exact
    for eq. (3) without the transformation T; augmenting on the client would need a backbone pass per epoch.
    """

    lr: float = 0.1
    batch_size: int = 32
    epochs: int = 200
    momentum: float = 0.9
    weight_decay: float = 1e-3
    max_steps: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("lr", "batch_size", "epochs"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 0:
            raise ValueError(f"max_steps must be non-negative or None, got {self.max_steps}")


@torch.no_grad()
def backbone_features(model: FedAcrossNet, x: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
    """f(x) [n, 512] in eval mode, in chunks."""
    model.eval()
    return torch.cat([model.features(x[s:s + batch_size]) for s in range(0, len(x), batch_size)]) if len(x) else \
        torch.zeros(0, 512)


@torch.no_grad()
def embed_features(model: FedAcrossNet, feats: torch.Tensor) -> torch.Tensor:
    """tau = A(f) [n, D] for cached backbone features (A in eval mode: its running BN statistics)."""
    model.adapter.eval()
    return model.adapter(feats)


def freeze_for_client(model: FedAcrossNet) -> None:
    """Freeze f and g; only A's parameters require gradients."""
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("adapter."))


def adapt_client(model: FedAcrossNet, feats: torch.Tensor, labels: torch.Tensor, spec: ClientSpec,
                 seed: int = 0, *keys: object) -> FedAcrossNet:
    """A copy of ``model`` whose A is trained by CE(g(A(f(x))), y) on the support features (eq. 3); f, g frozen."""
    client = copy.deepcopy(model)
    freeze_for_client(client)
    params = [p for p in client.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, nesterov=spec.momentum > 0,
                          weight_decay=spec.weight_decay)
    gen = torch_generator(seed, "fedacross", "client", *[str(k) for k in keys])
    n, steps = len(labels), 0
    client.adapter.train()
    client.classifier.eval()
    for _ in range(spec.epochs if n >= 2 else 0):
        perm = torch.randperm(n, generator=gen)
        for s in range(0, n, spec.batch_size):
            idx = perm[s:s + spec.batch_size]
            if len(idx) < 2:  # BatchNorm1d cannot normalise a single sample
                continue
            if spec.max_steps is not None and steps >= spec.max_steps:
                return client.eval()
            loss = F.cross_entropy(client.classifier(client.adapter(feats[idx])), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
    return client.eval()


@dataclass
class ClientResult:
    """An adapted client: its A (parameters + BN buffers), prototypes and support size."""

    adapter: AdapterState
    prototypes: Prototypes
    n_support: int

    def upload_bytes(self) -> int:
        """Bytes upstreamed: A's tensors plus the prototypes of the classes present."""
        return sum(v.numel() * v.element_size() for v in self.adapter.values()) + self.prototypes.num_bytes


def run_client(model: FedAcrossNet, feats: torch.Tensor, labels: torch.Tensor, spec: ClientSpec,
               start: Optional[AdapterState] = None, seed: int = 0, *keys: object) -> ClientResult:
    """Initialise A (server's, or ``start`` e.g. the merged A), adapt it, build the prototypes (eq. 4)."""
    base = copy.deepcopy(model)
    if start is not None:
        load_adapter(base, start)
    client = adapt_client(base, feats, labels, spec, seed, *keys)
    protos = class_prototypes(embed_features(client, feats), labels, model.spec.num_classes)
    return ClientResult(adapter_state(client), protos, len(labels))


def predict(model: FedAcrossNet, result: Optional[ClientResult], feats: torch.Tensor) -> torch.Tensor:
    """Labels by nearest prototype (eq. 5) with the client's A; with no support (k = 0), g(A(f(x))) of ``model``."""
    if result is None or result.n_support == 0:
        with torch.no_grad():
            return model.classifier(embed_features(model, feats)).argmax(1)
    client = copy.deepcopy(model)
    load_adapter(client, result.adapter)
    return nearest_prototype(embed_features(client, feats), result.prototypes)


def accuracy(pred: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy (%)."""
    return 100.0 * float((pred == labels).double().mean()) if len(labels) else float("nan")


def merge_adapters(states: Sequence[AdapterState], weights: Optional[Sequence[float]] = None) -> AdapterState:
    """FedAvg of A over clients (weights: support sizes; uniform if None) by the engine's mixing kernel
    (``engine.average.average_models``: integer buffers are counters and take the largest count)."""
    if not states:
        raise ValueError("merge_adapters needs at least one client state")
    w = np.ones(len(states)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (len(states),) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be {len(states)} non-negative numbers with a positive sum, got {weights}")
    return average_models(states, torch.as_tensor(w / w.sum(), dtype=torch.float64))
