"""Server cost of a strategy, measured on synthetic uploads of the right shapes (no images, no client models).

What a round costs the server: the time to compute W (``Strategy.collaboration``) and to mix the shared state
(``Strategy.mix``); the memory the strategy holds between rounds (tensors reachable from it, and its resumable
``state_dict``); the peak memory allocated during a round (torch allocations from the profiler's memory events, plus
Python allocations from ``tracemalloc``); and the bytes each client uploads per round. FedCTTA's probe statistic
needs the client models themselves: ``probe_forward_cost`` measures that forward on a real client bank.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
import tracemalloc
from typing import Any, Callable, Dict, List, Mapping, Tuple

import numpy as np
import torch
from torch import nn

from ftta_core.rng import torch_generator
from ftta_core.strategies.base import ServerInputs, Strategy
from ftta_core.strategies.fedctta import PROBE_UPLOAD, FedCTTA

Shapes = Dict[str, Tuple[int, ...]]


# ---------------------------------------------------------------------------------------------------- shapes


def model_dims(model: nn.Module, image_shape: Tuple[int, ...] = (3, 32, 32)) -> Dict[str, int]:
    """Feature dimension D, classes K, parameter count and BN channel count of ``model`` (one dry forward)."""
    with torch.no_grad():
        feats = model.eval().forward_features(torch.zeros(2, *image_shape))
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    return {"feature_dim": int(feats.shape[1]), "classes": int(model.fc.out_features),
            "parameters": sum(p.numel() for p in model.parameters()),
            "bn_channels": sum(m.num_features for m in bns), "bn_layers": len(bns)}


def bn_state_shapes(model: nn.Module) -> Shapes:
    """Per-client shapes of the TTA-bn shared state: (2, C) = (mean, var) per BatchNorm layer."""
    return {name: (2, m.num_features) for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}


def upload_shapes(strategy: Strategy, dims: Mapping[str, int]) -> Shapes:
    """Per-client shapes of the uploads ``strategy`` needs beyond the mixed state (from ``model_dims``)."""
    shapes: Shapes = {}
    for kind in strategy.needs:
        if kind in ("indicator", "feature_mean"):
            shapes[kind] = (dims["feature_dim"],)
        elif kind == "logits_mean":
            shapes[kind] = (dims["classes"],)
        elif kind == PROBE_UPLOAD and isinstance(strategy, FedCTTA):
            shapes[kind] = (dims["classes"] if strategy.on == "logits" else dims["feature_dim"],)
        else:
            raise ValueError(f"no synthetic shape for upload {kind!r} of strategy {strategy.name!r}")
    return shapes


def upload_bytes(shapes: Shapes, dtype: torch.dtype = torch.float32) -> int:
    """Bytes one client uploads for per-client ``shapes``."""
    size = torch.tensor([], dtype=dtype).element_size()
    return sum(int(np.prod(s)) * size for s in shapes.values())


def synthetic_inputs(step: int, n_clients: int, state: Shapes, uploads: Shapes, seed: int = 0,
                     device: str = "cpu") -> ServerInputs:
    """Random uniform state and uploads [N, *shape] for ``step`` (from ``torch_generator(seed, 'server-cost', step)``)."""
    gen = torch_generator(seed, "server-cost", step)

    def draw(shapes: Shapes) -> Dict[str, torch.Tensor]:
        return {k: torch.rand((n_clients, *s), generator=gen).to(device) for k, s in shapes.items()}

    return ServerInputs(step, draw(state), draw(uploads), torch.ones(n_clients, dtype=torch.bool),
                        torch.full((n_clients,), 10.0))


# ---------------------------------------------------------------------------------------------------- memory


def _walk_tensors(obj: Any, seen_objects: set, out: Dict[Tuple[str, int], int], depth: int) -> None:
    if depth < 0 or id(obj) in seen_objects:
        return
    seen_objects.add(id(obj))
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        out[(str(obj.device), storage.data_ptr())] = storage.nbytes()
    elif isinstance(obj, np.ndarray):
        out[("numpy", id(obj if obj.base is None else obj.base))] = obj.nbytes
    elif isinstance(obj, nn.Module):
        for t in [*obj.parameters(), *obj.buffers()]:
            _walk_tensors(t, seen_objects, out, depth - 1)
    elif isinstance(obj, Mapping):
        for v in obj.values():
            _walk_tensors(v, seen_objects, out, depth - 1)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            _walk_tensors(v, seen_objects, out, depth - 1)
    elif (dataclasses.is_dataclass(obj) and not isinstance(obj, type)) or type(obj).__module__.startswith("ftta_core"):
        for v in vars(obj).values():
            _walk_tensors(v, seen_objects, out, depth - 1)


def tensor_bytes(obj: Any, depth: int = 8) -> int:
    """Bytes of the distinct tensor storages and numpy arrays reachable from ``obj`` (attributes, dicts, lists)."""
    found: Dict[Tuple[str, int], int] = {}
    _walk_tensors(obj, set(), found, depth)
    return sum(found.values())


def peak_allocation(fn: Callable[[], Any], device: str = "cpu") -> Dict[str, int]:
    """Run ``fn`` once and return the peak bytes it allocated above its start: torch (profiler memory events, per
    device type; CUDA also from ``torch.cuda.max_memory_allocated``) and Python (``tracemalloc``)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = str(device).startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cuda_start = torch.cuda.memory_allocated()
    tracemalloc.start()
    try:
        with profile(activities=activities, profile_memory=True) as prof:
            fn()
            if cuda:
                torch.cuda.synchronize()
        _, python_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    events = sorted((e.start_ns(), str(e.device_type()), e.nbytes())
                    for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    current: Dict[str, int] = {}
    peak: Dict[str, int] = {}
    for _, kind, nbytes in events:
        current[kind] = current.get(kind, 0) + nbytes
        peak[kind] = max(peak.get(kind, 0), current[kind])
    out = {"torch_cpu_peak_bytes": sum(v for k, v in peak.items() if "CPU" in k.upper()),
           "python_peak_bytes": int(python_peak)}
    if cuda:
        out["cuda_peak_bytes"] = int(torch.cuda.max_memory_allocated() - cuda_start)
    return out


# ---------------------------------------------------------------------------------------------------- time


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


@dataclasses.dataclass
class RoundCost:
    """One measured server round."""

    step: int
    collaboration_s: float
    mix_s: float
    state_dict_bytes: int
    retained_bytes: int

    @property
    def round_s(self) -> float:
        """Server seconds of the round (W + mixing)."""
        return self.collaboration_s + self.mix_s


def server_round(strategy: Strategy, inputs: ServerInputs) -> RoundCost:
    """Time one round (W, then mixing of the state) and measure what the strategy holds afterwards."""
    device = next(iter(inputs.state.values())).device.type if inputs.state else "cpu"
    _sync(device)
    t0 = time.perf_counter()
    weights = strategy.collaboration(inputs)
    _sync(device)
    t1 = time.perf_counter()
    mixed = strategy.mix(inputs.state, weights.to(device).float()) if inputs.state else {}
    strategy.after_mix(mixed, inputs)
    _sync(device)
    t2 = time.perf_counter()
    return RoundCost(inputs.step, t1 - t0, t2 - t1, tensor_bytes(strategy.state_dict()), tensor_bytes(strategy))


def measure_rounds(strategy: Strategy, n_clients: int, rounds: int, state: Shapes, uploads: Shapes,
                   seed: int = 0, device: str = "cpu", start: int = 0) -> List[RoundCost]:
    """``rounds`` consecutive server rounds on fresh synthetic uploads (steps ``start``, ``start + 1``, ...)."""
    return [server_round(strategy, synthetic_inputs(start + r, n_clients, state, uploads, seed, device))
            for r in range(rounds)]


def fill_indicator_memory(strategy: Strategy, n_clients: int, steps: int, dim: int, seed: int = 0,
                          device: str = "cpu") -> int:
    """Push ``steps`` synthetic indicator uploads on ``device`` into a FedTSA memory bank without training (steady
    state: a full window); returns the next step id. The bank lives on the device of its first upload and the
    TS-Block trains there, so ``device`` must be the device of the timed rounds' uploads. Strategies without an
    indicator memory are left unchanged."""
    memory = getattr(strategy, "memory", None)
    if memory is None or not hasattr(memory, "push"):
        return 0
    for t in range(steps):
        memory.push(t, torch.rand(n_clients, dim, generator=torch_generator(seed, "server-cost-fill", t)).to(device))
    return steps


def summarize_rounds(costs: List[RoundCost]) -> Dict[str, float]:
    """Median times and the memory after the last round."""
    return {"rounds": len(costs), "round_s": statistics.median(c.round_s for c in costs),
            "collaboration_s": statistics.median(c.collaboration_s for c in costs),
            "mix_s": statistics.median(c.mix_s for c in costs),
            "state_dict_bytes": costs[-1].state_dict_bytes, "retained_bytes": costs[-1].retained_bytes,
            "retained_bytes_max": max(c.retained_bytes for c in costs)}


# ---------------------------------------------------------------------------------------------------- probes


def probe_forward_cost(model: nn.Module, n_clients: int, image_shape: Tuple[int, ...] = (3, 32, 32),
                       batch: int = 10, n_probes: int = 64, repeats: int = 3, device: str = "cpu",
                       backend: str = "vectorized") -> Dict[str, float]:
    """Seconds (median of ``repeats``) to compute every client's FedCTTA probe statistic with TTA-bn on a real
    client bank of ``model`` (after one batch-statistics pass on a synthetic batch), and the peak allocation."""
    from ftta_core.engine.bank import make_bank
    from ftta_core.tta import build_local

    model = model.to(device).eval()
    bank = make_bank(backend, model, n_clients)
    local = build_local("bn")
    x = torch.rand((n_clients, batch, *image_shape), generator=torch_generator(0, "server-cost-batch")).to(device)
    strategy = FedCTTA(n_probes=n_probes)
    with torch.no_grad():
        local.adapt(bank, x)
        strategy.probe_uploads(bank, local, x, 0)  # warm-up
    seconds = []
    for r in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            strategy.probe_uploads(bank, local, x, r + 1)
        _sync(device)
        seconds.append(time.perf_counter() - t0)
    with torch.no_grad():
        peak = peak_allocation(lambda: strategy.probe_uploads(bank, local, x, repeats + 1), device)
    total = statistics.median(seconds)
    return {"clients": n_clients, "n_probes": n_probes, "seconds": total, "seconds_per_client": total / n_clients,
            **peak}


def extrapolate_linear(points: Mapping[int, float], target: int) -> float:
    """Least-squares line through (clients, seconds) evaluated at ``target`` clients."""
    x = np.array(sorted(points), dtype=float)
    y = np.array([points[k] for k in sorted(points)], dtype=float)
    if len(x) == 1:
        return float(y[0] / x[0] * target)
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope * target + intercept)


