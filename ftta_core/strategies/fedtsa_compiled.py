"""FedTSA's server iteration compiled ahead of time (``torch.export`` + AOTInductor), built once per machine.

A server round is 100 iterations of ~100 small operations (two passes of the TS-Block, the masks, L_tsa and its
hand-derived gradient, ``FedTSA._iteration``). Eager PyTorch runs each operation as its own kernel call; compiled,
inductor fuses the element-wise work into a few C++ loops and its C++ wrapper calls the kernels without Python.

Why ahead of time and not ``torch.compile`` at run time: ``torch.compile`` re-traces the iteration in every process
(~1.3 s per window shape with inductor's on-disk cache warm, ~4 s for a run; ~20 s cold), which a 60-step run cannot
pay back. Here the iteration and its Adam step are exported once as a function of tensors only
(``IterationGraph``: weights, Adam's moments, window, M^cur and the Bernoulli uniforms in; the updated weights and
moments, the losses, the plain pass's attention and the masks out; the window length T dynamic in [2, window]),
compiled to a shared library and stored under ``cache_dir()/compiled`` (``package_path``); a run loads it in
milliseconds (``load``). Server workers forked from the process that loaded it share it. Measured:
``benchmarks/fedtsa_levers.py`` (one round) and ``benchmarks/fedtsa_speed_target.py`` (a 60-step run).

What a package is keyed by (``package_key``): the torch version, the processor (``cpu_signature``), the source of
every module the iteration runs (``SOURCES``), the strategy options that the graph bakes in (variant, lambda, mask
mode, M^cur source, bias), the number of clients N, the indicator dimension D, the window and the dtype. A change to
any of them builds a new package; a stale one is never loaded (old ones stay on disk, ~2 MB each).

Which iterations compile: those with no random draw inside (the paper's Bernoulli masks drawn up front, or no
augmentation); the code's counted masks draw from a generator every iteration and stay eager, as does a window of
one step (the run's first round). Certified equal to the eager iteration in float64 (W, losses to rtol 1e-9, masks
exactly: ``tests/test_oracle_ts_block.py``).
"""
from __future__ import annotations

import copy
import fcntl
import hashlib
import logging
import os
import platform
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Optional, Tuple

import torch
from torch import nn

from .ts_block import TSBlock

if TYPE_CHECKING:
    from .fedtsa import FedTSA

log = logging.getLogger(__name__)

PACKAGE_FORMAT = 1
MIN_WINDOW = 2  # a one-step window runs eagerly (export specialises a dimension of size 1)
_HERE = Path(__file__).resolve().parent
SOURCES = (_HERE / "ts_block.py", _HERE / "fedtsa.py", Path(__file__).resolve())
# the strategy attributes the exported graph bakes in as constants
BAKED = ("variant", "lam", "mask_mode", "graph_on", "bias", "augmentation", "edge_drop", "edge_add", "temporal_drop")
_loaded: Dict[str, Callable[..., Any]] = {}
_failed: Dict[str, str] = {}


def compilable(strategy: "FedTSA", x: torch.Tensor) -> bool:
    """Whether this iteration has an ahead-of-time form: one round (not a block of rounds) on a CPU, a window of at
    least ``MIN_WINDOW`` steps, and no random draw inside the iteration (Bernoulli masks drawn up front, or none)."""
    augmented = strategy.augment and strategy.lam > 0
    return (x.dim() == 3 and x.device.type == "cpu" and MIN_WINDOW <= x.shape[0] <= strategy.window
            and (not augmented or strategy.augmentation == "bernoulli"))


def package_key(strategy: "FedTSA", n_clients: int, dim: int, dtype: torch.dtype) -> str:
    """The digest that names a package: torch version, the iteration's source, the baked options, N, D, window,
    dtype (see the module doc)."""
    h = hashlib.sha256(f"ftta-fedtsa-iteration/{PACKAGE_FORMAT}/{torch.__version__}/{cpu_signature()}/"
                       f"{source_digest(SOURCES)}".encode())
    options = {name: getattr(strategy, name) for name in BAKED}
    h.update(repr((sorted(options.items()), n_clients, dim, strategy.window, str(dtype))).encode())
    return h.hexdigest()[:20]


