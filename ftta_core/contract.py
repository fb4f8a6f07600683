"""The backend-agreement contract: a method gives the same results on the loop and the vectorized client bank.

The loop backend (one model per client) is the specification; the vectorized one (all clients as one batched
model) is what runs are made with. Every built-in local method and strategy is checked against both
(``tests/test_engine_backends.py``); check a method of your own the same way::

    from ftta_core.contract import check_backends_agree
    check_backends_agree(local="mytent", strategy="mystrat", local_params={"lr": 1e-3})

It runs a few steps of 4 clients on real images (the embedded digits, two contrast 'domains') with the committed
digits CNN on both backends and raises ``AssertionError`` naming the step and what differs when they disagree:
predictions exactly, W to 1e-5, the shared state (BN statistics or parameters) to 1e-4. The tolerances are float32
rounding: the backends sum the same products in different orders. A method that disagrees typically depends on the
bank's type or layout, loops over clients with state shared between them, or draws random numbers differently.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn

from .stream import StreamBatch

CONTRACT_MODEL = "digits_cnn_embedded"
WEIGHTS_ATOL = 1e-5
STATE_ATOL = 1e-4

MethodSpec = Union[str, Callable[..., Any]]
StepRecord = Tuple[Any, Dict[str, torch.Tensor]]  # (StepResult, the clients' shared state after the step)


@lru_cache(maxsize=1)
def _digits_test():
    from .data import load_embedded_digits

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


def _max_diff(a: Any, b: Any) -> float:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    if a.shape != b.shape:
        return float("inf")
    return float((a - b).abs().nan_to_num(nan=float("inf")).max()) if a.numel() else 0.0


def assert_runs_agree(loop: Sequence[StepRecord], vectorized: Sequence[StepRecord], weights_atol: float = WEIGHTS_ATOL,
                      state_atol: float = STATE_ATOL, what: str = "") -> None:
    """The loop and vectorized backends' step results and shared states agree: predictions exactly, W to
    ``weights_atol``, uploads to ``state_atol``; else ``AssertionError`` naming the step and what differs."""
    prefix = f"{what}: " if what else ""
    if len(loop) != len(vectorized):
        raise AssertionError(f"{prefix}the backends ran {len(loop)} (loop) and {len(vectorized)} (vectorized) steps")
    for step, ((a, state_a), (b, state_b)) in enumerate(zip(loop, vectorized)):
        at = f"{prefix}loop and vectorized backends disagree at step {step}"
        for field in ("correct_local", "correct_mixed"):
            ca, cb = np.asarray(getattr(a, field)), np.asarray(getattr(b, field))
            if ca.shape != cb.shape or not (ca == cb).all():
                raise AssertionError(f"{at}: {field} (correct predictions per client) loop {ca.tolist()} vs "
                                     f"vectorized {cb.tolist()}")
        wa, wb = torch.as_tensor(np.asarray(a.weights)), torch.as_tensor(np.asarray(b.weights))
        if wa.shape != wb.shape or not torch.allclose(wa.double(), wb.double(), atol=weights_atol):
            raise AssertionError(f"{at}: the collaboration matrix W differs by up to {_max_diff(wa, wb):.3g} "
                                 f"(tolerance {weights_atol:g})")
        if a.upload_bytes != b.upload_bytes:
            raise AssertionError(f"{at}: upload bytes {a.upload_bytes} (loop) vs {b.upload_bytes} (vectorized)")
        if set(state_a) != set(state_b):
            raise AssertionError(f"{at}: shared state names differ: only loop {sorted(set(state_a) - set(state_b))}, "
                                 f"only vectorized {sorted(set(state_b) - set(state_a))}")
        for k in state_a:  # uploads: BN statistics (TTA-bn) or parameters (TTA-grad)
            if state_a[k].shape != state_b[k].shape or not torch.allclose(state_a[k], state_b[k], atol=state_atol):
                raise AssertionError(f"{at}: shared state {k!r} differs by up to "
                                     f"{_max_diff(state_a[k], state_b[k]):.3g} (tolerance {state_atol:g})")


def _builder(kind: str, spec: MethodSpec, params: Optional[Mapping[str, Any]]) -> Callable[[], Any]:
    """A function making a fresh instance of a method given by registered name or by class/factory."""
    params = dict(params or {})
    if isinstance(spec, str):
        if kind == "local":
            from .tta import build_local as build
        else:
            from .strategies import build_strategy as build
        build(spec, **params)  # unknown names and parameters fail here, before anything runs
        return lambda: build(spec, **params)
    if not callable(spec):
        raise TypeError(f"{kind}: expected a registered name, a class or a factory function, got {spec!r}")
    return lambda: spec(**params)


def run_backend(model: nn.Module, local: Callable[[], Any], strategy: Callable[[], Any], backend: str,
                batches: Sequence[StreamBatch], seed: int = 0) -> List[StepRecord]:
    """Step results and the clients' shared state (what they upload next) after every step, on ``backend``."""
    from .loop import Engine

    torch.manual_seed(seed)
    eng = Engine(model, local(), strategy(), n_clients=batches[0].images.shape[0], backend=backend, seed=seed)
    out = []
    for b in batches:
        res = eng.step(b)
        out.append((res, eng.local.shared_state(eng.bank)))
    return out


def check_backends_agree(local: MethodSpec = "bn", strategy: MethodSpec = "fedavg",
                         local_params: Optional[Mapping[str, Any]] = None,
                         strategy_params: Optional[Mapping[str, Any]] = None, *, n_clients: int = 4, batch: int = 8,
                         steps: int = 3, seed: int = 0, model: Optional[nn.Module] = None,
                         weights_atol: float = WEIGHTS_ATOL, state_atol: float = STATE_ATOL) -> Dict[str, Any]:
    """Run ``local`` + ``strategy`` (registered names, or classes/factory functions) on the loop and the vectorized
    backend over ``steps`` small real batches (embedded digits, ``n_clients`` clients x ``batch`` images, two
    contrast domains) and raise ``AssertionError`` with what differs when they disagree (see the module's doc).

    ``model`` defaults to the committed digits CNN (``digits_cnn_embedded``). Returns what was compared: steps and
    the largest differences of W and of the shared state."""
    from .training import load_source_model

    make_local, make_strategy = _builder("local", local, local_params), _builder("strategy", strategy, strategy_params)
    model = load_source_model(CONTRACT_MODEL) if model is None else model
    batches = shifted_batches(n_clients, batch, steps, seed)
    loop = run_backend(model, make_local, make_strategy, "loop", batches, seed)
    vectorized = run_backend(model, make_local, make_strategy, "vectorized", batches, seed)
    name = lambda spec: spec if isinstance(spec, str) else getattr(spec, "__qualname__", repr(spec))  # noqa: E731
    assert_runs_agree(loop, vectorized, weights_atol, state_atol, what=f"local {name(local)!r} + strategy "
                                                                        f"{name(strategy)!r}")
    return {"steps": len(batches),
            "max_weights_diff": max(_max_diff(a.weights, b.weights) for (a, _), (b, _) in zip(loop, vectorized)),
            "max_state_diff": max([_max_diff(sa[k], sb[k]) for (_, sa), (_, sb) in zip(loop, vectorized) for k in sa]
                                  or [0.0])}
