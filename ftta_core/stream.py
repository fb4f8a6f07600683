"""Unlabeled test streams: per-step batches ``[N, B, C, H, W]`` for all clients, built from a scenario."""
from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, Optional, Sequence

import numpy as np
import torch

from .data.base import ImageArray
from .data.cache import load_checked, save_checked
from .progress import progress_line, progress_task
from .rng import derive_seed
from .scenarios import Scenario

CLEAN = "clean"


@dataclass(frozen=True)
class StreamBatch:
    """One time step for all clients: images float [N,B,C,H,W] in [0,1], labels [N,B], domain ids [N]."""

    step: int
    images: torch.Tensor
    labels: torch.Tensor
    domains: np.ndarray
    indices: np.ndarray


class CorruptedDomains:
    """A base image set under named corruptions (or ``clean``) at one severity; each domain generated once, cached
    (``.npy`` + checksum, verified on every load; a bad file is rebuilt with a warning naming it)."""

    def __init__(self, base: ImageArray, corruptions: Sequence[str], severity: int = 5, seed: int = 0,
                 cache_dir: Optional[Path] = None, chunk: int = 1000) -> None:
        from .corruptions import CORRUPTIONS, SEVERITIES

        unknown = [c for c in corruptions if c != CLEAN and c not in CORRUPTIONS]
        if unknown:
            raise ValueError(f"unknown corruption(s) {unknown}; valid: {list(CORRUPTIONS) + [CLEAN]}")
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {severity}")
        self.base = base
        self.domain_names = tuple(corruptions)
        self.severity = severity
        self.seed = seed
        self.cache_dir = cache_dir
        self.chunk = chunk
        self._memory: Dict[int, np.ndarray] = {}

    @property
    def labels(self) -> np.ndarray:
        """Labels of the base images (corruptions keep labels)."""
        return self.base.labels

    def image_seeds(self, name: str, indices: np.ndarray) -> list:
        """Per-image corruption seeds: the same (image, corruption, severity, seed) gives the same pixels anywhere."""
        return [derive_seed(self.seed, "corruption", name, self.severity, int(i)) for i in indices]

    def _cache_path(self, name: str) -> Optional[Path]:
        """The cache file of domain ``name`` (None without a cache folder); its checksum sits beside it."""
        if self.cache_dir is None:
            return None
        digest = hashlib.sha1(self.base.images[:: max(1, len(self.base) // 64)].tobytes()).hexdigest()[:12]
        return Path(self.cache_dir) / f"{self.base.name.replace('/', '_')}_{len(self.base)}_{digest}_{name}_s{self.severity}_seed{self.seed}.npy"

    def _generate(self, name: str) -> np.ndarray:
        """Domain ``name``'s images, corrupted chunk by chunk (counted in progress lines: ``progress_task``)."""
        from .corruptions import corrupt_uint8

        out = np.empty_like(self.base.images)
        what = f"data: {self.base.name} under {name}, severity {self.severity}: corrupting (cached after)"
        with progress_task(what, total=len(self.base), unit="image") as count:
            for start in range(0, len(self.base), self.chunk):
                idx = np.arange(start, min(start + self.chunk, len(self.base)))
                out[idx] = corrupt_uint8(self.base.images[idx], name, self.severity, self.image_seeds(name, idx))
                count.update(len(idx))
        return out

    def domain_images(self, domain: int) -> np.ndarray:
        """All base images under domain ``domain`` (uint8 [N,H,W,C]); generated on first use and cached."""
        if domain not in self._memory:
            name = self.domain_names[domain]
            if name == CLEAN:
                self._memory[domain] = self.base.images
            else:
                self._memory[domain] = self._cached(name)
        return self._memory[domain]

    def _cached(self, name: str) -> np.ndarray:
        """Domain ``name`` from the cache when its file passes its checksum, else generated (deterministic: a
        rebuilt file holds the same pixels) and stored atomically with its checksum; a bad file is reported."""
        path = self._cache_path(name)
        if path is not None:
            arr = load_checked(path, self.base.images.shape, self.base.images.dtype)
            if arr is not None:
                progress_line(f"data: {self.base.name}: corrupted images read from the cache", once=True)
                return arr
        arr = self._generate(name)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                save_checked(path, arr)
            except OSError as err:
                warnings.warn(f"could not write the corrupted-image cache file '{path}': {err}", stacklevel=3)
        return arr

    def images(self, domain: int, indices: np.ndarray) -> np.ndarray:
        """Images ``indices`` of the base set under domain ``domain``."""
        return self.domain_images(domain)[indices]


class Stream:
    """Deterministic random-access stream: client i at step t takes the next B images of its pool for its domain."""

    def __init__(self, scenario: Scenario, domains: CorruptedDomains, pools: np.ndarray,
                 device: str | torch.device = "cpu") -> None:
        pools = np.asarray(pools, dtype=np.int64)
        if pools.ndim != 2 or pools.shape[0] != scenario.n_clients:
            raise ValueError(f"pools must be [clients={scenario.n_clients}, images], got {pools.shape}")
        if len(domains.domain_names) != len(scenario.domain_names):
            raise ValueError("the scenario and the domain source name different numbers of domains")
        self.scenario = scenario
        self.domains = domains
        self.pools = pools
        self.device = torch.device(device)
        steps = np.arange(scenario.n_steps)
        dom = scenario.domain_map[:, steps // scenario.slot_steps]  # [N, T]
        self._domain_of_step = dom
        # visits[i, t] = how many earlier steps client i spent in the domain it is in at step t
        visits = np.zeros_like(dom)
        for d in np.unique(dom):
            mask = dom == d
            visits[mask] = (np.cumsum(mask, axis=1) - 1)[mask]
        self._visits = visits

    def __len__(self) -> int:
        return self.scenario.n_steps

    def indices_at(self, step: int) -> np.ndarray:
        """Base image indices of every client's batch at ``step`` ([N, B])."""
        b, p = self.scenario.batch_size, self.pools.shape[1]
        pos = (self._visits[:, step][:, None] * b + np.arange(b)[None, :]) % p
        return np.take_along_axis(self.pools, pos, axis=1)

    def batch(self, step: int) -> StreamBatch:
        """The batch of all clients at ``step``."""
        if not 0 <= step < len(self):
            raise IndexError(f"step {step} outside 0..{len(self) - 1}")
        idx = self.indices_at(step)
        doms = self._domain_of_step[:, step]
        imgs = np.stack([self.domains.images(int(d), row) for d, row in zip(doms, idx)])  # [N,B,H,W,C]
        x = torch.from_numpy(imgs).to(self.device).permute(0, 1, 4, 2, 3).float().div_(255.0)
        y = torch.from_numpy(self.domains.labels[idx]).to(self.device)
        return StreamBatch(step, x.contiguous(), y, doms, idx)

    def __iter__(self) -> Iterator[StreamBatch]:
        for t in range(len(self)):
            yield self.batch(t)