@lru_cache(maxsize=None)
def source_digest(paths: Tuple[Path, ...]) -> str:
    """A digest of the modules the iteration runs, read once per process: first at import (below), when they are
    the code this process runs, so that a file edited while a run goes on cannot name a package built from the code
    in memory."""
    h = hashlib.sha256()
    for path in paths:
        h.update(path.read_bytes())
    return h.hexdigest()


source_digest(SOURCES)  # pinned at import


@lru_cache(maxsize=1)
def cpu_signature() -> str:
    """What the compiled code assumes of the processor: the machine, ATen's vector capability and a digest of the
    CPU's feature flags (Linux). A cache shared between different machines (a home folder on a cluster) then holds
    one package per kind of CPU, and none is loaded on a CPU whose instructions it may not have."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line for line in fh if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    digest = hashlib.sha256(" ".join(sorted(flags.split(":", 1)[-1].split())).encode()).hexdigest()[:12]
    return f"{platform.machine()}/{torch.backends.cpu.get_cpu_capability()}/{digest}"


def package_path(key: str) -> Path:
    """Where the package of ``key`` lives: ``cache_dir()/compiled/fedtsa-<key>.pt2``."""
    from ..data.root import cache_dir

    return cache_dir() / "compiled" / f"fedtsa-{key}.pt2"


class IterationGraph(nn.Module):
    """One server iteration and its Adam step as a function of tensors only, what ``torch.export`` traces.

    In: the Q/K weights, bias (or None), Adam's first and second moments of each, Adam's (step size, sqrt of the
    second bias correction) for this step [2] (float64, computed on the host as ``torch.optim.Adam`` does), X [T, N,
    D], M^cur [N, N], this iteration's temporal and spatial uniforms (or None). Out: the updated weights and bias,
    their moments, loss, regularization, robustness, the plain pass's spatial and temporal attention (before the
    update), M^cur, M^tem, M^spa; absent entries as empty tensors (``CompiledRound`` restores them)."""

    def __init__(self, strategy: "FedTSA", dim: int) -> None:
        super().__init__()
        self.strategy = strategy
        self.block = TSBlock(dim, temporal=strategy.temporal, bias=strategy.bias)

    def forward(self, weight: torch.Tensor, bias: Optional[torch.Tensor], moments: Tuple[torch.Tensor, ...],
                adam: torch.Tensor, x: torch.Tensor, indicator_mask: torch.Tensor, temporal_u: Optional[torch.Tensor],
                spatial_u: Optional[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
        block = _with_weights(self.block, weight, bias)
        loss, loss_reg, loss_rob, out, used = self.strategy._iteration(block, x, indicator_mask, None, temporal_u,
                                                                       spatial_u)
        params = [(weight, block.qk_weight.grad)] + ([] if bias is None else [(bias, block.qk_bias.grad)])
        updated, new_moments = [], []
        for (param, grad), m, v in zip(params, moments[0::2], moments[1::2]):
            param, m, v = adam_step(param, grad, m, v, adam)
            updated.append(param)
            new_moments += [m, v]
        empty = x.new_zeros(0)
        return (updated[0], empty if bias is None else updated[1], *new_moments, loss, loss_reg, loss_rob,
                out.spatial_attention, empty if out.temporal_attention is None else out.temporal_attention,
                *(empty if m is None else m for m in used))


BETAS, EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults, which the eager round uses


def adam_step(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
              adam: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of ``torch.optim.Adam`` (no weight decay, no amsgrad), out of place, in its order of operations:
    m <- lerp(m, g, 1 - b1); v <- b2 v + (1 - b2) g^2; p <- p - step_size * m / (sqrt(v) / bc2_sqrt + eps), with
    ``adam`` = (step_size, bc2_sqrt) of this step."""
    m = torch.lerp(m, grad, 1 - BETAS[0])
    v = v * BETAS[1] + grad * grad * (1 - BETAS[1])
    denom = v.sqrt() / adam[1] + EPS
    return param - adam[0] * (m / denom), m, v


