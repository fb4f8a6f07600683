"""The frozen source model's outputs, computed once per batch and reused within a run and across the runs of a grid.

The source model never adapts, so what the engine takes from it at a step (the logits behind the "before" accuracy
and the mean penultimate features, the ``indicator`` upload of FedTSA and the strategies that look ahead) depends
only on the batch. ``SourceCache`` keeps them content-addressed: the key of an entry is a digest of the batch's
image bytes, so an entry is only ever used for the very images it was computed on, whatever stream, seed or
scenario the run has; one cache holds one model (the digest of its ``state_dict``, checked when a file is read).

Persisted (``save``) to one file per (model, stream) under ``cache_dir()/source_outputs`` (``open_for``), written
atomically (``data.cache.atomic_write``): concurrent runs of a grid each write a complete file and the last one wins.
A file of another model is ignored. The values are those of the first run's forward, so a later run reads exactly
what it would have recomputed, up to the bit when both ran with the same thread count (the test compares whole
runs with and without the cache).
"""
from __future__ import annotations

import hashlib
import io
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional, Tuple

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    from ..stream import Stream

log = logging.getLogger(__name__)

FORMAT = 2  # bump when what an entry holds changes (older files are then ignored); 2: keys name device and threads


def model_digest(model: nn.Module) -> str:
    """A digest of ``model``'s ``state_dict`` (names, dtypes, shapes and bytes)."""
    h = hashlib.sha1()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()[:16]


def batch_digest(x: torch.Tensor) -> str:
    """A digest of a batch's images (dtype, shape and bytes): the key of its entry."""
    x = x.detach().cpu().contiguous()
    h = hashlib.blake2b(f"{x.dtype}:{tuple(x.shape)}".encode(), digest_size=16)
    h.update(x.numpy().tobytes())
    return h.hexdigest()


def entry_key(x: torch.Tensor) -> str:
    """The key of batch ``x``'s entry: its ``batch_digest`` and where its outputs are computed (device type and
    torch's intra-op thread count), so an entry is only read by a forward that would compute the same bits (float
    sums split over threads, or run on another device, round differently): a run with the cache equals the run
    without it bit for bit, whatever runs filled it."""
    return f"{batch_digest(x)}@{x.device.type}:{torch.get_num_threads()}"


def stream_key(stream: "Stream") -> str:
    """Which file of the cache a stream's entries go to: its scenario, client pools and domains (base set, names,
    severity, seed). It only groups entries (each is checked by its batch digest), so it need not be exhaustive."""
    sc, dom = stream.scenario, stream.domains
    h = hashlib.sha1()
    for part in (np.asarray(sc.domain_map), stream.pools):
        h.update(np.ascontiguousarray(part).tobytes())
    h.update(repr((sc.batch_size, sc.slot_steps, sc.n_steps, tuple(dom.domain_names), dom.severity, dom.seed,
                   getattr(dom.base, "name", ""), len(dom.base))).encode())
    return h.hexdigest()[:16]


def default_root() -> Path:
    """Where source outputs are cached: ``cache_dir()/source_outputs`` (outside the repository)."""
    from ..data.root import cache_dir

    return cache_dir() / "source_outputs"


class SourceCache:
    """Source logits [N,B,K] and indicators [N,D] (mean penultimate features) per batch digest, for one model.

    ``get``/``put`` work in memory (CPU tensors; ``get`` returns them on the batch's device); with a ``path``,
    ``save`` writes the entries there atomically when new ones were added, and the constructor reads them back.
    ``hits``/``misses`` count lookups."""

    def __init__(self, model: nn.Module, path: Optional[Path] = None) -> None:
        self.model = model_digest(model)
        self.path = None if path is None else Path(path)
        self.entries: Dict[str, Tuple[torch.Tensor, torch.Tensor]] = {}
        self.hits = self.misses = 0
        self._dirty = False
        if self.path is not None and self.path.is_file():
            self._load(self.path)

    @classmethod
    def open_for(cls, model: nn.Module, stream: "Stream", root: Optional[Path] = None) -> "SourceCache":
        """The cache of ``model`` on ``stream``: file ``<root>/<model digest>_<stream key>.pt`` (default root:
        ``default_root()``), read if present."""
        root = Path(root) if root is not None else default_root()
        return cls(model, root / f"{model_digest(model)}_{stream_key(stream)}.pt")

    def _load(self, path: Path) -> None:
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # a damaged file: recomputed (and rewritten at the next save)
            log.warning("ignoring the source-output cache file %s: %s", path, err)
            return
        if blob.get("format") != FORMAT or blob.get("model") != self.model:
            return
        self.entries.update({k: (lg, ind) for k, lg, ind in zip(blob["keys"], blob["logits"], blob["indicators"])})

    def get(self, x: torch.Tensor, key: Optional[str] = None) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """(logits, indicator) of batch ``x`` on its device, or None (``key``: its ``entry_key`` if known)."""
        hit = self.entries.get(key or entry_key(x))
        if hit is None:
            self.misses += 1
            return None
        self.hits += 1
        return hit[0].to(x.device, copy=True), hit[1].to(x.device, copy=True)  # callers may not alter the cache

    def put(self, x: torch.Tensor, logits: torch.Tensor, indicator: torch.Tensor, key: Optional[str] = None) -> None:
        """Store batch ``x``'s outputs (copied to the CPU)."""
        self.entries[key or entry_key(x)] = (logits.detach().cpu().clone(), indicator.detach().cpu().clone())
        self._dirty = True

    def save(self) -> None:
        """Write the entries to ``path`` (atomically) if new ones were added since the last save or load."""
        if self.path is None or not self._dirty:
            return
        from ..data.cache import atomic_write

        keys = list(self.entries)
        blob = {"format": FORMAT, "model": self.model, "keys": keys,
                "logits": [self.entries[k][0] for k in keys], "indicators": [self.entries[k][1] for k in keys]}
        buf = io.BytesIO()
        torch.save(blob, buf)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, lambda fh: fh.write(buf.getvalue()))
        except OSError as err:
            log.warning("could not write the source-output cache file %s: %s", self.path, err)
            return
        self._dirty = False


__all__ = ["SourceCache", "batch_digest", "entry_key", "model_digest", "stream_key", "default_root"]
