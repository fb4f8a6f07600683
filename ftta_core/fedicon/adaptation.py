"""Test phase: FedICON's contrastive test-time tuning of the encoder (eq. 5) and the TTA baselines on a model.

* ``contrastive_tta``: Algorithm 1's LocalTest -- epochs of NT-Xent over the client's unlabeled test set, updating
  only the encoder (the head stays fixed), then prediction with the tuned model;
* ``tent_predict`` / ``eata_predict``: ftta's Tent and EATA local methods on a one-client bank, online over the
  test batches (predictions of each batch before its update, as the methods define);
* ``t3a_predict``: T3A (Iwasawa & Matsuo, 2021), a classifier-only adjustment with per-class support sets.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from ..engine.bank import make_bank
from ..tta.basic import Tent, entropy
from ..tta.augment import augment
from ..tta.eata import EATA, fisher_information
from .losses import ntxent_loss
from .models import encoder_names
from .training import TrainConfig, local_update


@dataclass(frozen=True)
class TTAConfig:
    """Test-time settings: contrastive epochs/lr (FedICON), Tent/EATA lr (1 step a batch), T3A support size."""

    epochs: int = 1
    batch_size: int = 32
    lr: float = 1e-3
    tau: float = 0.1
    entropy_lr: float = 1e-3
    eata_fisher_alpha: float = 2000.0
    eata_fisher_samples: int = 2000
    eata_e_margin: float = 0.4
    eata_d_margin: float = 0.05
    t3a_filter_k: int = 50

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "t3a_filter_k", "eata_fisher_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "tau", "entropy_lr", "eata_e_margin", "eata_d_margin"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Argmax predictions of ``model`` in eval mode."""
    model.eval()
    return torch.cat([model(x[s:s + batch_size]).argmax(1) for s in range(0, len(x), batch_size)])


def contrastive_tta(model: nn.Module, x_test: torch.Tensor, train_cfg: TrainConfig, cfg: TTAConfig,
                    gen: torch.Generator) -> nn.Module:
    """A copy of ``model`` whose encoder is tuned with eq. 5 (NT-Xent on two views) over ``x_test``."""
    tuned = copy.deepcopy(model)
    tta_cfg = TrainConfig(batch_size=cfg.batch_size, lr=cfg.lr, momentum=train_cfg.momentum, weight_decay=0.0,
                          tau=cfg.tau, flip=train_cfg.flip)
    spec = tta_cfg.views

    def loss(m: nn.Module, x: torch.Tensor, _: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        views = augment(torch.stack([x, x]), g, spec, share="image")
        z = m.forward_features(views.flatten(0, 1))
        return ntxent_loss(z[: len(x)], z[len(x):], cfg.tau)

    dummy = torch.zeros(len(x_test), dtype=torch.long)
    return local_update(tuned, x_test, dummy, cfg.epochs, tta_cfg, gen, loss, trainable=encoder_names(tuned))


def online_batches(n: int, batch_size: int) -> List[slice]:
    """Consecutive test batches of ``batch_size`` over ``n`` images; a last batch of a single image joins the one
    before it (BatchNorm in training mode needs two values per channel, e.g. ResNet-18's 1x1 maps at 32 px)."""
    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return [slice(s, e) for s, e in zip(starts, starts[1:] + [n])]


def _online(method, model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Run a ftta local method on a one-client bank over the batches of ``x``; predictions per batch."""
    bank = make_bank("loop", model, 1, method.trainable(model), method.optimizer())
    preds = [method.adapt(bank, x[b][None]).logits[0].argmax(1) for b in online_batches(len(x), batch_size)]
    return torch.cat(preds)


def tent_predict(model: nn.Module, x: torch.Tensor, cfg: TTAConfig) -> torch.Tensor:
    """Tent (all parameters: the two-layer CNN has no BatchNorm) with one SGD step per test batch."""
    return _online(Tent(params="all", optimizer="sgd", lr=cfg.entropy_lr, momentum=0.9), model, x, cfg.batch_size)


class EATAOnImages(EATA):
    """EATA whose Fisher comes from the client's own training images (no committed source model is involved)."""

    def __init__(self, fisher_images: torch.Tensor, fisher_alpha: float, **kwargs) -> None:
        super().__init__(fisher_alpha=0.0, **kwargs)
        self.fisher_alpha, self.fisher_images = fisher_alpha, fisher_images

    def initialize(self, bank, x: torch.Tensor) -> None:
        if self.fisher_alpha > 0:
            self.fisher = fisher_information(bank, self.fisher_images.to(x.device, x.dtype), self.fisher_batch)


def eata_predict(model: nn.Module, x: torch.Tensor, x_train: torch.Tensor, cfg: TTAConfig, seed: int) -> torch.Tensor:
    """EATA (paper A.3: Fisher alpha 2000 on 2000 samples, d_margin 0.05, E0 = 0.4 ln C) on all parameters."""
    method = EATAOnImages(x_train[: cfg.eata_fisher_samples], cfg.eata_fisher_alpha, params="all", optimizer="sgd",
                          lr=cfg.entropy_lr, momentum=0.9, e_margin=cfg.eata_e_margin, d_margin=cfg.eata_d_margin,
                          seed=seed)
    return _online(method, model, x, cfg.batch_size)


@torch.no_grad()
def t3a_predict(model: nn.Module, x: torch.Tensor, cfg: TTAConfig) -> torch.Tensor:
    """T3A: supports start as the head's normalised weight rows; each batch's normalised features join the support
    of their predicted class, every class keeps its ``t3a_filter_k`` lowest-entropy supports, and the batch is
    classified by its features' dot products with the normalised per-class support means."""
    model.eval()
    w = model.fc.weight.detach()
    supports = F.normalize(w, dim=1)
    labels = torch.arange(w.shape[0])
    ents = entropy(model.fc(supports * w.norm(dim=1, keepdim=True)))  # the initial supports' own entropies
    preds = []
    for s in range(0, len(x), cfg.batch_size):
        z = model.forward_features(x[s:s + cfg.batch_size])
        logits = model.fc(z)
        supports = torch.cat([supports, F.normalize(z, dim=1)])
        labels = torch.cat([labels, logits.argmax(1)])
        ents = torch.cat([ents, entropy(logits)])
        keep = torch.zeros(len(labels), dtype=torch.bool)
        for c in range(w.shape[0]):
            idx = torch.nonzero(labels == c).flatten()
            keep[idx[torch.argsort(ents[idx], stable=True)[: cfg.t3a_filter_k]]] = True
        supports, labels, ents = supports[keep], labels[keep], ents[keep]
        onehot = F.one_hot(labels, w.shape[0]).to(supports.dtype)
        prototypes = F.normalize(onehot.T @ supports, dim=1)
        preds.append((z @ prototypes.T).argmax(1))
    return torch.cat(preds)


def accuracy(preds: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy in percent."""
    return 100.0 * float((preds == y).float().mean())


__all__ = ["TTAConfig", "predict", "contrastive_tta", "tent_predict", "eata_predict", "t3a_predict", "accuracy"]