def adam_scalars(step: int, lr: float) -> torch.Tensor:
    """(step size, sqrt of the second bias correction) of Adam's ``step``-th update (from 1), as torch computes them
    on the host."""
    bias_correction1 = 1 - BETAS[0] ** step
    bias_correction2 = 1 - BETAS[1] ** step
    return torch.tensor([lr / bias_correction1, bias_correction2 ** 0.5], dtype=torch.float64)


def _with_weights(block: TSBlock, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> TSBlock:
    """A shallow copy of ``block`` whose Q/K weights (and bias) are the given tensors (plain attributes, so that
    ``backward_passes`` sets their ``.grad`` and export sees them as inputs, not constants)."""
    view = copy.copy(block)
    view._parameters = {k: v for k, v in block._parameters.items() if k not in ("qk_weight", "qk_bias")}
    view.qk_weight = weight
    view.qk_bias = bias
    return view


class _Output:
    """What the eager iteration's ``pass_output(0)`` gives the round: the plain pass's attention."""

    def __init__(self, spatial: torch.Tensor, temporal: Optional[torch.Tensor]) -> None:
        self.spatial_attention, self.temporal_attention = spatial, temporal


class CompiledRound:
    """A round's iterations through the compiled package: holds the weights and Adam's moments between calls
    (``step``) and writes the trained weights back into the block (``finish``)."""

    def __init__(self, fn: Callable[..., Any], block: TSBlock, lr: float) -> None:
        self.fn, self.block, self.lr, self.steps = fn, block, lr, 0
        self.weight = block.qk_weight.detach().clone()
        self.bias = None if block.qk_bias is None else block.qk_bias.detach().clone()
        params = [self.weight] + ([] if self.bias is None else [self.bias])
        self.moments = tuple(torch.zeros_like(p) for p in params for _ in range(2))

    def step(self, x: torch.Tensor, indicator_mask: torch.Tensor, temporal_u: Optional[torch.Tensor],
             spatial_u: Optional[torch.Tensor]) -> Tuple[Any, ...]:
        """One iteration and its Adam update; returns what ``FedTSA._iteration`` returns (attention before the
        update)."""
        self.steps += 1
        out = self.fn(self.weight, self.bias, self.moments, adam_scalars(self.steps, self.lr), x, indicator_mask,
                      temporal_u, spatial_u)
        k = len(self.moments)
        weight, bias, self.moments = out[0], out[1], tuple(out[2:2 + k])
        self.weight, self.bias = weight, None if self.bias is None else bias
        loss, loss_reg, loss_rob, att_s, att_t, current, tmask, smask = out[2 + k:]
        present = lambda t: t if t.numel() else None  # noqa: E731
        return loss, loss_reg, loss_rob, _Output(att_s, present(att_t)), (current, present(tmask), present(smask))

    def finish(self) -> None:
        """The trained weights into the block (as the eager round leaves them)."""
        with torch.no_grad():
            self.block.qk_weight.copy_(self.weight)
            if self.bias is not None:
                self.block.qk_bias.copy_(self.bias)


def _example(strategy: "FedTSA", n: int, dim: int, dtype: torch.dtype) -> Tuple[Any, ...]:
    """Example inputs of the full window's shapes (values do not matter: the graph has no data-dependent branch)."""
    t = strategy.window
    block = TSBlock(dim, temporal=strategy.temporal, bias=strategy.bias).to(dtype)
    augmented = strategy.augment and strategy.lam > 0
    temporal_u = (torch.rand(n, t, t, dtype=torch.float64) if augmented and strategy.temporal else None)
    spatial_u = torch.rand(n, n, dtype=torch.float64) if augmented else None
    state = CompiledRound(lambda *a: None, block, strategy.lr)
    return (state.weight, state.bias, state.moments, adam_scalars(1, strategy.lr), torch.rand(t, n, dim, dtype=dtype),
            torch.eye(n, dtype=torch.bool), temporal_u, spatial_u)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run the block below with one intra-op thread (then restore the caller's count). A TS-Block round is too small
    to gain from a second thread (0.70 vs 0.66-0.72 s per round, benchmarks/README.md), and float sums split over
    threads round differently: with one thread, W is the same bit for bit whatever thread count the run uses and
    whether the round runs in its step or ahead on a server thread."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build(strategy: "FedTSA", n: int, dim: int, dtype: torch.dtype, path: Path) -> None:
    """Export the iteration (T dynamic in [MIN_WINDOW, window]) and compile it into the package ``path`` (written
    to a temporary name, then renamed: a reader never sees half a package). Always with one torch thread: inductor
    bakes the thread count into its loops (OpenMP pragmas), so a package built under two threads would split its
    reductions differently; built under one, a round is the same single-threaded computation wherever it runs."""
    with one_torch_thread():
        _build(strategy, n, dim, dtype, path)


def _build(strategy: "FedTSA", n: int, dim: int, dtype: torch.dtype, path: Path) -> None:
    from torch.export import Dim

    args = _example(strategy, n, dim, dtype)
    steps = Dim("t", min=MIN_WINDOW, max=max(strategy.window, MIN_WINDOW + 1))
    dynamic = ({}, None if args[1] is None else {}, tuple({} for _ in args[2]), {}, {0: steps}, {},
               None if args[6] is None else {1: steps, 2: steps}, None if args[7] is None else {})
    graph = IterationGraph(strategy, dim).to(dtype)
    exported = torch.export.export(graph, args, dynamic_shapes=dynamic, strict=False)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.pt2")
    try:
        torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: Path) -> Callable[..., Any]:
    """A package's compiled iteration, called with ``IterationGraph.forward``'s arguments; it returns the flat
    tuple of outputs. Loaded with AOTInductor's C++ package loader, without importing ``torch._inductor`` (~1.5 s) and
    without re-reading the call's tree spec at every call, as ``torch._inductor.aoti_load_package``'s wrapper does:
    the inputs are flattened here in the order export flattened them (tensors only, None left out)."""
    loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)

    def call(*args: Any) -> Tuple[torch.Tensor, ...]:
        flat = [t for a in args for t in (a if isinstance(a, tuple) else (a,)) if t is not None]
        return tuple(loader.boxed_run(flat))

    return call


