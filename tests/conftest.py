"""Shared fixtures: small real batches from the embedded digits and the committed digits source model."""
from __future__ import annotations

import pytest
import torch

# the reusable parts live in the package, so users run the same backend-agreement check on their own methods
from ftta_core.contract import assert_runs_agree, shifted_batches  # noqa: F401  (imported by the test modules)
from ftta_core.training import load_source_model


@pytest.fixture(scope="session")
def digits_model():
    """The committed embedded-digits source CNN (BatchNorm, 16x16 inputs)."""
    return load_source_model("digits_cnn_embedded")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread is faster and does not fight other jobs for the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def _partial_runs_in_tmp(tmp_path_factory):
    """Grids keep unfinished runs under ``$FTTA_PARTIAL_DIR``: in tests a temporary folder, never the checkout's
    ``runs/partial`` (``workbook.partial_dir``)."""
    import os

    before = os.environ.get("FTTA_PARTIAL_DIR")
    os.environ["FTTA_PARTIAL_DIR"] = str(tmp_path_factory.mktemp("partial"))
    yield
    if before is None:
        os.environ.pop("FTTA_PARTIAL_DIR", None)
    else:
        os.environ["FTTA_PARTIAL_DIR"] = before
