"""FedTSA / TSA (Zhang et al., KDD 2024): collaboration weights from a temporal-spatial attention block trained on
the server each round on a bounded memory of the clients' source-feature indicators.

Where we differ from the paper (also listed in ``notebooks/11_fedtsa_ablations.ipynb``):

- Eq. 18 with squared norms: the loss is ``MSE(X_TSA, X) + lam * MSE(X_TSA, X_TSA')`` (``round_mse``), as in the
  authors' code (``F.mse_loss``); the paper writes unsquared norms.
- One spatial mask for the whole window: the augmented pass masks the spatial attention of all T steps with one
  [N, N] mask M^spa, sampled from the current step's spatial attention and M^cur (``FedTSA._masks``); Eq. 17 indexes
  the mask by step (M^spa_t). The authors' code does the same as ours (its [N, N] mask broadcasts over T).
- Variant 'S-sim': W = row softmax of the cosine similarity of the current indicators, untrained. The FedCTTA
  authors' fork of the FedTSA code (rajibrhasan/FedCTTA, ``S_similarity``) uses the untrained, identity-initialised
  spatial attention instead: the row softmax of x_i . x_j / sqrt(D) of the current indicators (not cosines).
- ``augmentation='count'`` adds ``int(non_edges * edge_add)`` non-edges with ``edge_add = 0.2``. The authors' code
  computes that share as ``1 - 0.8`` (0.19999999999999996), so it adds one edge fewer whenever the number of
  non-edges is a multiple of 5; we do not reproduce this artefact. The default (paper) augmentation is 'bernoulli',
  where no count is involved.
"""
from __future__ import annotations

import copy
import logging
import os
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..validation import check_choice
from ..rng import torch_generator
from .base import Scheduled, ServerInputs, Strategy, cosine_from_gram, gram_matrix, row_softmax
from .fedtsa_compiled import compilable, compiled_round, iteration_for, one_torch_thread
from .ts_block import (AUGMENTATIONS, MASK_MODES, TSBlock, TSBlockOutput, bernoulli_uniforms,
                       sample_spatial_mask, sample_temporal_mask, similarity_mask)

# Fig. 3 ablations: name -> (trained, temporal module, augmentation)
VARIANTS = {"full": (True, True, True), "w/o time": (True, False, True), "w/o aug": (True, True, False),
            "S-sim": (False, False, False), "TS-sim": (False, True, False)}
SELECTIONS = ("final", "best")
GRAPH_SOURCES = ("indicator", "temporal")

log = logging.getLogger(__name__)


def variant_name(name: str) -> str:
    """The canonical Fig. 3 name for ``name`` ('wo_time', 'w/o-time', 'ts_sim', ... are accepted)."""
    key = "".join(ch for ch in name.lower() if ch.isalnum())
    for canonical in VARIANTS:
        if "".join(ch for ch in canonical.lower() if ch.isalnum()) == key:
            return canonical
    raise ValueError(f"variant must be one of {list(VARIANTS)}, got {name!r}")