def iteration_for(strategy: "FedTSA", x: torch.Tensor) -> Optional[Callable[..., Any]]:
    """The compiled iteration for ``strategy`` on windows like ``x`` [T, N, D]: loaded from its package (built
    first if there is none, under a file lock so that concurrent runs build it once), kept per process; None when
    it cannot be built here (no C++ compiler, an operator export does not know): logged once, and the caller runs
    the eager iteration."""
    key = package_key(strategy, x.shape[1], x.shape[2], x.dtype)
    if key in _loaded:
        return _loaded[key]
    if key in _failed:
        return None
    path = package_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                log.info("building FedTSA's compiled server iteration (once per machine): %s", path.name)
                build(strategy, x.shape[1], x.shape[2], x.dtype, path)
        _loaded[key] = load(path)
    except Exception as err:  # noqa: BLE001 - any build failure: the same computation, eager
        _failed[key] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        log.warning("the FedTSA iteration did not compile (%s); running it eagerly (FTTA_COMPILE=0 skips "
                    "compiling)", _failed[key])
        return None
    return _loaded[key]


def compiled_round(strategy: "FedTSA", block: TSBlock, x: torch.Tensor) -> Optional[CompiledRound]:
    """The round of ``block`` on X [T, N, D] through the compiled package, or None where there is none."""
    fn = iteration_for(strategy, x) if compilable(strategy, x) else None
    return None if fn is None else CompiledRound(fn, block, strategy.lr)
