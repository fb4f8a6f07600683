"""FedICON's client datasets on the data available here (paper App. A.2 test-time shifts, substitutes named).

* covariate shift: each client owns one digit domain (clients split a domain when there are more clients than
  domains, total training size constant, as Fig. 3); its test split is corrupted, one corruption per image drawn
  from ``corruptions`` at ``severity`` (the paper: severity 5);
* domain shift: leave-one-domain-out; each client owns one training domain and tests on a disjoint share of the
  held-out domain (digits or Office-Caltech-10);
* attribute shift: CIFAR-10 with Dirichlet label skew over 20 clients; a client's test set follows its training
  label distribution and is shifted by mild corruptions (substitute for CIFAR-10.1, which is not available here).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch

from ..corruptions import CORRUPTIONS, corrupt
from ..data import load_dataset
from ..rng import derive_seed, numpy_generator
from ..scenarios import dirichlet_client_pools

DIGIT_CLIENT_DOMAINS = ("mnist", "usps", "mnistm", "sklearn_digits")
OFFICE_CLIENT_DOMAINS = ("amazon", "caltech10", "dslr", "webcam")


@dataclass
class ClientData:
    """One client's labelled training set and its (shifted) test set, float [n, C, H, W] in [0, 1]."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_test_clean: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return int(self.y_train.shape[0])


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def corrupt_mixed(x: torch.Tensor, corruptions: Sequence[str], severity: int, seed: int, *keys: object) -> torch.Tensor:
    """Each image corrupted by one corruption drawn from ``corruptions`` (per-image seeds from (seed, keys, i))."""
    unknown = [c for c in corruptions if c not in CORRUPTIONS]
    if unknown or not corruptions:
        raise ValueError(f"corruptions must be a non-empty subset of {CORRUPTIONS}, got {list(corruptions)}")
    choice = numpy_generator(seed, "fedicon-corruption-choice", *keys).integers(0, len(corruptions), len(x))
    seeds = [derive_seed(seed, "fedicon-corruption", *keys, i) for i in range(len(x))]
    out = x.clone()
    for k, name in enumerate(corruptions):
        idx = np.flatnonzero(choice == k)
        if len(idx):
            out[idx] = corrupt(x[idx], name, severity, [seeds[i] for i in idx])
    return out


def _draw(n_total: int, n: int, seed: int, *keys: object) -> np.ndarray:
    """``n`` indices of ``range(n_total)`` without replacement (all of them, shuffled, when ``n >= n_total``)."""
    return numpy_generator(seed, "fedicon-draw", *keys).permutation(n_total)[:n]


def digit_covariate_clients(n_train: int, n_test: int, seed: int, clients_per_domain: int = 1,
                            domains: Sequence[str] = DIGIT_CLIENT_DOMAINS, corruptions: Sequence[str] = CORRUPTIONS,
                            severity: int = 5) -> List[ClientData]:
    """Covariate shift on the digit domains: ``n_train``/``n_test`` images per domain, split over
    ``clients_per_domain`` clients; test images corrupted."""
    _check_positive(n_train=n_train, n_test=n_test, clients_per_domain=clients_per_domain)
    clients = []
    for domain in domains:
        train, test = load_dataset(f"digits/{domain}", "train", size=32), load_dataset(f"digits/{domain}", "test", size=32)
        tr_idx = np.array_split(_draw(len(train), n_train, seed, domain, "train"), clients_per_domain)
        te_idx = np.array_split(_draw(len(test), n_test, seed, domain, "test"), clients_per_domain)
        for k in range(clients_per_domain):
            name = domain if clients_per_domain == 1 else f"{domain}#{k}"
            clients.append(_covariate_client(name, train, tr_idx[k], test, te_idx[k], corruptions, severity, seed))
    return clients


def _covariate_client(name: str, train, tr_idx: np.ndarray, test, te_idx: np.ndarray, corruptions: Sequence[str],
                      severity: int, seed: int) -> ClientData:
    """One covariate-shift client: its training images, and its test images corrupted (the clean ones kept)."""
    x_tr, y_tr = train.tensors(tr_idx)
    x_te, y_te = test.tensors(te_idx)
    return ClientData(name, x_tr, y_tr, corrupt_mixed(x_te, corruptions, severity, seed, name), y_te, x_te)


