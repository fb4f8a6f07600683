"""Explicit, derived random generators: every draw in ftta comes from (seed, purpose, ...keys)."""
from __future__ import annotations

import hashlib
from typing import Union

import numpy as np
import torch

Key = Union[int, str]


def derive_seed(seed: int, *keys: Key) -> int:
    """Return a 63-bit seed derived deterministically from ``seed`` and the ``keys`` (purpose, client, step...)."""
    text = "/".join([str(int(seed))] + [str(k) for k in keys])
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def torch_generator(seed: int, *keys: Key, device: Union[str, torch.device] = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded from ``derive_seed(seed, *keys)``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(seed, *keys))
    return gen


def numpy_generator(seed: int, *keys: Key) -> np.random.Generator:
    """A NumPy ``Generator`` seeded from ``derive_seed(seed, *keys)``."""
    return np.random.default_rng(derive_seed(seed, *keys))