class IndicatorMemory:
    """The server's memory bank P, bounded: a ring buffer of the last ``window`` indicator uploads [T, N, D], kept
    on the device of the first upload (so on a GPU the TS-Block trains there too)."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.clear()

    def clear(self) -> None:
        """Forget every stored step."""
        self.buffer: Optional[torch.Tensor] = None  # [T, N, D]
        self.steps = torch.full((self.window,), -1, dtype=torch.long)  # step id of each slot
        self.count = 0  # uploads pushed since the last clear

    def __len__(self) -> int:
        return min(self.count, self.window)

    def push(self, step: int, indicators: torch.Tensor, valid: Optional[torch.Tensor] = None) -> None:
        """Store this step's indicators [N, D]; a rejected or non-finite row repeats its previous row (or 0)."""
        x = indicators.detach().float()
        if self.buffer is not None:
            x = x.to(self.buffer.device)
        ok = torch.isfinite(x).all(1)
        if valid is not None:
            ok &= valid.to(x.device).bool()
        if self.buffer is None:
            self.buffer = torch.zeros((self.window, *x.shape), device=x.device)
        elif self.buffer.shape[1:] != x.shape:
            raise ValueError(f"indicators have shape {tuple(x.shape)}, memory holds {tuple(self.buffer.shape[1:])}; "
                             "call reset() before changing the number of clients or features")
        previous = self.latest() if self.count else torch.zeros_like(x)
        slot = self.count % self.window
        self.buffer[slot] = torch.where(ok[:, None], x, previous)
        self.steps[slot] = int(step)
        self.count += 1

    def _order(self) -> torch.Tensor:
        n = len(self)
        start = self.count % self.window if self.count >= self.window else 0
        return (start + torch.arange(n)) % self.window

    def latest(self) -> torch.Tensor:
        """The most recent indicators [N, D]."""
        if not self.count:
            raise ValueError("the memory is empty")
        return self.buffer[(self.count - 1) % self.window]

    def ordered(self) -> torch.Tensor:
        """The stored steps, oldest first: X [min(count, T), N, D] (a copy)."""
        if self.buffer is None:
            raise ValueError("the memory is empty")
        return self.buffer[self._order().to(self.buffer.device)].clone()

    def ordered_steps(self) -> np.ndarray:
        """Step ids of ``ordered()``, oldest first."""
        return self.steps[self._order()].numpy().copy()

    def state_dict(self) -> dict:
        """Copies of the buffer, slot step ids and count."""
        return {"window": self.window, "count": self.count, "steps": self.steps.clone(),
                "buffer": None if self.buffer is None else self.buffer.clone()}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict`` (the window length must match)."""
        if int(state["window"]) != self.window:
            raise ValueError(f"saved memory has window {state['window']}, this one {self.window}")
        self.count = int(state["count"])
        self.steps = state["steps"].clone()
        self.buffer = None if state["buffer"] is None else state["buffer"].clone()


@dataclass
class FedTSADiagnostics:
    """What the last server round computed (replaced every round, so it never grows)."""

    step: int
    window_steps: np.ndarray  # step ids in the window, oldest first [T']
    weights: torch.Tensor  # W_t [N, N]
    spatial_attention: Optional[torch.Tensor]  # selected, unmasked softmax(A^(S)) [T', N, N]
    temporal_attention: Optional[torch.Tensor]  # selected, unmasked softmax(A^(T)) [N, T', T']
    current_mask: torch.Tensor  # M^cur [N, N] (Eq. 15)
    spatial_mask: Optional[torch.Tensor]  # last sampled M^spa [N, N]
    temporal_mask: Optional[torch.Tensor]  # last sampled M^tem [N, T', T']
    loss: np.ndarray  # L_tsa per server iteration [server_steps]
    loss_regularization: np.ndarray  # MSE(X_TSA, X) per iteration
    loss_robustness: np.ndarray  # MSE(X_TSA, X_TSA') per iteration (zeros without augmentation)
    selected_iteration: int  # iteration whose attention gave W (-1: after the last update / untrained)
    seconds: float  # wall time of this server round (of its computation on a server thread when computed ahead)


def _on_cpu(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.cpu()


def _on_device(t: Optional[torch.Tensor], device: torch.device) -> Optional[torch.Tensor]:
    return None if t is None else t.to(device)


def detached_attention(out: TSBlockOutput) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Detached copies of a pass's (spatial [T, N, N], temporal [N, T, T] or None) attention."""
    temporal = None if out.temporal_attention is None else out.temporal_attention.detach().clone()
    return out.spatial_attention.detach().clone(), temporal


def round_mse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The mean squared error of one round's windows [T, N, D] (a scalar), or of each of R rounds [R, T, N, D] ([R])."""
    if a.dim() == 3:
        return F.mse_loss(a, b)
    return F.mse_loss(a, b, reduction="none").flatten(1).mean(1)