def office_covariate_clients(size: int, seed: int, test_fraction: float = 0.2,
                             corruptions: Sequence[str] = CORRUPTIONS, severity: int = 5) -> List[ClientData]:
    """Covariate shift on Office-Caltech-10 at ``size`` px (the paper's Table 5 shape: 4 clients, one domain each).
    Office-Caltech-10 has no train/test split: each domain is split once, from ``seed``, into a training part and a
    ``test_fraction`` test part (disjoint); the test images are corrupted, one corruption per image."""
    _check_positive(size=size)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    clients = []
    for domain in OFFICE_CLIENT_DOMAINS:
        data = load_dataset(f"office_caltech10/{domain}", "all", size=size)
        order = _draw(len(data), len(data), seed, "office-covariate", domain)
        n_test = max(1, int(round(test_fraction * len(data))))
        clients.append(_covariate_client(domain, data, order[n_test:], data, order[:n_test], corruptions, severity,
                                         seed))
    return clients


def _lodo(train_sets: dict, test_set, n_train: int, n_test: int, seed: int, tag: str) -> List[ClientData]:
    """Leave-one-domain-out clients: one per training domain, each testing on a disjoint share of ``test_set``."""
    names = list(train_sets)
    shares = np.array_split(_draw(len(test_set), n_test * len(names), seed, tag, "held-out"), len(names))
    clients = []
    for name, share in zip(names, shares):
        data = train_sets[name]
        x_tr, y_tr = data.tensors(_draw(len(data), n_train, seed, tag, name))
        x_te, y_te = test_set.tensors(share)
        clients.append(ClientData(name, x_tr, y_tr, x_te, y_te))
    return clients


def digit_lodo_clients(held_out: str, n_train: int, n_test: int, seed: int,
                       domains: Sequence[str] = DIGIT_CLIENT_DOMAINS) -> List[ClientData]:
    """Domain shift on the digits: the other domains train, each client tests on ``n_test`` held-out images."""
    if held_out not in domains:
        raise ValueError(f"held_out must be one of {tuple(domains)}, got {held_out!r}")
    _check_positive(n_train=n_train, n_test=n_test)
    train = {d: load_dataset(f"digits/{d}", "train", size=32) for d in domains if d != held_out}
    return _lodo(train, load_dataset(f"digits/{held_out}", "test", size=32), n_train, n_test, seed, f"digits-{held_out}")


def office_lodo_clients(held_out: str, size: int, seed: int, n_train: int = 10_000,
                        n_test: int = 10_000) -> List[ClientData]:
    """Domain shift on Office-Caltech-10 at ``size`` px: three domains train (all their images by default), the
    held-out domain is split evenly over the three clients as their test sets."""
    if held_out not in OFFICE_CLIENT_DOMAINS:
        raise ValueError(f"held_out must be one of {OFFICE_CLIENT_DOMAINS}, got {held_out!r}")
    _check_positive(size=size, n_train=n_train, n_test=n_test)
    train = {d: load_dataset(f"office_caltech10/{d}", "all", size=size) for d in OFFICE_CLIENT_DOMAINS if d != held_out}
    test = load_dataset(f"office_caltech10/{held_out}", "all", size=size)
    return _lodo(train, test, n_train, min(n_test, len(test) // len(train)), seed, f"office-{held_out}")


def cifar_label_skew_clients(alpha: float, n_clients: int, n_train: int, n_test: int, seed: int,
                             corruptions: Sequence[str] = CORRUPTIONS, severity: int = 1) -> List[ClientData]:
    """CIFAR-10 label skew: training pools ~ Dirichlet(alpha) (``dirichlet_client_pools``); each client's test
    pool has its training label histogram (scaled to ``n_test``) and is shifted by mild corruptions."""
    _check_positive(n_clients=n_clients, n_train=n_train, n_test=n_test)
    train, test = load_dataset("cifar10", "train"), load_dataset("cifar10", "test")
    pools = dirichlet_client_pools(train.labels, n_clients, n_train, alpha, seed)
    by_class = [numpy_generator(seed, "fedicon-cifar-test", c).permutation(np.flatnonzero(test.labels == c))
                for c in range(10)]
    cursor = np.zeros(10, dtype=np.int64)
    clients = []
    for i, pool in enumerate(pools):
        hist = np.bincount(train.labels[pool], minlength=10)
        quota = np.floor(hist * n_test / hist.sum()).astype(np.int64)
        quota[np.argsort(-(hist * n_test / hist.sum() - quota), kind="stable")[: n_test - quota.sum()]] += 1
        te = np.concatenate([by_class[c][(cursor[c] + np.arange(q)) % len(by_class[c])] for c, q in enumerate(quota)])
        cursor += quota
        x_tr, y_tr = train.tensors(pool)
        x_te, y_te = test.tensors(te)
        name = f"client{i}"
        clients.append(ClientData(name, x_tr, y_tr, corrupt_mixed(x_te, corruptions, severity, seed, "cifar", name),
                                  y_te, x_te))
    return clients
