"""FedICON's federated training phase (Algorithm 1) and the FL baselines it is compared with.

* representation phase: each client minimises an objective on its data for ``local_epochs`` (SupCon eq. 2-3 on
  two augmented views for FedICON, NT-Xent eq. 5 for FedICON-us, cross-entropy for the baselines), then the server
  averages the shared parameters weighted by data size (eq. 4);
* classifier phase: a linear classifier on the frozen encoder, federated for ``cls_rounds`` then personalised by
  ``cls_personal_epochs`` local epochs.

Baselines share the same loop: Local (nothing shared), FedAvg (everything), FedProx (+ mu/2 ||w - w_global||^2),
FedRep (body shared; the head trained first with the body frozen, then the body with the head frozen), FedBN
(BatchNorm layers local), FedAvg-FT (FedAvg, then one more local round); FedTHE (``fedthe``) shares everything,
trains with the balanced softmax ('bsm') and hooks its personalised head in through ``before_local``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..engine.average import average_models
from ..rng import torch_generator
from ..tta.augment import AugmentSpec, augment
from ..validation import check_choice
from .data import ClientData
from .losses import ntxent_loss, supcon_loss
from .models import bn_state_names, encoder_names, head_names, make_model

SHARE_MODES = ("all", "encoder", "none", "non_bn")
OBJECTIVES = ("ce", "supcon", "simclr", "bsm")
Objective = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]


@dataclass(frozen=True)
class TrainConfig:
    """Federated training hyperparameters (paper App. A.1/A.3: SGD lr 0.01, weight decay 5e-4, batch 32)."""

    rounds: int = 10
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    tau: float = 0.1
    mu: float = 0.01
    head_epochs: int = 1
    cls_rounds: int = 10
    cls_epochs: int = 1
    cls_personal_epochs: int = 5
    cls_lr: float = 0.05
    flip: float = 0.0

    def __post_init__(self) -> None:
        for name in ("rounds", "local_epochs", "batch_size", "head_epochs", "cls_rounds", "cls_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2 (contrastive pairs), got {self.batch_size}")
        for name in ("lr", "tau", "cls_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("momentum", "weight_decay", "mu", "cls_personal_epochs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.flip <= 1:
            raise ValueError(f"flip must be a probability, got {self.flip}")

    @property
    def views(self) -> AugmentSpec:
        """The two-view augmentation: colour jitter + random resized crop (+ flip for objects, none for digits)."""
        return AugmentSpec(brightness=(0.6, 1.4), contrast=(0.6, 1.4), saturation=(0.6, 1.4), hue=(-0.1, 0.1),
                           crop_area=(0.35, 1.0), padding_mode="border", flip=self.flip)


def aggregation_weights(sizes: Sequence[int]) -> torch.Tensor:
    """Eq. 4's weights ``|D_i^P| / N^P`` (they sum to 1; the printed extra 1/m would shrink the average m-fold)."""
    s = torch.as_tensor(list(sizes), dtype=torch.float64)
    if s.numel() == 0 or bool((s <= 0).any()):
        raise ValueError(f"sizes must be positive client data sizes, got {list(sizes)}")
    return s / s.sum()


def average_states(states: Sequence[Dict[str, torch.Tensor]], weights: torch.Tensor,
                   keys: Sequence[str]) -> Dict[str, torch.Tensor]:
    """``sum_i w_i state_i[k]`` for every key, by the engine's mixing kernel (``engine.average.average_models``:
    integer buffers such as ``num_batches_tracked`` are counters and take the largest count)."""
    return average_models(states, weights, keys)


def shared_keys(model: nn.Module, share: str) -> List[str]:
    """State-dict keys the server averages under ``share`` (all | encoder | none | non_bn)."""
    check_choice("share", share, SHARE_MODES)
    keys = list(model.state_dict())
    if share == "all":
        return keys
    if share == "encoder":
        return [k for k in keys if not k.startswith("fc.")]
    if share == "non_bn":
        local = set(bn_state_names(model))
        return [k for k in keys if k not in local]
    return []


def make_objective(name: str, cfg: TrainConfig, class_counts: Optional[torch.Tensor] = None) -> Objective:
    """The local loss: 'ce' (cross-entropy), 'supcon' (eq. 2-3 on two views), 'simclr' (eq. 5 on two views) or
    'bsm' (balanced softmax: cross-entropy of ``logits + log(class_counts + 1)``, the client's label histogram)."""
    check_choice("objective", name, OBJECTIVES)
    if name == "ce":
        return lambda model, x, y, gen: F.cross_entropy(model(x), y)
    if name == "bsm":
        if class_counts is None:
            raise ValueError("the 'bsm' objective needs the client's class_counts")
        log_prior = torch.log(class_counts.float() + 1.0)
        return lambda model, x, y, gen: F.cross_entropy(model(x) + log_prior, y)
    spec = cfg.views

    def contrastive(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        views = augment(torch.stack([x, x]), gen, spec, share="image")
        z = model.forward_features(views.flatten(0, 1))
        if name == "supcon":
            return supcon_loss(z, torch.cat([y, y]), cfg.tau)
        return ntxent_loss(z[: len(x)], z[len(x):], cfg.tau)

    return contrastive


def local_update(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, cfg: TrainConfig,
                 gen: torch.Generator, objective: Objective, trainable: Optional[Sequence[str]] = None,
                 anchor: Optional[Dict[str, torch.Tensor]] = None, lr: Optional[float] = None) -> nn.Module:
    """``epochs`` of minibatch SGD on ``objective`` over (x, y) for the ``trainable`` parameters (default all);
    ``anchor`` adds FedProx's proximal term ``mu/2 ||w - anchor||^2``."""
    named = dict(model.named_parameters())
    names = list(named) if trainable is None else list(trainable)
    flags = {n: p.requires_grad for n, p in named.items()}
    for n, p in named.items():
        p.requires_grad_(n in names)
    opt = torch.optim.SGD([named[n] for n in names], lr=lr or cfg.lr, momentum=cfg.momentum,
                          weight_decay=cfg.weight_decay)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), cfg.batch_size):
            idx = perm[start:start + cfg.batch_size]
            if len(idx) < 2:
                continue
            loss = objective(model, x[idx], y[idx], gen)
            if anchor is not None and cfg.mu > 0:
                loss = loss + cfg.mu / 2 * sum(((named[n] - anchor[n]) ** 2).sum() for n in names if n in anchor)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    for n, p in named.items():
        p.requires_grad_(flags[n])
    return model.eval()


