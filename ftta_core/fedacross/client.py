"""Client adaptation: freeze f and g, train only A on the k-shot support set (eq. 3), then prototypes (eq. 4).

Options (defaults keep the cached-feature path): Algorithm 1's per-batch augmentation through the frozen backbone
(``ClientSpec.augment_through_backbone``) and early stopping (``EarlyStop``)."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..engine.average import average_models
from ..rng import numpy_generator, torch_generator
from .augment import AugmentSpec, transform
from .model import FedAcrossNet, adapter_state, load_adapter
from .prototypes import Prototypes, class_prototypes, nearest_prototype

AdapterState = Dict[str, torch.Tensor]


EARLY_STOP_RULES = ("holdout", "loss")


@dataclass(frozen=True)
class EarlyStop:
    """Early stopping of the client's A training (an option; the paper trains a fixed 200 epochs).

    ``rule='holdout'`` (the default, and the one to use): ``val_per_class`` labelled support items of every class
    that has more than that many are held out (drawn with an explicit generator); A trains on the rest and, every
    ``check_every`` epochs, is scored by nearest-prototype accuracy on the held-out items (prototypes from the
    training part: what inference uses), ties broken by the lower cross-entropy of g(A(f)) on them. Training stops
    after ``patience`` checks without improvement and the best A (parameters and BN buffers) is restored. Why this
    rule: the question it serves (A2) is whether A over-fits a few labelled images; the training loss keeps falling
    while A over-fits, so only a held-out signal can see it. The price is labels: the held-out items do not train A
    (they still enter the prototypes, eq. 4). With no held-out item (k <= ``val_per_class``) it raises.

    ``rule='loss'``: stop when the mean training loss of an epoch has not fallen by more than ``min_delta`` for
    ``patience`` checks, keeping the last A (a plateau rule that needs no labels held out, but cannot see
    over-fitting: it only saves compute).
    """

    rule: str = "holdout"
    patience: int = 10
    check_every: int = 1
    val_per_class: int = 1
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        if self.rule not in EARLY_STOP_RULES:
            raise ValueError(f"rule must be one of {EARLY_STOP_RULES}, got {self.rule!r}")
        for name in ("patience", "check_every", "val_per_class"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.min_delta < 0:
            raise ValueError(f"min_delta must be non-negative, got {self.min_delta}")


@dataclass(frozen=True)
class ClientSpec:
    """Client optimiser (paper: as the server's, lr 0.1, batch 32, 200 epochs; SGD Nesterov momentum 0.9, wd 1e-3).

    ``max_steps`` caps the number of optimiser steps (the new-client experiment uses a few steps only).

    By default (``augment_through_backbone=False``) clients train A on cached backbone features f(x) of the
    unaugmented support images: f is frozen, so this is exact for eq. (3) without the transformation T, and cheap.
    ``augment_through_backbone=True`` is Algorithm 1 as written (line 10 of Part 2): every batch of support images
    is transformed by T (``augment.transform`` with ``augment``'s ranges, draws from an explicit generator) and
    passed through the frozen backbone (eval mode, no gradient) before A; it needs the support images.
    ``early_stop``: an ``EarlyStop`` rule, or None for the fixed number of epochs (the default).
    """

    lr: float = 0.1
    batch_size: int = 32
    epochs: int = 200
    momentum: float = 0.9
    weight_decay: float = 1e-3
    max_steps: Optional[int] = None
    augment_through_backbone: bool = False
    augment: AugmentSpec = AugmentSpec()
    early_stop: Optional[EarlyStop] = None

    def __post_init__(self) -> None:
        for name in ("lr", "batch_size", "epochs"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 0:
            raise ValueError(f"max_steps must be non-negative or None, got {self.max_steps}")


@dataclass
class TrainLog:
    """What a client's A training did: optimiser steps, epochs run, backbone passes, the epoch whose A was kept."""

    steps: int = 0
    epochs: int = 0
    backbone_batches: int = 0
    best_epoch: Optional[int] = None
    history: List[Dict[str, float]] = field(default_factory=list)


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


@torch.no_grad()
def augmented_features(model: FedAcrossNet, images: torch.Tensor, spec: AugmentSpec, gen: torch.Generator,
                       batch_size: int = 500) -> torch.Tensor:
    """f(T(x)) [n, 512]: one draw of the transformation T per image (from ``gen``), through the frozen backbone."""
    return backbone_features(model, transform(images, spec, gen), batch_size) if len(images) else torch.zeros(0, 512)


def freeze_for_client(model: FedAcrossNet) -> None:
    """Freeze f and g; only A's parameters require gradients."""
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("adapter."))


def holdout_split(labels: torch.Tensor, per_class: int, seed: int, *keys: object) -> Tuple[np.ndarray, np.ndarray]:
    """(train, held-out) positions: ``per_class`` random items of every class with more than ``per_class`` items."""
    gen = numpy_generator(seed, "fedacross", "client-holdout", *[str(k) for k in keys])
    y = labels.numpy()
    held = [gen.choice(np.flatnonzero(y == c), per_class, replace=False) for c in np.unique(y)
            if (y == c).sum() > per_class]
    val = np.sort(np.concatenate(held)).astype(np.int64) if held else np.zeros(0, np.int64)
    return np.setdiff1d(np.arange(len(y)), val), val


@torch.no_grad()
def _holdout_score(client: FedAcrossNet, train_f: torch.Tensor, train_y: torch.Tensor, val_f: torch.Tensor,
                   val_y: torch.Tensor) -> Tuple[float, float]:
    """(nearest-prototype accuracy, -CE of g) on the held-out items: larger is better, compared lexicographically."""
    was = client.adapter.training
    protos = class_prototypes(embed_features(client, train_f), train_y, client.spec.num_classes)
    emb = embed_features(client, val_f)
    acc = float((nearest_prototype(emb, protos) == val_y).double().mean())
    ce = float(F.cross_entropy(client.classifier(emb), val_y))
    client.adapter.train(was)
    return acc, -ce


def train_adapter(model: FedAcrossNet, feats: torch.Tensor, labels: torch.Tensor, spec: ClientSpec, seed: int = 0,
                  *keys: object, images: Optional[torch.Tensor] = None) -> Tuple[FedAcrossNet, TrainLog]:
    """A copy of ``model`` whose A is trained by CE(g(A(f(x))), y) on the support set (eq. 3); f, g frozen.

    ``feats``: cached f(x) of the support images (the default path trains on them; prototypes and the hold-out
    score use them); ``images``: the support images [n, 3, H, W] in [0, 1], needed by
    ``spec.augment_through_backbone``. Batch order, augmentation and hold-out split have separate generators, so
    the default path draws exactly what it drew before these options existed.
    """
    if spec.augment_through_backbone and (images is None or len(images) != len(labels)):
        raise ValueError("augment_through_backbone needs the support images (one per label)")
    client, opt = client_copy(model, spec)
    gen = torch_generator(seed, "fedacross", "client", *[str(k) for k in keys])
    aug_gen = torch_generator(seed, "fedacross", "client-augment", *[str(k) for k in keys])
    stop, log = spec.early_stop, TrainLog()
    train_pos = np.arange(len(labels))
    if stop is not None and stop.rule == "holdout":
        train_pos, val_pos = holdout_split(labels, stop.val_per_class, seed, *keys)
        if len(val_pos) == 0:
            raise ValueError(f"holdout early stopping needs a class with more than {stop.val_per_class} support "
                             f"items; got class counts {torch.bincount(labels).tolist()}")
        val_f, val_y = feats[val_pos], labels[val_pos]
    train_idx = torch.as_tensor(train_pos)
    n = len(train_idx)
    best, best_state, bad = None, None, 0
    client.backbone.eval()
    client.adapter.train()
    client.classifier.eval()
    for epoch in range(spec.epochs if n >= 2 else 0):
        perm = train_idx[torch.randperm(n, generator=gen)]
        losses = []
        for s in range(0, n, spec.batch_size):
            idx = perm[s:s + spec.batch_size]
            if len(idx) < 2:  # BatchNorm1d cannot normalise a single sample
                continue
            if spec.max_steps is not None and log.steps >= spec.max_steps:
                return client.eval(), log
            if spec.augment_through_backbone:
                with torch.no_grad():
                    f = client.features(transform(images[idx], spec.augment, aug_gen))
                log.backbone_batches += 1
            else:
                f = feats[idx]
            loss = F.cross_entropy(client.classifier(client.adapter(f)), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            log.steps += 1
            losses.append(float(loss.detach()))
        log.epochs = epoch + 1
        if stop is None or (epoch + 1) % stop.check_every:
            continue
        if stop.rule == "holdout":
            score = _holdout_score(client, feats[train_idx], labels[train_idx], val_f, val_y)
            log.history.append({"epoch": epoch + 1, "val_accuracy": score[0], "val_loss": -score[1]})
            improved = best is None or score > best
        else:
            score = -float(np.mean(losses)) if losses else float("-inf")
            log.history.append({"epoch": epoch + 1, "train_loss": -score})
            improved = best is None or score > best + stop.min_delta
        if improved:
            best, bad, log.best_epoch = score, 0, epoch + 1
            if stop.rule == "holdout":
                best_state = adapter_state(client)
        else:
            bad += 1
            if bad >= stop.patience:
                break
    if best_state is not None:
        load_adapter(client, best_state)
    return client.eval(), log


def client_copy(model: "FedAcrossNet", spec: "ClientSpec") -> Tuple["FedAcrossNet", torch.optim.Optimizer]:
    """A client's copy of the server model, frozen but for the adaptation module (``freeze_for_client``), and the
    SGD optimiser of ``spec`` over what it trains."""
    client = copy.deepcopy(model)
    freeze_for_client(client)
    params = [p for p in client.parameters() if p.requires_grad]
    return client, torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, nesterov=spec.momentum > 0,
                                   weight_decay=spec.weight_decay)


def adapt_client(model: FedAcrossNet, feats: torch.Tensor, labels: torch.Tensor, spec: ClientSpec,
                 seed: int = 0, *keys: object, images: Optional[torch.Tensor] = None) -> FedAcrossNet:
    """A copy of ``model`` whose A is trained on the support set (eq. 3; ``train_adapter`` without its log)."""
    return train_adapter(model, feats, labels, spec, seed, *keys, images=images)[0]


@dataclass
class ClientResult:
    """An adapted client: its A (parameters + BN buffers), prototypes, support size and training log."""

    adapter: AdapterState
    prototypes: Prototypes
    n_support: int
    log: TrainLog = field(default_factory=TrainLog)

    def upload_bytes(self) -> int:
        """Bytes upstreamed: A's tensors plus the prototypes of the classes present."""
        return sum(v.numel() * v.element_size() for v in self.adapter.values()) + self.prototypes.num_bytes


def run_client(model: FedAcrossNet, feats: torch.Tensor, labels: torch.Tensor, spec: ClientSpec,
               start: Optional[AdapterState] = None, seed: int = 0, *keys: object,
               images: Optional[torch.Tensor] = None) -> ClientResult:
    """Initialise A (server's, or ``start`` e.g. the merged A), adapt it, build the prototypes (eq. 4) from the
    unaugmented support features (all of them, the early-stopping hold-out included). ``images``: the support
    images, for ``spec.augment_through_backbone``."""
    base = copy.deepcopy(model)
    if start is not None:
        load_adapter(base, start)
    client, log = train_adapter(base, feats, labels, spec, seed, *keys, images=images)
    protos = class_prototypes(embed_features(client, feats), labels, model.spec.num_classes)
    return ClientResult(adapter_state(client), protos, len(labels), log)


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
