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


def assert_runs_agree(loop: list, vectorized: list) -> None:
    """The loop and vectorized backends' step results and shared states agree: predictions exactly, W to 1e-5,
    uploads to 1e-4 (the backends sum the same products in different orders; float32 rounding ~1e-6)."""
    for (a, state_a), (b, state_b) in zip(loop, vectorized):
        assert (a.correct_local == b.correct_local).all()
        assert (a.correct_mixed == b.correct_mixed).all()
        assert torch.allclose(torch.as_tensor(a.weights), torch.as_tensor(b.weights), atol=1e-5)
        assert a.upload_bytes == b.upload_bytes
        assert set(state_a) == set(state_b)
        for k in state_a:  # uploads: BN statistics (TTA-bn) or parameters (TTA-grad)
            assert torch.allclose(state_a[k], state_b[k], atol=1e-4), k