def federated_train(clients: Sequence[ClientData], arch: str, objective: str, cfg: TrainConfig, seed: int,
                    share: str = "all", prox: bool = False, fedrep: bool = False, tag: str = "",
                    before_local: Optional[Callable[[int, int, nn.Module], None]] = None) -> List[nn.Module]:
    """Algorithm 1's training loop: ``cfg.rounds`` rounds of local updates, then averaging of ``shared_keys``
    weighted by data size (eq. 4); returns the clients' models (identical where shared). ``before_local(round,
    client, model)`` runs on each client's received model before its local update (FedTHE's personalised head)."""
    num_classes = int(max(int(c.y_train.max()) for c in clients)) + 1
    start = make_model(arch, seed, num_classes=num_classes)
    models = [copy.deepcopy(start) for _ in clients]
    weights = aggregation_weights([len(c) for c in clients])
    keys = shared_keys(start, share)
    losses = [make_objective(objective, cfg, torch.bincount(c.y_train, minlength=num_classes)) for c in clients]
    for r in range(cfg.rounds):
        anchor = {n: p.detach().clone() for n, p in models[0].named_parameters()} if prox else None
        for i, (model, data, loss) in enumerate(zip(models, clients, losses)):
            if before_local is not None:
                before_local(r, i, model)
            gen = torch_generator(seed, "fedicon-train", tag or objective, share, r, i)
            if fedrep:
                local_update(model, data.x_train, data.y_train, cfg.head_epochs, cfg, gen, loss, head_names(model))
                local_update(model, data.x_train, data.y_train, cfg.local_epochs, cfg, gen, loss, encoder_names(model))
            else:
                local_update(model, data.x_train, data.y_train, cfg.local_epochs, cfg, gen, loss, anchor=anchor)
        if keys:
            avg = average_states([m.state_dict() for m in models], weights, keys)
            for m in models:
                m.load_state_dict(avg, strict=False)
    return models


def fine_tune(models: Sequence[nn.Module], clients: Sequence[ClientData], cfg: TrainConfig, seed: int) -> List[nn.Module]:
    """FedAvg-FT: one more local round (``local_epochs`` of cross-entropy) on each client's copy."""
    loss = make_objective("ce", cfg)
    out = []
    for i, (model, data) in enumerate(zip(models, clients)):
        m = copy.deepcopy(model)
        local_update(m, data.x_train, data.y_train, cfg.local_epochs, cfg, torch_generator(seed, "fedicon-ft", i), loss)
        out.append(m)
    return out


@torch.no_grad()
def features(model: nn.Module, x: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Encoder outputs ``h(x)`` in eval mode, batched."""
    model.eval()
    return torch.cat([model.forward_features(x[s:s + batch_size]) for s in range(0, len(x), batch_size)])


def train_classifier(models: Sequence[nn.Module], clients: Sequence[ClientData], cfg: TrainConfig, seed: int,
                     federated: bool = True) -> List[nn.Module]:
    """The classifier phase: a linear head on each frozen encoder, trained federated for ``cls_rounds`` (heads
    averaged with eq. 4's weights; local only when ``federated`` is False), then ``cls_personal_epochs`` locally.
    Returns copies of ``models`` with the trained heads installed; encoders are untouched."""
    out = [copy.deepcopy(m) for m in models]
    feats = [features(m, c.x_train) for m, c in zip(out, clients)]
    weights = aggregation_weights([len(c) for c in clients])
    head_keys = head_names(out[0])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh = nn.Linear(out[0].fc.in_features, out[0].fc.out_features)
    for m in out:
        m.fc.load_state_dict(fresh.state_dict())
    loss = lambda model, f, y, gen: F.cross_entropy(model(f), y)  # noqa: E731  (model = the head)
    phases = [(r, cfg.cls_epochs, federated) for r in range(cfg.cls_rounds)]
    if cfg.cls_personal_epochs:
        phases.append((cfg.cls_rounds, cfg.cls_personal_epochs, False))
    for r, epochs, average in phases:
        for i, (m, f, c) in enumerate(zip(out, feats, clients)):
            local_update(m.fc, f, c.y_train, epochs, cfg, torch_generator(seed, "fedicon-cls", r, i), loss,
                         lr=cfg.cls_lr)
        if average:
            avg = average_states([m.state_dict() for m in out], weights, head_keys)
            for m in out:
                m.load_state_dict(avg, strict=False)
    return [m.eval() for m in out]