class _IterationMasks:
    """M^cur, M^tem, M^spa of one server iteration's augmented pass, sampled from the plain pass's (detached)
    attention when ``TSBlock.forward_passes`` asks (``ts_block.Augmentation``): the temporal mask first, then the
    spatial one, from ``generator`` or this iteration's pre-drawn Bernoulli ``uniforms`` (temporal, spatial).
    ``indicator_mask`` is M^cur of the raw current indicators (it does not change between iterations)."""

    def __init__(self, strategy: "FedTSA", indicator_mask: torch.Tensor, generator: Optional[torch.Generator],
                 uniforms: Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]) -> None:
        self.strategy, self.generator, self.uniforms = strategy, generator, uniforms
        self.current = indicator_mask
        self.temporal_mask: Optional[torch.Tensor] = None
        self.spatial_mask: Optional[torch.Tensor] = None

    def temporal(self, attention: torch.Tensor) -> Optional[torch.Tensor]:
        s = self.strategy  # the masks are drawn on the CPU generator (same draws on every device)
        mask = sample_temporal_mask(attention, self.generator, s.augmentation, s.temporal_drop,
                                    uniform=self.uniforms[0])
        self.temporal_mask = _on_device(mask, attention.device)
        return self.temporal_mask

    def spatial(self, attention: torch.Tensor, temporal_output: torch.Tensor) -> torch.Tensor:
        s = self.strategy
        if s.graph_on == "temporal":
            self.current = similarity_mask(temporal_output[-1])
        mask = sample_spatial_mask(attention[..., -1, :, :], self.current, self.generator, s.augmentation,
                                   s.edge_drop, s.edge_add, uniform=self.uniforms[1])
        self.spatial_mask = mask.to(attention.device)
        return self.spatial_mask


# rounds per batch when ``rounds_per_batch`` is left to the device: batched rounds are what a GPU needs (one round
# is launch-bound there); on a CPU they are no faster than separate rounds (benchmarks/README.md)
AUTO_ROUNDS_PER_BATCH = {"cpu": 1, "cuda": 64}

# A server iteration (both passes, the masks, L_tsa and its hand gradient) can run compiled ahead of time
# (``fedtsa_compiled``: torch.export + AOTInductor, one package per machine and configuration, loaded in
# milliseconds): W equal to the eager iteration's up to float rounding (tests/test_oracle_ts_block.py, float64);
# its speed per round and the package's build and load times: benchmarks/results/fedtsa_levers_cpu.md. Building a
# package needs a C++ compiler and takes seconds, once, so by default ('auto') a CPU run uses it only when it has
# ``COMPILE_MIN_ROUNDS`` rounds or more (``expect_rounds``: a protocol run or a benchmark, not a test or a smoke
# run); whether a run compiles depends on its length only, never on what the cache holds, so the same run gives the
# same numbers on a fresh machine. FTTA_COMPILE=1 always, 0 never. A build that fails falls back to the eager
# iteration with one warning.
COMPILE_ENV = "FTTA_COMPILE"
COMPILE_MIN_ROUNDS = 50


def compile_wanted(rounds: Optional[int]) -> bool:
    """Whether a run of ``rounds`` rounds (its stop step, ``expect_rounds``; None: not said) compiles its iteration
    (``$FTTA_COMPILE``: '1', '0' or 'auto', the default)."""
    mode = os.environ.get(COMPILE_ENV, "auto")
    if mode not in ("0", "1", "auto"):
        raise ValueError(f"${COMPILE_ENV} must be 0, 1 or auto, got {mode!r}")
    return mode == "1" or (mode == "auto" and rounds is not None and rounds >= COMPILE_MIN_ROUNDS)


