"""Which stream items to label: VeSSAL-style volume sampling (eq. 6) and uniform random selection (same budget).

Where we differ from FedAcross+'s eq. 6 and from the authors' VeSSAL code (cairo-thws/fed_streaming, ``vessal.py``;
also listed in ``notebooks/50_fedacross.ipynb``):

- The embedding u is whatever the caller passes; by default ``study.support_indices`` passes tau = A(f(x)) of the
  server model (A in eval mode) on the untransformed stream image, where eq. 6 embeds the transformed T(x_t);
  ``support_indices(..., view="augmented")`` embeds tau(T(x_t)) as eq. 6 does (one draw of T per item).
- The budget is k * L labels in all; ``vessal_select_per_class`` (an option) fills k per class instead: a class
  that already has k labels takes no more (the sampler's draw is skipped), and classes still short when the stream
  ends are filled at random from their unselected items (fed_streaming's ``fill_random``, per class).
- q_t is the ideal rate (budget - selected) / (n - t), and S^-1 starts at ``init_scale`` * I (100, fed_streaming's
  ``cov_inv_scaling``) with a Sherman-Morrison update per selected item (fed_streaming's Woodbury update, which is
  the same for rank-1 embeddings); tr(C S^-1) is kept up to date incrementally (the same quantity up to rounding).
- p is capped at 1 (fed_streaming compares a uniform draw with the uncapped value: the same decision).
- Nothing is selected once the budget is spent (fed_streaming keeps its first n picks: the same set); a stream that
  ends before the budget is spent leaves fewer labels (no random fill-up; fed_streaming has it as ``fill_random``).
- float64 throughout and every draw from the given ``numpy.random.Generator`` (fed_streaming: float32 on the GPU
  and the global ``np.random``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch


def sherman_morrison(inv: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(S + u u^T)^-1 from S^-1 by the rank-1 Sherman-Morrison update."""
    v = inv @ u
    return inv - torch.outer(v, v) / (1.0 + u @ v)


@dataclass
class VolumeSampler:
    """Streaming volume sampling (VeSSAL, Saran et al. 2023, as in FedAcross+'s eq. 6).

    For item i of n (0-based) with embedding u: the running covariance C <- (i C + u u^T) / (i + 1) over every item
    seen; the ideal rate is (budget - selected) / (n - i); zeta = rate / tr(C S^-1); the item is labelled with
    probability p = min(1, |zeta| |u^T S^-1 u|), where S = I / init_scale + sum of u u^T over the items selected so
    far (S^-1 starts at init_scale * I and gets a Sherman-Morrison update per selection). Every draw from ``gen``.
    """

    dim: int
    budget: int
    n_items: int
    gen: np.random.Generator
    init_scale: float = 100.0
    seen: int = 0
    selected: List[int] = field(default_factory=list)
    probabilities: List[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.budget < 0 or self.n_items < 1 or self.dim < 1:
            raise ValueError(f"need budget >= 0, n_items >= 1, dim >= 1; got {self.budget}, {self.n_items}, {self.dim}")
        if not self.init_scale > 0:
            raise ValueError(f"init_scale must be positive, got {self.init_scale}")
        self.inv = self.init_scale * torch.eye(self.dim, dtype=torch.float64)
        self.cov = torch.zeros(self.dim, self.dim, dtype=torch.float64)
        self.trace = 0.0  # tr(C S^-1), kept up to date in O(D^2) per item instead of an O(D^3) product

    def probability(self, u: torch.Tensor) -> float:
        """Selection probability of the next item (also updates the running covariance with it)."""
        i = self.seen
        if i >= self.n_items:
            raise ValueError(f"the stream was declared with n_items={self.n_items} items")
        u = u.detach().double().flatten()
        q = float(u @ self.inv @ u)
        self.cov = (i * self.cov + torch.outer(u, u)) / (i + 1)
        self.trace = (i * self.trace + q) / (i + 1)
        rate = (self.budget - len(self.selected)) / (self.n_items - i)
        zeta = rate / self.trace if self.trace > 0 else 0.0
        return min(1.0, abs(zeta) * abs(q))

    def observe(self, u: torch.Tensor, allowed: bool = True) -> bool:
        """Decide on the next stream item with embedding ``u``; True if it is to be labelled. ``allowed=False``
        (e.g. its class is full) skips the draw: the item only enters the running covariance."""
        p = self.probability(u)
        self.probabilities.append(p)
        take = allowed and len(self.selected) < self.budget and bool(self.gen.random() < p)
        if take:
            u = u.detach().double().flatten()
            v = self.inv @ u
            self.trace -= float(v @ self.cov @ v) / (1.0 + float(u @ v))
            self.selected.append(self.seen)
            self.inv = sherman_morrison(self.inv, u)
        self.seen += 1
        return take


def vessal_select(embeddings: torch.Tensor, budget: int, gen: np.random.Generator,
                  init_scale: float = 100.0) -> np.ndarray:
    """Indices of the stream items (rows of ``embeddings``, in stream order) VeSSAL picks for labelling."""
    sampler = VolumeSampler(embeddings.shape[1], budget, embeddings.shape[0], gen, init_scale)
    for u in embeddings:
        sampler.observe(u)
    return np.asarray(sampler.selected, dtype=np.int64)


def vessal_select_per_class(embeddings: torch.Tensor, labels: np.ndarray, k: int, num_classes: int,
                            gen: np.random.Generator, init_scale: float = 100.0) -> np.ndarray:
    """VeSSAL with a k-per-class quota (budget k * L): an item of a class that has k labels is not drawn for;
    classes short at the end of the stream are filled at random from their unselected items (as far as the pool
    allows). Sorted stream positions."""
    if k < 0:
        raise ValueError(f"k must be non-negative, got {k}")
    labels = np.asarray(labels)
    sampler = VolumeSampler(embeddings.shape[1], k * num_classes, embeddings.shape[0], gen, init_scale)
    counts = np.zeros(num_classes, np.int64)
    for u, y in zip(embeddings, labels):
        if sampler.observe(u, allowed=counts[y] < k):
            counts[y] += 1
    picked = np.asarray(sampler.selected, dtype=np.int64)
    fills = [gen.choice(np.setdiff1d(np.flatnonzero(labels == c), picked), min(k - counts[c],
                        int((labels == c).sum()) - counts[c]), replace=False) for c in range(num_classes)
             if counts[c] < k]
    return np.sort(np.concatenate([picked, *fills])).astype(np.int64)


def random_select(n_items: int, budget: int, gen: np.random.Generator) -> np.ndarray:
    """``budget`` stream positions drawn uniformly without replacement (sorted: stream order)."""
    if not 0 <= budget <= n_items:
        raise ValueError(f"budget must be in [0, n_items={n_items}], got {budget}")
    return np.sort(gen.choice(n_items, size=budget, replace=False)).astype(np.int64)


def balanced_select(labels: np.ndarray, k: int, num_classes: int, gen: np.random.Generator) -> np.ndarray:
    """The paper's static k-shot support set: k items of every class drawn at random (needs the labels)."""
    if k < 0:
        raise ValueError(f"k must be non-negative, got {k}")
    picks = []
    for c in range(num_classes):
        pool = np.flatnonzero(labels == c)
        if len(pool) < k:
            raise ValueError(f"class {c} has {len(pool)} items, fewer than k={k}")
        picks.append(gen.choice(pool, size=k, replace=False))
    return np.sort(np.concatenate(picks)).astype(np.int64) if picks else np.zeros(0, np.int64)


SELECTIONS = ("balanced", "random", "vessal")
