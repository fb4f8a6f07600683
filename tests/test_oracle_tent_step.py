"""Oracle of the faster Tent step (Tent on all parameters, running BN, Adam; FedAvg), in float64:

* Adam: the vectorized bank's fused update equals torch's reference loop (the loop bank's) over stacked clients;
* FedAvg's mixing: ``mix_state`` (the common-row path for a W whose rows are all one row) equals the frozen previous
  implementation (``tests/frozen/mixing_v1.py``, verbatim from commit c9857d8), NaN/Inf clients included;
* whole steps: the vectorized bank now (default per-client convolutions, and 'unfold' everywhere) equals the loop
  bank (the specification) and the vectorized bank as it was (grouped convolutions, the frozen mixing, torch's
  reference Adam): local logits, shared state (parameters and running statistics), predictions after mixing.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Dict, List, Optional

import pytest
import torch

from frozen import mixing_v1 as frozen_mixing
from ftta_core.contract import shifted_batches
from ftta_core.engine.bank import OptimizerSpec
from ftta_core.engine.mixing import mix_state
from ftta_core.loop import Engine
from ftta_core.strategies import build_strategy
from ftta_core.tta import build_local

pytestmark = pytest.mark.usefixtures("one_thread")

RTOL, ATOL = 1e-9, 1e-12
TENT = {"params": "all", "optimizer": "adam", "lr": 3e-4, "bn": "running"}


@pytest.fixture
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # tensors a method creates without a dtype are float64 too
    yield
    torch.set_default_dtype(before)


def test_fused_adam_equals_the_reference_loop(float64):
    gen = torch.Generator().manual_seed(0)
    shapes = [(4, 8, 3, 3, 3), (4, 8), (4, 10, 16)]
    start = [torch.randn(s, generator=gen) for s in shapes]
    params = {k: [p.clone().requires_grad_(True) for p in start] for k in ("reference", "fused")}
    spec = OptimizerSpec("adam", lr=3e-4, weight_decay=1e-3)
    opts = {"reference": spec.build(params["reference"]), "fused": spec.build(params["fused"], fused=True)}
    assert opts["fused"].defaults["fused"] and not opts["reference"].defaults["fused"]
    for _ in range(4):
        grads = [torch.randn(s, generator=gen) * 1e-3 for s in shapes]
        for k, opt in opts.items():
            for p, g in zip(params[k], grads):
                p.grad = g.clone()
            opt.step()
    for a, b in zip(params["fused"], params["reference"]):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    for a, b in zip(opts["fused"].state.values(), opts["reference"].state.values()):
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"], rtol=RTOL, atol=ATOL)


def mixing_cases(gen: torch.Generator) -> List[tuple]:
    """(name, state, W): FedAvg's uniform W (with and without a broken client), unequal rows, a zero weight."""
    n = 4
    state = {"w": torch.randn(n, 3, 2, generator=gen), "running.bn": torch.rand(n, 2, 5, generator=gen),
             "b": torch.randn(n, generator=gen)}
    broken = {k: v.clone() for k, v in state.items()}
    broken["w"][2, 1, 0] = float("nan")
    uniform = torch.full((n, n), 1.0 / n)
    sizes = torch.tensor([1.0, 2.0, 3.0, 4.0])
    weighted = (sizes / sizes.sum()).repeat(n, 1)
    zero = weighted.clone()
    zero[:, 2] = 0
    zero = zero / zero.sum(1, keepdim=True)
    rows = torch.rand(n, n, generator=gen)
    return [("uniform", state, uniform), ("sample-weighted", state, weighted), ("uniform, NaN client", broken,
            uniform), ("zero weight, NaN client", broken, zero), ("unequal rows", state, rows / rows.sum(1, True)),
            ("unequal rows, NaN client", broken, rows / rows.sum(1, True))]


def test_mix_state_equals_the_frozen_implementation(float64):
    for name, state, w in mixing_cases(torch.Generator().manual_seed(1)):
        got, want = mix_state(state, w), frozen_mixing.mix_state(state, w)
        assert got.keys() == want.keys(), name
        for k in want:
            assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype, (name, k)
            torch.testing.assert_close(got[k], want[k], rtol=RTOL, atol=ATOL, equal_nan=True,
                                       msg=lambda m: f"{name} {k}: {m}")


def as_before(engine: Engine, monkeypatch) -> None:
    """The vectorized bank as the previous implementation ran it: grouped convolutions, torch's reference Adam
    and the frozen ``mix_state``."""
    engine.bank.set_per_client_conv("grouped")
    params = [engine.bank._params[n] for n in engine.bank.trainable]
    engine.bank.optimizer = engine.bank.optimizer_spec.build(params)
    monkeypatch.setattr("ftta_core.engine.average.mix_state", frozen_mixing.mix_state)


def run_steps(model, batches, backend: str, kernel: Optional[str] = None, before=None) -> List[Dict]:
    """Per step: local logits, shared state and the predictions after mixing."""
    torch.manual_seed(0)
    engine = Engine(model, build_local("tent", **TENT), build_strategy("fedavg"), batches[0].images.shape[0],
                    backend)
    if kernel is not None:
        engine.bank.set_per_client_conv(kernel)
    if before is not None:
        as_before(engine, before)
    elif backend == "vectorized":
        assert engine.bank.optimizer.defaults["fused"]  # the path under test
    out = []
    for batch in batches:
        phase = engine.local_phase(batch, engine.strategy)
        engine.server_phase(phase, engine.strategy)
        out.append({"local": phase.local_logits, **{f"state/{k}": v for k, v in phase.state.items()},
                    "mixed": engine.local.predict(engine.bank, phase.x).logits,
                    **{f"params/{k}": v for k, v in engine.bank.get_params().items()}})
    engine.close()
    return out


def assert_steps_close(got: List[Dict], want: List[Dict], what: str) -> None:
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want)):
        assert g.keys() == w.keys(), what
        for k in w:
            torch.testing.assert_close(g[k], w[k], rtol=RTOL, atol=ATOL, msg=lambda m: f"{what} step {step} {k}: {m}")


def test_tent_running_adam_fedavg_steps_equal_the_loop_bank_and_the_previous_vectorized_bank(
        digits_model, float64, monkeypatch):
    model = copy.deepcopy(digits_model).double()  # the fixture is shared by the session
    batches = [dataclasses.replace(b, images=b.images.double()) for b in shifted_batches(4, 8, 3, 0)]
    loop = run_steps(model, batches, "loop")
    for kernel in (None, "unfold"):
        assert_steps_close(run_steps(model, batches, "vectorized", kernel), loop, f"vectorized ({kernel}) vs loop")
    with monkeypatch.context() as patch:
        before = run_steps(model, batches, "vectorized", before=patch)
    assert_steps_close(before, loop, "previous vectorized vs loop")
    assert_steps_close(run_steps(model, batches, "vectorized"), before, "vectorized vs previous vectorized")