class FedTSA(Scheduled, Strategy):
    """W_t = the spatial attention of a TS-Block over the last T indicator steps, trained with L_tsa (Eq. 18).

    Each round: push the indicators (batch mean of the source model's penultimate features) into the memory bank,
    build a fresh identity-initialised TS-Block (or keep last round's, ``warm_start``), train it for
    ``server_steps`` Adam steps on ``MSE(X_TSA, X) + lam * MSE(X_TSA, X_TSA')`` where X_TSA' is the pass under the
    heterogeneity-aware masks (resampled every iteration from the current attention), and return the unmasked
    spatial attention at the current step. Defaults are the paper's (T=10, lambda=1, lr 1e-3, Bernoulli masks,
    the attention after the last update); the published code's choices are options: ``window=5, lam=0.1, lr=1e-4,
    augmentation='count', select='best', bias=True`` (its internal version: window 10, lam 0.5).

    Parameters: ``window`` T (steps kept in the memory bank and fed to the block; fewer at the start);
    ``lam`` lambda of Eq. 18; ``lr`` Adam learning rate; ``server_steps`` Adam steps per round; ``augmentation``
    'bernoulli' (paper: entries kept with probability = attention) or 'count' (code: fixed numbers drawn without
    replacement, ``temporal_drop`` of the T*T temporal entries, ``edge_drop`` of the M^cur edges, ``edge_add`` of
    its non-edges); ``mask_mode`` 'exclude' (masked scores -> -inf, code) or 'hadamard' (Eqs. 16-17 literally);
    ``select`` 'final' (attention after the last update, paper) or 'best' (attention of the lowest-loss iteration,
    code); ``graph_on`` M^cur from the raw current indicators (Eq. 15) or from the temporal-attention output at
    the current step (the code's default branch); ``bias`` learnable Q/K biases (code); ``warm_start`` keep the
    block between rounds (a fresh Adam each round) instead of a fresh identity-initialised block (paper, code);
    ``seed`` mask draws come from ``torch_generator(seed, 'fedtsa', step)``.

    Variants (Fig. 3): 'full'; 'w/o time' (no temporal module; the spatial block still trains on the T-step window);
    'w/o aug' (lam = 0); 'S-sim' (W = row-softmax of the cosine similarity of the current indicators, untrained);
    'TS-sim' (the identity-initialised TS-Block, untrained). ``last_diagnostics`` holds the last round's internals.

    Rounds ahead: W_t depends only on the memory window, i.e. on the frozen source model's indicators (and on which
    clients reported), not on the adapted clients, and each round starts from the identity block with its own
    generator. So unless ``warm_start``, the engine can hand the server the indicators of the next steps
    (``Engine.prefetch``) and the rounds run on server threads while the clients adapt (``plan_rounds``). When its
    step comes, a planned round is used only if its window equals the memory's (else it is recomputed and the rest
    of the plan redone, e.g. after a rejected upload), so W is bit for bit the W of computing each round in turn.
    ``rounds_per_batch`` R > 1 trains up to R planned rounds with windows of one shape as one block of R rounds
    (``TSBlock(rounds=R)``; ``batched_rounds`` variants only): the same computation batched, so W equals that of
    separate rounds up to float rounding (batched matmuls may sum in another order; on this CPU they often match
    bit for bit, not always).
    0 (default) picks by device: 1 on a CPU, where batching is no faster, 64 on a GPU, where a single round is a
    few hundred tiny kernel launches per iteration (``AUTO_ROUNDS_PER_BATCH``).
    """

    name = "fedtsa"
    needs = ("indicator",)

    def __init__(self, window: int = 10, lam: float = 1.0, lr: float = 1e-3, server_steps: int = 100,
                 augmentation: str = "bernoulli", temporal_drop: float = 0.75, edge_drop: float = 0.8,
                 edge_add: float = 0.2, variant: str = "full", mask_mode: str = "exclude", select: str = "final",
                 graph_on: str = "indicator", bias: bool = False, warm_start: bool = False, seed: int = 0,
                 rounds_per_batch: int = 0) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if lam < 0:
            raise ValueError(f"lam must be >= 0, got {lam}")
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if server_steps < 0:
            raise ValueError(f"server_steps must be >= 0, got {server_steps}")
        if rounds_per_batch < 0:
            raise ValueError(f"rounds_per_batch must be >= 0 (0: by device), got {rounds_per_batch}")
        check_choice("augmentation", augmentation, AUGMENTATIONS)
        for label, rate in (("temporal_drop", temporal_drop), ("edge_drop", edge_drop), ("edge_add", edge_add)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{label} must be in [0, 1], got {rate}")
        check_choice("mask_mode", mask_mode, MASK_MODES)
        check_choice("select", select, SELECTIONS)
        check_choice("graph_on", graph_on, GRAPH_SOURCES)
        self.variant = variant_name(variant)
        self.trained, self.temporal, self.augment = VARIANTS[self.variant]
        self.window, self.lam, self.lr, self.server_steps = int(window), float(lam), float(lr), int(server_steps)
        self.augmentation, self.temporal_drop, self.edge_drop, self.edge_add = (augmentation, temporal_drop,
                                                                                edge_drop, edge_add)
        self.mask_mode, self.select, self.graph_on, self.bias = mask_mode, select, graph_on, bias
        self.warm_start, self.seed, self.rounds_per_batch = warm_start, int(seed), int(rounds_per_batch)
        self.memory = IndicatorMemory(self.window)
        self.block: Optional[TSBlock] = None  # one block object, re-initialised each round unless warm_start
        self.last_diagnostics: Optional[FedTSADiagnostics] = None
        # rounds computed ahead (only when each round is independent of the last: a trained, fresh block)
        self.lookahead = ("indicator",) if self.trained and self.server_steps and not warm_start else ()
        self._ahead: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}  # step -> (indicators, present) not yet served
        self._plan: Optional[IndicatorMemory] = None  # the memory as the planned steps will leave it
        self._pending: Dict[int, Tuple[torch.Tensor, Future]] = {}  # step -> (planned window, its round)
        self._submit: Optional[Callable[..., Future]] = None
        self._worker_copy: Optional["FedTSA"] = None  # what a server worker gets (``_worker``)
        self.compiled = compile_wanted(None)  # iterations through the compiled package (``_train``)

    # ------------------------------------------------------------------ engine interface

    def reset(self, n_clients: int) -> None:
        super().reset(n_clients)
        self.memory.clear()
        self.block = None
        self.last_diagnostics = None
        self._drop_plan()

    def collaboration(self, inputs: ServerInputs) -> torch.Tensor:
        start = time.perf_counter()
        if "indicator" not in inputs.uploads:
            raise KeyError("FedTSA needs the 'indicator' upload")
        self.memory.push(inputs.step, inputs.uploads["indicator"], inputs.valid)
        x = self.memory.ordered()  # X [T', N, D], oldest first
        planned = self._planned_round(inputs.step, x)
        if planned is not None:
            planned.step, planned.window_steps = inputs.step, self.memory.ordered_steps()
            self.last_diagnostics = planned
            return planned.weights
        current = x[-1]
        if self.variant == "S-sim":
            weights = row_softmax(cosine_from_gram(gram_matrix([current]))).float().cpu()
            self.last_diagnostics = FedTSADiagnostics(
                inputs.step, self.memory.ordered_steps(), weights, None, None, similarity_mask(current).cpu(), None,
                None,
                np.zeros(0), np.zeros(0), np.zeros(0), -1, time.perf_counter() - start)
            return weights
        with one_torch_thread():  # as on a server thread: W does not depend on the caller's thread count
            diag = self._train_block(x, torch_generator(self.seed, "fedtsa", inputs.step))
        diag.step, diag.window_steps = inputs.step, self.memory.ordered_steps()
        diag.seconds = time.perf_counter() - start
        self.last_diagnostics = diag
        return diag.weights

    # ------------------------------------------------------------------ rounds ahead

    def plan_chunk(self, device: torch.device | str) -> int:
        """Steps to hand over at once: the rounds of one batch (``rounds_per_batch``, by default by ``device``)."""
        if self.rounds_per_batch:
            return self.rounds_per_batch
        return AUTO_ROUNDS_PER_BATCH.get(torch.device(device).type, 1)

    def plan_rounds(self, steps: Sequence[int], uploads: Dict[str, torch.Tensor], present: torch.Tensor,
                    submit: Callable[..., Future]) -> None:
        """Start the rounds of ``steps`` on server threads from their indicators [S, N, D] (see the class doc)."""
        if not self.lookahead:
            return
        self._submit = submit
        self._warm_compiled(uploads["indicator"][0])
        for i, step in enumerate(steps):
            self._ahead[int(step)] = (uploads["indicator"][i], present[i])
        self._start([int(step) for step in steps])

    def _start(self, steps: Sequence[int]) -> None:
        """Push ``steps``' indicators into the plan (a copy of the memory at first) and submit their rounds: one
        batch per run of consecutive steps whose windows have the same shape, at most ``plan_chunk`` rounds each."""
        if self._plan is None:
            self._plan = IndicatorMemory(self.window)
            self._plan.load_state_dict(self.memory.state_dict())
        batch: List[Tuple[int, torch.Tensor]] = []
        for step in steps:
            indicators, present = self._ahead[step]
            self._plan.push(step, indicators, present)
            window = self._plan.ordered()
            per_batch = self.plan_chunk(window.device) if self.batched_rounds else 1
            if batch and (len(batch) >= per_batch or batch[-1][1].shape != window.shape):
                self._submit_batch(batch)
                batch = []
            batch.append((step, window))
        if batch:
            self._submit_batch(batch)

    def expect_rounds(self, rounds: int) -> None:
        """Compile the iteration when the run is long enough for the compile to pay (``compile_wanted``)."""
        self.compiled = compile_wanted(rounds) and self.trained and self.server_steps > 0
        self._worker_copy = None

    def _warm_compiled(self, indicators: torch.Tensor) -> None:
        """With ``compiled`` on: load (or build) the compiled iteration in this process before the first round goes
        to a server worker, so that forked workers share it instead of each loading its own."""
        if not self.compiled:
            return
        window = indicators.expand(self.window, *indicators.shape)
        if compilable(self, window):
            iteration_for(self._worker(), window)

    def _worker(self) -> "FedTSA":
        """This strategy's parameters without its run's state (memory, plan, pending rounds, the pool's submit):
        what ``_rounds`` reads, and all that goes to a server worker process (pickled once per job, a few hundred
        bytes beside the windows)."""
        if self._worker_copy is None:
            worker = copy.copy(self)
            worker.memory, worker.block, worker.last_diagnostics = IndicatorMemory(self.window), None, None
            worker._ahead, worker._plan, worker._pending, worker._submit, worker._worker_copy = {}, None, {}, None, None
            self._worker_copy = worker
        return self._worker_copy

    def _submit_batch(self, batch: Sequence[Tuple[int, torch.Tensor]]) -> None:
        """Submit the rounds of ``batch`` [(step, window)] as one job; each step's entry points into its result."""
        steps = [step for step, _ in batch]
        future = self._submit(self._worker()._rounds, torch.stack([window for _, window in batch]), steps)
        for i, (step, window) in enumerate(batch):
            self._pending[step] = (window, future, i)

    def _rounds(self, windows: torch.Tensor, steps: Sequence[int]) -> List[FedTSADiagnostics]:
        """The rounds of ``steps`` on their windows [R, T', N, D]: one round on its own identity-initialised block,
        several as one block of R rounds (thread-safe: it shares no module with other rounds)."""
        start = time.perf_counter()
        generators = [torch_generator(self.seed, "fedtsa", step) for step in steps]
        if len(steps) == 1:
            block = TSBlock(windows.shape[-1], temporal=self.temporal, bias=self.bias).to(windows.device)
            diagnostics = [self._train_block(windows[0], generators[0], block)]
        else:
            block = TSBlock(windows.shape[-1], temporal=self.temporal, bias=self.bias,
                            rounds=len(steps)).to(windows.device)
            diagnostics = self._train(windows, generators, block)
        seconds = (time.perf_counter() - start) / len(steps)
        for diag in diagnostics:
            diag.seconds = seconds
        return diagnostics

    def _planned_round(self, step: int, x: torch.Tensor) -> Optional[FedTSADiagnostics]:
        """This step's round if it was planned on the window ``x`` the memory now holds; a plan that differs from
        the memory (an upload rejected, a step not handed over) is cancelled and redone from the memory."""
        for served in [s for s in self._ahead if s <= step]:
            self._ahead.pop(served)
        stale = [self._pending.pop(s)[1] for s in [s for s in self._pending if s < step]]
        live = {id(entry[1]) for entry in self._pending.values()}
        for future in stale:
            if id(future) not in live:  # a batch is cancelled only when none of its steps is still to come
                future.cancel()
        planned = self._pending.pop(step, None)
        if planned is not None and torch.equal(planned[0], x):
            return planned[1].result()[planned[2]]
        if planned is not None or self._pending:
            later = sorted(self._ahead)
            self._drop_plan(keep_ahead=True)
            self._start(later)
        return None

    def _drop_plan(self, keep_ahead: bool = False) -> None:
        """Cancel the planned rounds (and forget the steps handed over unless ``keep_ahead``)."""
        for _, future, _ in self._pending.values():
            future.cancel()
        self._pending.clear()
        self._plan = None
        if not keep_ahead:
            self._ahead.clear()
            self._submit = None  # the pool it belonged to may be gone (the next plan_rounds hands a new one)

    # ------------------------------------------------------------------ the server round

    @property
    def batched_rounds(self) -> bool:
        """Whether rounds can be trained as one block of R rounds: the paper's defaults ('final' selection, M^cur
        from the raw indicators, Bernoulli masks drawn up front or no augmentation); the code's 'best' selection
        and counted masks read values on the host every iteration, so those variants run round by round."""
        augmented = self.augment and self.lam > 0
        return (self.select == "final" and self.graph_on == "indicator"
                and (not augmented or self.augmentation == "bernoulli"))

    def _new_block(self, dim: int, device: torch.device) -> TSBlock:
        """This round's block: last round's with ``warm_start``, else the same object reset to the identity (a fresh
        block's values, without a new module and optimiser-visible parameters each round)."""
        block = self.block
        if block is None or block.dim != dim or block.qk_weight.device != torch.device(device):
            self.block = block = TSBlock(dim, temporal=self.temporal, bias=self.bias).to(device)
        elif not self.warm_start:
            block.reset_parameters()
        return block

    def _iteration(self, block: TSBlock, x: torch.Tensor, indicator_mask: torch.Tensor,
                   generator: Optional[torch.Generator], temporal_u: Optional[torch.Tensor],
                   spatial_u: Optional[torch.Tensor]):
        """One server iteration: the plain pass, the masks and the augmented pass (``TSBlock.forward_passes``: the
        two passes stacked), L_tsa (Eq. 18) (per round [R] for a block of R rounds), and the gradient of L_tsa (of
        the rounds' sum) in the block's ``.grad`` (``TSBlock.backward_passes``; no autograd graph). Returns (loss,
        regularization, robustness, plain pass output, masks (M^cur, M^tem, M^spa))."""
        lam = self.lam if self.augment else 0.0
        masks = _IterationMasks(self, indicator_mask, generator, (temporal_u, spatial_u)) if lam > 0 else None
        with torch.no_grad():
            passes = block.forward_passes(x, mask_mode=self.mask_mode, augment=masks)
            t = x.shape[-3]
            out = passes.output[..., :t, :, :]
            per_element = 2.0 / x[(0,) * (x.dim() - 3)].numel()  # d mean(e^2) / de, per round
            loss_reg = round_mse(out, x)
            grad = torch.empty_like(passes.output)
            torch.mul(out - x, per_element, out=grad[..., :t, :, :])
            loss_rob = torch.zeros(x.shape[:-3], device=x.device, dtype=x.dtype)
            if masks is not None:
                aug = passes.output[..., t:, :, :]
                loss_rob = round_mse(out, aug)
                torch.mul(out - aug, -lam * per_element, out=grad[..., t:, :, :])
                grad[..., :t, :, :] -= grad[..., t:, :, :]
            block.backward_passes(passes, grad)
        used = ((indicator_mask, None, None) if masks is None
                else (masks.current, masks.temporal_mask, masks.spatial_mask))
        return loss_reg + lam * loss_rob, loss_reg, loss_rob, passes.pass_output(0), used

    def _train_block(self, x: torch.Tensor, generator: torch.Generator,
                     block: Optional[TSBlock] = None) -> FedTSADiagnostics:
        """Train a TS-Block (``block``, else this round's ``_new_block``) on X [T', N, D] and return W (the
        diagnostics carry it and the internals)."""
        block = self._new_block(x.shape[-1], x.device) if block is None else block
        return self._train(x, [generator], block)[0]

    def _train(self, x: torch.Tensor, generators: Sequence[torch.Generator], block: TSBlock) -> List[FedTSADiagnostics]:
        """Train ``block`` on one window X [T', N, D] (one generator), or a block of R rounds on windows
        [R, T', N, D] (one generator each, ``batched_rounds`` only); the diagnostics of each round, W included."""
        batched = x.dim() == 4
        if batched and not self.batched_rounds:
            raise ValueError("this FedTSA variant trains its rounds one at a time (see batched_rounds)")
        lam = self.lam if self.augment else 0.0
        steps = self.server_steps if self.trained else 0
        windows = x if batched else x[None]
        indicator_mask = torch.stack([similarity_mask(window[-1]) for window in windows])
        indicator_mask = indicator_mask if batched else indicator_mask[0]
        masks = (indicator_mask, None, None)
        selected = (float("inf"), None, -1)  # (loss, (spatial, temporal) attention, iteration)
        # no host round trip per iteration unless 'best' selection reads the loss: the Bernoulli masks' uniforms
        # are drawn up front from the same CPU generator in the same order (same masks as drawing them one
        # iteration at a time), and the losses stay on the device until the round ends
        predrawn = lam > 0 and self.augmentation == "bernoulli"
        temporal_u, spatial_u = None, None
        if predrawn:
            draws = [bernoulli_uniforms(steps, x.shape[-2], x.shape[-3], self.temporal, generator, x.device)
                     for generator in generators]
            temporal_u = None if draws[0][0] is None else torch.stack([d[0] for d in draws], 1)
            spatial_u = torch.stack([d[1] for d in draws], 1)
            if not batched:
                temporal_u, spatial_u = None if temporal_u is None else temporal_u[:, 0], spatial_u[:, 0]
        losses = np.zeros((3, steps))
        loss_log = []  # per iteration: (loss, regularization, robustness), kept on the device
        generator = generators[0] if lam > 0 and not predrawn else None  # drawn from inside the iteration
        # the iterations and their Adam steps through the compiled package (``fedtsa_compiled``) where it has one
        compiled = compiled_round(self, block, x) if self.compiled and steps and generator is None else None
        optimizer = torch.optim.Adam(block.parameters(), lr=self.lr, fused=True) if steps and compiled is None else None
        for it in range(steps):
            uniforms = (None if temporal_u is None else temporal_u[it], None if spatial_u is None else spatial_u[it])
            if compiled is not None:
                loss, loss_reg, loss_rob, out, masks = compiled.step(x, indicator_mask, *uniforms)
            else:
                loss, loss_reg, loss_rob, out, masks = self._iteration(block, x, indicator_mask, generator, *uniforms)
            loss_log.append(torch.stack([loss, loss_reg, loss_rob]).detach())
            if self.select == "best" and not batched:
                losses[:, it] = loss_log[-1].tolist()  # 'best' reads the loss: one host sync per iteration
                if losses[0, it] < selected[0]:
                    selected = (losses[0, it], detached_attention(out), it)
            if compiled is None:
                optimizer.step()  # on the gradient ``_iteration`` set
        if compiled is not None:
            compiled.finish()
        losses = (torch.stack(loss_log, dim=1).cpu().double().numpy() if steps
                  else np.zeros((3, steps, *x.shape[:-3])))  # [3, steps] or [3, steps, R]
        if selected[1] is None:  # 'final', or untrained: the attention of the block as it is now
            with torch.no_grad():
                selected = (float("nan"), detached_attention(block(x)), -1)
        spatial, temporal = (_on_cpu(a) for a in selected[1])
        masks = tuple(_on_cpu(m) for m in masks)
        if not batched:
            spatial, temporal, losses = spatial[None], None if temporal is None else temporal[None], losses[..., None]
            masks = tuple(None if m is None else m[None] for m in masks)
        diagnostics = []
        for r in range(windows.shape[0]):
            weights = spatial[r, -1].float()
            weights = weights / weights.sum(1, keepdim=True)  # exact row sums after float rounding
            diagnostics.append(FedTSADiagnostics(
                -1, np.zeros(0), weights, spatial[r], None if temporal is None else temporal[r], masks[0][r],
                None if masks[2] is None else masks[2][r], None if masks[1] is None else masks[1][r],
                losses[0, :, r], losses[1, :, r], losses[2, :, r], selected[2], 0.0))
        return diagnostics

    # ------------------------------------------------------------------ memory

    def state_dict(self) -> dict:
        """The memory bank (and the block with ``warm_start``); random draws derive from (seed, step), nothing else."""
        keep = self.warm_start and self.block is not None
        return {"memory": self.memory.state_dict(),
                "block": {k: v.clone() for k, v in self.block.state_dict().items()} if keep else None}

    def load_state_dict(self, state: dict) -> None:
        self._drop_plan()
        self.memory.load_state_dict(state["memory"])
        self.block = None
        if state.get("block") is not None:
            saved = state["block"]
            dim = (saved["qk_weight"] if "qk_weight" in saved else saved["spatial_query.weight"]).shape[1]
            self.block = TSBlock(dim, temporal=self.temporal, bias=self.bias)
            self.block.load_state_dict(state["block"])
