"""The engine's oracle: float64 runs of every local method and every strategy, on both client-bank backends, give the
numbers the certified implementation gave (``tests/golden/runs.npz``), to float64 rounding.

This is what certifies a new implementation of an engine unit (``ftta_core.units``: ``client_conv``, ``ts_block``,
``bn_running``, a method, the mixing kernel, ...) as computing the same thing: in float64 a faster kernel that sums in
another order moves numbers by ~1e-13, while any change of meaning (another momentum, a mask drawn differently, a
missing term) moves them by far more than ``ATOL``. Each case runs 4 clients x 8 real digit images for 3 steps
(``ftta_core.contract.shifted_batches``) with the committed digits CNN in float64 and compares, per step, the clients'
correct predictions before and after mixing (exactly), W, the upload size, and the clients' shared state (BN
statistics or parameters: what they upload next).

The golden file was written by the loop backend (the specification) of the implementation the lock certified first
(``FTTA_UPDATE_GOLDEN=1 pytest tests/test_oracle_runs.py``; ``python -m ftta_core units bump NAME`` tells when to
write it again: after a change of meaning, never to make a failing implementation pass).
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
import torch

from ftta_core.contract import _builder, run_backend, shifted_batches
from ftta_core.training import load_source_model

GOLDEN = Path(__file__).parent / "golden" / "runs.npz"
UPDATE_ENV = "FTTA_UPDATE_GOLDEN"
# float64: rounding is ~1e-13 after a few steps, except where Adam meets a gradient at rounding level: its step
# lr * g / (|g| + eps) then carries that rounding times lr / eps (3e4 at lr 3e-4). The same code on another CPU
# (golden file written on one machine, checked on an AMD EPYC on 2026-12-02: both backends agreed with each other)
# moved the Tent-running-Adam cases with FedCTTA, FedTSA and pFedGraph by up to 5.9e-7 on a sketch of size 96. A
# change of meaning moves a sketch by lr-sized steps summed over thousands of entries, orders of magnitude more.
ATOL, RTOL = 1e-6, 1e-7

# local methods with parameters that make every step do something (the contract test's configurations)
LOCALS: Dict[str, Tuple[str, dict]] = {
    "source": ("source", {}),
    "bn": ("bn", {}),
    "tent_sgd": ("tent", {"params": "all", "optimizer": "sgd", "lr": 1e-3}),
    "tent_bn_affine_adam": ("tent", {"params": "bn_affine", "optimizer": "adam", "lr": 1e-3}),
    "tent_running_adam": ("tent", {"params": "all", "optimizer": "adam", "lr": 3e-4, "bn": "running"}),
    "pl_adam": ("pl", {"params": "all", "optimizer": "adam", "lr": 1e-4}),
    "pl_running_sgd": ("pl", {"params": "all", "optimizer": "sgd", "lr": 1e-3, "bn": "running"}),
    "eata": ("eata", {"fisher_source": "digits_cnn_embedded", "fisher_samples": 48, "fisher_batch": 16}),
    "cotta": ("cotta", {"optimizer": "sgd", "lr": 1e-3, "n_augmentations": 2}),
    "roid": ("roid", {}),
    "rotta": ("rotta", {"memory_size": 8, "update_frequency": 4}),
    "bbn": ("bbn", {"bn_momentum": 0.1}),
}
STRATEGY_PARAMS = {"fedtsa": {"server_steps": 5}}
STRATEGIES = ("local", "fedavg", "fedavg_ft", "fedavg_localstats", "fedavgm", "fedamp", "fedctta", "fedprox",
              "fedprox_source", "fedtsa", "ldawa", "moon", "pfedbbn", "pfedgraph", "pfedsd")
# every local method with FedAvg, every strategy under BN-adapt (TTA-bn), under Tent with running BN (TTA-grad as
# the authors' clients run it) the strategies that act on parameters or on the clients' loss
# (strategies with client-side terms: FedProx, MOON, pFedSD, FedAvg+FT) and the learned ones with a stateful method
CASES: List[Tuple[str, str]] = sorted(
    {(local, "fedavg") for local in LOCALS} | {("bn", s) for s in STRATEGIES}
    | {("tent_running_adam", s) for s in ("local", "fedavg_ft", "fedavgm", "fedprox", "fedprox_source", "moon",
                                          "pfedsd", "fedtsa", "fedctta", "pfedgraph")}
    | {("rotta", "fedtsa"), ("bbn", "pfedbbn")})


def _run(local: str, strategy: str, backend: str) -> Dict[str, np.ndarray]:
    """One float64 case on ``backend``: its per-step numbers, keyed ``step/field``."""
    method, params = LOCALS[local]
    model = load_source_model("digits_cnn_embedded").double()
    batches = [dataclasses.replace(b, images=b.images.double()) for b in shifted_batches(4, 8, 3, 0)]
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # tensors a method creates without a dtype are float64 too
    try:
        records = run_backend(model, _builder("local", method, params),
                              _builder("strategy", strategy, STRATEGY_PARAMS.get(strategy)), backend, batches)
    finally:
        torch.set_default_dtype(before)
    out: Dict[str, np.ndarray] = {}
    for step, (res, state) in enumerate(records):
        out[f"{step}/correct_local"] = np.asarray(res.correct_local)
        out[f"{step}/correct_mixed"] = np.asarray(res.correct_mixed)
        out[f"{step}/weights"] = np.asarray(res.weights, dtype=np.float64)
        out[f"{step}/upload_bytes"] = np.asarray(res.upload_bytes)
        for name, value in state.items():
            out[f"{step}/state/{name}"] = sketch(value)
    return out


def sketch(value: torch.Tensor, k: int = 6) -> np.ndarray:
    """A few numbers that move whenever a tensor moves: its sum, its sum of squares and its projections on ``k``
    fixed random directions (drawn from a generator seeded by its size), per client (the leading dimension)."""
    v = value.detach().double().cpu().reshape(value.shape[0], -1)
    directions = torch.randn(v.shape[1], k, generator=torch.Generator().manual_seed(v.shape[1]), dtype=torch.float64)
    return torch.cat([v.sum(1, keepdim=True), (v * v).sum(1, keepdim=True), v @ directions], 1).numpy()


def _key(local: str, strategy: str) -> str:
    return f"{local}+{strategy}"


@pytest.fixture(scope="module")
def golden():
    if os.environ.get(UPDATE_ENV):
        written = {f"{_key(*case)}|{k}": v for case in CASES for k, v in _run(*case, "loop").items()}
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(GOLDEN, **written)
    if not GOLDEN.exists():
        pytest.fail(f"{GOLDEN} is missing: write it with {UPDATE_ENV}=1 from the certified implementation")
    with np.load(GOLDEN) as data:
        return {k: data[k] for k in data.files}


def compare(case: str, got: Dict[str, np.ndarray], golden: Dict[str, np.ndarray], backend: str) -> None:
    """Raise AssertionError naming the first number of ``got`` that is not the golden one."""
    expected = {k.split("|", 1)[1]: v for k, v in golden.items() if k.split("|", 1)[0] == case}
    assert expected, f"{case}: no golden numbers (a new case: write them from the certified implementation)"
    assert set(got) == set(expected), (f"{case} ({backend}): other outputs than the golden run: only here "
                                       f"{sorted(set(got) - set(expected))[:4]}, only golden "
                                       f"{sorted(set(expected) - set(got))[:4]}")
    for key, want in expected.items():
        have = got[key]
        assert have.shape == want.shape, f"{case} ({backend}) {key}: shape {have.shape} vs golden {want.shape}"
        if key.endswith(("correct_local", "correct_mixed", "upload_bytes")):
            assert np.array_equal(have, want), f"{case} ({backend}) {key}: {have.tolist()} vs golden {want.tolist()}"
        else:
            diff = float(np.max(np.abs(have - want))) if have.size else 0.0
            assert np.allclose(have, want, atol=ATOL, rtol=RTOL), (
                f"{case} ({backend}) {key}: differs from the golden run by up to {diff:.3g} (tolerance {ATOL:g} + "
                f"{RTOL:g} x |golden|)")


@pytest.mark.parametrize("backend", ["loop", "vectorized"])
@pytest.mark.parametrize("local,strategy", CASES)
def test_float64_run_equals_the_certified_one(golden, local, strategy, backend):
    compare(_key(local, strategy), _run(local, strategy, backend), golden, backend)


def test_the_oracle_detects_a_change_of_meaning(golden):
    """A change far smaller than any method's (BN statistics momentum off by 1 %) fails the comparison: the oracle
    can fail."""
    got = _run("bn", "fedavg", "vectorized")
    moved = {k: (v * 1.01 if "/state/" in k else v) for k, v in got.items()}
    with pytest.raises(AssertionError, match="differs from the golden run"):
        compare(_key("bn", "fedavg"), moved, golden, "vectorized")
