"""Shared fixtures: small real batches from the embedded digits and the committed digits source model."""
from __future__ import annotations

from functools import lru_cache
from typing import List

import numpy as np
import pytest
import torch

from ftta_core.data import load_embedded_digits
from ftta_core.stream import StreamBatch
from ftta_core.training import load_source_model


@pytest.fixture(scope="session")
def digits_model():
    """The committed embedded-digits source CNN (BatchNorm, 16x16 inputs)."""
    return load_source_model("digits_cnn_embedded")


@lru_cache(maxsize=1)
def _digits_test():
    return load_embedded_digits("test")


def shifted_batches(n_clients: int = 4, batch: int = 8, steps: int = 3, seed: int = 0) -> List[StreamBatch]:
    """Real digit images; client i sees a client-specific contrast/brightness shift (two 'domains')."""
    data = _digits_test()
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        idx = rng.choice(len(data), (n_clients, batch), replace=False)
        x, y = data.tensors(idx.reshape(-1))
        x = x.view(n_clients, batch, *x.shape[1:])
        domains = np.arange(n_clients) % 2
        scale = torch.tensor([0.4 if d else 1.0 for d in domains]).view(-1, 1, 1, 1, 1)
        x = (x * scale + (1 - scale) * 0.5).clamp(0, 1)
        out.append(StreamBatch(t, x, y.view(n_clients, batch), domains, idx))
    return out


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread is faster and does not fight other jobs for the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