__all__ = ["scaling_table", "model_dims", "bn_state_shapes", "upload_shapes", "upload_bytes", "synthetic_inputs", "tensor_bytes",
           "peak_allocation", "RoundCost", "server_round", "measure_rounds", "fill_indicator_memory",
           "summarize_rounds", "probe_forward_cost", "extrapolate_linear"]


def scaling_table(result: Mapping[str, Any]) -> "pd.DataFrame":
    """From a ``benchmarks/server_cost.py`` result: per (clients, strategy) the server seconds per round at the
    strategy's default settings (FedTSA: 100 server steps; extrapolated from fewer where marked), seconds per
    server step, bytes held between rounds and the peak bytes allocated during a round."""
    import pandas as pd

    rows = []
    for r in result["scaling"]:
        rows.append({"clients": r["clients"], "strategy": r["strategy"],
                     "s_per_round": r.get("round_s_at_default_steps", r["round_s"]),
                     "s_per_server_step": r.get("per_server_step_s", float("nan")),
                     "held_bytes": r["retained_bytes"], "state_dict_bytes": r["state_dict_bytes"],
                     "peak_bytes": r.get("cuda_peak_bytes", r["torch_cpu_peak_bytes"]),
                     "extrapolated": bool(r.get("extrapolated", False)), "rounds_timed": r["rounds"]})
    return pd.DataFrame(rows)
