"""The one loop: stream -> local method -> uploads -> strategy W -> mix -> predict -> record.

Each phase of a step runs under a ``torch.profiler.record_function`` label (``ftta.source``, ``ftta.adapt``,
``ftta.uploads``, ``ftta.server``, ``ftta.mix``, ``ftta.predict``; ``ftta.prefetch`` for source passes run ahead),
so a profile of any method says where its time goes (``benchmarks/where_time_goes.py``); without an active
profiler the labels cost about a microsecond each.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import sys
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn
from torch.profiler import record_function

from .rng import torch_generator
from .stream import Stream, StreamBatch
from .strategies.base import (ServerInputs, Strategy, check_collaboration, client_regularizer, lookahead_of,
                               probe_uploads)
from .tta.base import LocalMethod
from .engine.attacks import Attack
from .engine.bank import ClientBank, make_bank
from .engine.mixing import restrict_to_valid
from .engine.source_cache import SourceCache, entry_key, model_digest
from .engine.uploads import UploadGate, UploadPolicy, describe_rejections, reference_values

log = logging.getLogger(__name__)

# how many steps ahead of the current one the engine hands look-ahead strategies their uploads, per server thread
STEPS_AHEAD_PER_THREAD = 4
# server threads on a GPU: they only launch the rounds' kernels (batched, ``Strategy.plan_chunk``)
GPU_SERVER_THREADS = 2


def default_server_threads(device: torch.device | str = "cpu") -> int:
    """Server threads for rounds computed ahead when the run does not say. On a CPU: as many as torch's threads
    (none with one thread, e.g. a run-plan worker); the clients then keep half of them (``Engine.prefetch``): the
    server threads idle once they are ahead, so the cores are shared, not split (on 2 cores: 1.64x over the plain
    run, as 1 + 1; 2 + 2 only 1.29x, benchmarks/README.md). On a GPU: ``GPU_SERVER_THREADS`` whatever torch's
    count (the rounds compute on the GPU; the threads launch them), and the clients keep their threads."""
    if torch.device(device).type == "cuda":
        return GPU_SERVER_THREADS
    threads = torch.get_num_threads()
    return threads if threads >= 2 else 0


SERVER_POOLS = ("thread", "process")
SERVER_POOL_ENV = "FTTA_SERVER_POOL"  # 'thread' or 'process': overrides ``default_server_pool``


def default_server_pool(device: torch.device | str = "cpu") -> str:
    """Where rounds computed ahead run when the engine does not say (``$FTTA_SERVER_POOL`` overrides): on a Linux
    CPU in worker processes, else in threads. A round is ~10,000 small operations, each dispatched under Python's
    GIL, so server threads and the clients' loop queue for it; in processes they run side by side (a 60-step
    FedTSA TTA-bn run on 2 cores: benchmarks/results/fedtsa_speed_target_cpu.md). On a GPU a thread only launches
    the (batched) rounds' kernels, and a process would need its own CUDA context."""
    chosen = os.environ.get(SERVER_POOL_ENV)
    if chosen:
        if chosen not in SERVER_POOLS:
            raise ValueError(f"${SERVER_POOL_ENV} must be one of {SERVER_POOLS}, got {chosen!r}")
        return chosen
    return "process" if torch.device(device).type == "cpu" and _can_fork() else "thread"


def _can_fork() -> bool:
    """Whether worker processes can start by ``fork`` here (Linux). Workers are forked, not spawned: a spawned or
    forkserver worker imports the caller's ``__main__`` again, which re-runs a user's script that has no
    ``if __name__ == "__main__"`` guard; a forked worker starts from this process as it is, and only ever runs
    single-threaded torch code (``_server_worker``). macOS and Windows use threads."""
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def _server_worker() -> None:
    """Initialiser of a server worker (thread or process): one intra-op thread, as every round runs."""
    torch.set_num_threads(1)


def server_pool(kind: str, workers: int, planners: List[Strategy]) -> Tuple[Executor, str]:
    """An executor of ``workers`` for rounds computed ahead, and its kind: forked processes (``_can_fork``) unless
    ``kind`` is 'thread', the platform cannot fork, or a planner cannot be sent to another process (it does not
    pickle: a user's strategy holding a lock, a lambda...), which is logged and served by threads instead. The
    results are the same either way: a round is the same single-threaded computation in any worker (``FedTSA``
    rounds ahead)."""
    if kind == "process" and _can_fork():
        try:
            for planner in planners:
                pickle.dumps(planner)
        except Exception as err:  # noqa: BLE001 - any pickling failure means: not in a process
            log.warning("rounds ahead run in threads: strategy %s cannot be sent to a worker process (%s)",
                        type(planner).__name__, err)
        else:
            return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                       initializer=_server_worker), "process"
    return ThreadPoolExecutor(workers, thread_name_prefix="ftta-server", initializer=_server_worker), "thread"


class SharedPassError(ValueError):
    """Strategies cannot share this local phase (the method trains or carries state, or a strategy regularises)."""


@dataclass
class StepResult:
    """What one step produced for all clients."""

    step: int
    correct_source: np.ndarray
    correct_local: np.ndarray
    correct_mixed: np.ndarray
    n: np.ndarray
    domains: np.ndarray
    weights: np.ndarray
    rejected: np.ndarray
    absent: np.ndarray
    upload_bytes: int
    correct_by_class: Optional[np.ndarray] = None  # [N, K]: correct predictions after mixing, per true class
    n_by_class: Optional[np.ndarray] = None        # [N, K]: samples per true class


@dataclass
class LocalPhase:
    """What the clients computed at one step before talking to the server."""

    batch: StreamBatch
    x: torch.Tensor
    y: torch.Tensor
    source_logits: torch.Tensor
    local_logits: torch.Tensor
    state: Dict[str, torch.Tensor]
    context: Dict[str, torch.Tensor]


@dataclass
class Engine:
    """Runs a local method and a strategy over a stream with a client bank of the chosen backend."""

    source_model: nn.Module
    local: LocalMethod
    strategy: Strategy
    n_clients: int
    backend: str = "vectorized"
    device: str = "cpu"
    participation: float = 1.0
    seed: int = 0
    server_threads: Optional[int] = None  # workers for rounds computed ahead (``prefetch``); 0: none; None: auto
    server_pool: Optional[str] = None  # 'thread' or 'process' workers for those rounds; None: ``default_server_pool``
    upload_policy: Optional[UploadPolicy] = None  # thresholds of the server's upload checks (None: the defaults)
    # the frozen source model's outputs per batch, reused instead of recomputed (``engine.source_cache``; None: none)
    source_cache: Optional[SourceCache] = None
    # clients that lie in their uploads (``engine.attacks``; None: every client honest): their rows are rewritten
    # before the server's checks, at every step
    attack: Optional[Attack] = None
    bank: ClientBank = field(init=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.participation <= 1.0:
            raise ValueError(f"participation must be in (0, 1], got {self.participation}")
        if self.server_threads is not None and self.server_threads < 0:
            raise ValueError(f"server_threads must be >= 0 or None, got {self.server_threads}")
        if self.server_pool is not None and self.server_pool not in SERVER_POOLS:
            raise ValueError(f"server_pool must be one of {SERVER_POOLS} or None, got {self.server_pool!r}")
        if self.attack is not None:
            self.attack.check_clients(self.n_clients)
        self._source_ahead: Dict[int, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # step -> x, logits, ind.
        self._horizon: Optional[int] = None  # first step not yet handed to the look-ahead strategies
        self._rounds_told = False  # whether the look-ahead strategies heard the run's length (``expect_rounds``)
        self._server_pool: Optional[Executor] = None
        self.server_pool_kind = ""  # the kind of workers ``prefetch`` used ('' until it started them)
        self._client_threads: Optional[int] = None  # torch's thread count before ``prefetch`` split the cores
        self.rounds_ahead_threads = 0  # server threads ``prefetch`` used in this engine's run (0: none)
        self.source_model = self.source_model.to(self.device).eval()
        if self.source_cache is not None and self.source_cache.model != model_digest(self.source_model):
            raise ValueError("source_cache holds another model's outputs than this engine's source model")
        trainable = self.local.trainable(self.source_model)
        self.bank = make_bank(self.backend, self.source_model, self.n_clients, trainable, self.local.optimizer())
        self.strategy.reset(self.n_clients)

    @torch.no_grad()
    def _source_forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The source model's logits [N,B,K] and indicator (mean penultimate features) [N,D] on ``x``; from
        ``source_cache`` when it holds this batch (else computed and added to it)."""
        cache = self.source_cache
        key = None
        if cache is not None:
            key = entry_key(x)
            hit = cache.get(x, key)
            if hit is not None:
                return hit
        n, b = x.shape[:2]
        feats = self.source_model.forward_features(x.reshape(n * b, *x.shape[2:]))
        logits, indicator = self.source_model.fc(feats).view(n, b, -1), feats.view(n, b, -1).mean(1)
        if cache is not None:
            cache.put(x, logits, indicator, key)
        return logits, indicator

    def step(self, batch: StreamBatch) -> StepResult:
        """Process one time step for all clients."""
        return self.server_phase(self.local_phase(batch, self.strategy), self.strategy)

    def local_phase(self, batch: StreamBatch, strategy: Strategy) -> "LocalPhase":
        """Source monitor and local adaptation of every client (with ``strategy``'s client regulariser)."""
        x, y = batch.images.to(self.device), batch.labels.to(self.device)
        with record_function("ftta.source"):
            ahead = self._source_ahead.pop(batch.step, None)
            if ahead is not None and torch.equal(ahead[0], x):  # computed by ``prefetch`` on this very batch
                src_logits, src_indicator = ahead[1], ahead[2]
            else:
                src_logits, src_indicator = self._source_forward(x)
        with record_function("ftta.adapt"):
            out_local = self.local.adapt(self.bank, x, client_regularizer(strategy, self.bank, x))
            state = self.local.shared_state(self.bank)
        context = {"indicator": src_indicator, "feature_mean": out_local.features.mean(1),
                   "logits_mean": out_local.logits.mean(1)}
        return LocalPhase(batch, x, y, src_logits, out_local.logits, state, context)

    def server_phase(self, phase: "LocalPhase", strategy: Strategy,
                     seen: Optional[List[tuple]] = None) -> StepResult:
        """Uploads, checks, W, mixing and the prediction after mixing, for ``strategy``.

        Uploads are checked by ``upload_gate()`` (``engine.uploads``: shape, dtype, NaN/Inf, BN variances, magnitude;
        ``upload_policy``); a name of the state or uploads may also come as N per-client tensors, stacked there.
        A rejected client gets no weight and keeps its own model; it is logged and reported in ``rejected``.
        With an ``attack``, its clients' rows of the state and uploads are rewritten first (``engine.attacks``).

        ``seen`` (shared passes only) collects (mixed state, logits) of the strategies already served at this step:
        a strategy whose mixed state equals one of them exactly reuses its logits instead of another forward pass
        (under TTA-bn FedProx, MOON, pFedSD and FedAvg+FT mix exactly like FedAvg).
        """
        batch, x, state = phase.batch, phase.x, phase.state
        context = dict(phase.context)
        with record_function("ftta.uploads"):
            context.update(probe_uploads(strategy, self.bank, self.local, x, batch.step))  # e.g. FedCTTA probes
            uploads = strategy.client_uploads(context)
            present = self.present(batch.step)
            if self.attack is not None:  # the attackers' rows as they send them (``engine.attacks``)
                state, uploads = self.attack.apply(state, uploads)
        sizes = torch.full((self.n_clients,), float(x.shape[1]))
        rnd = server_round(strategy, self.upload_gate(), batch.step, state, uploads, present, sizes, self.n_clients,
                           self.device, install=lambda mixed: self.local.load_state(self.bank, mixed))
        if rnd.reasons:
            log.warning("step %d: rejected uploads of %s", batch.step, describe_rejections(rnd.reasons))
        state, uploads, valid, weights, mixed = rnd.state, rnd.uploads, rnd.valid, rnd.weights, rnd.mixed
        if strategy.finetune_after_mix and self.local.shares == "params":
            # adapt again on the same batch after aggregation, then predict with the fine-tuned model
            # (with TTA-bn there is nothing to fine-tune: FedAvg+FT equals FedAvg, as in FedTSA Table 1)
            self.local.adapt(self.bank, x)
            seen = None
        logits = _same_state_logits(seen, mixed)
        if logits is None:
            with record_function("ftta.predict"):
                logits = self.local.predict(self.bank, x).logits
            if seen is not None:
                seen.append((mixed, logits))
        upload_bytes = sum(int(t[0].numel() * t.element_size()) for t in {**state, **uploads}.values())
        y = phase.y
        correct_by_class, n_by_class = class_counts(logits.argmax(-1), y, logits.shape[-1])
        return StepResult(
            step=batch.step,
            correct_source=(phase.source_logits.argmax(-1) == y).sum(1).cpu().numpy(),
            correct_local=(phase.local_logits.argmax(-1) == y).sum(1).cpu().numpy(),
            correct_mixed=(logits.argmax(-1) == y).sum(1).cpu().numpy(),
            n=np.full(self.n_clients, y.shape[1]),
            domains=np.asarray(batch.domains),
            weights=weights.numpy(),
            rejected=(~valid & present).numpy(),
            absent=(~present).numpy(),
            upload_bytes=upload_bytes,
            correct_by_class=correct_by_class,
            n_by_class=n_by_class,
        )

    def upload_gate(self) -> UploadGate:
        """The server's upload checks (``upload_policy``, the shapes learned so far, the source model's values)."""
        gate = self.__dict__.get("_upload_gate")
        if gate is None:
            gate = self._upload_gate = UploadGate(self.upload_policy, reference_values(self.source_model))
        return gate

    def prefetch(self, stream: Stream, step: int, stop: int, strategies: Optional[Dict[str, Strategy]] = None) -> None:
        """Before ``step``: hand the strategies that compute rounds ahead (``Strategy.lookahead``, e.g. FedTSA, whose W
        depends only on the frozen source model's indicators) the source-model uploads of the next steps (up to
        ``stop``), so that their rounds run on server threads while the clients adapt. A no-op unless such a strategy
        is given (default: this engine's) and there are server threads (``server_threads``; by default as many as
        torch's threads, and the clients' work then runs on half of those until ``close``). W is unchanged bit for
        bit: each round is the same single-threaded computation, and the strategy checks its plan against its
        memory when the step comes. The source forwards are kept for ``local_phase``. Steps are handed over
        ``STEPS_AHEAD_PER_THREAD`` per server thread ahead, or in chunks of ``Strategy.plan_chunk`` (two chunks
        ahead) for a strategy that batches its rounds (FedTSA on a GPU)."""
        planners = [s for s in (strategies or {"": self.strategy}).values() if lookahead_of(s)]
        if not self._rounds_told:  # the first prefetch of this engine's run: tell them how long the run is, as its
            # stop step (the same when a run resumes part-way, so a strategy chooses as the uninterrupted run did)
            for strategy in planners:
                strategy.expect_rounds(stop)
            self._rounds_told = True
        if self._server_pool is not None:  # decided at the first call (the default then changes torch's threads)
            threads = self.rounds_ahead_threads
        else:
            threads = self.server_threads if self.server_threads is not None else default_server_threads(self.device)
        if not planners or threads < 1:
            return
        if self._horizon is None or self._horizon < step:
            self._horizon = step
        chunk = max(s.plan_chunk(self.device) for s in planners)  # steps a planner takes at once (batched rounds)
        end = min(stop, step + max(STEPS_AHEAD_PER_THREAD * threads, 2 * chunk))
        if self._horizon >= end or (end - self._horizon < chunk and end < stop):
            return
        steps = list(range(self._horizon, end))
        indicators, present = [], []
        with record_function("ftta.prefetch"):
            for t in steps:
                x = stream.batch(t).images.to(self.device)
                logits, indicator = self._source_forward(x)
                self._source_ahead[t] = (x, logits, indicator)
                indicators.append(indicator)
                present.append(self.present(t))
        uploads = {"indicator": torch.stack(indicators)}  # the source model's uploads (``strategies.base``)
        for strategy in planners:
            unknown = sorted(set(lookahead_of(strategy)) - set(uploads))
            if unknown:
                raise ValueError(f"strategy {strategy.name} looks ahead on {unknown}; only the source model's "
                                 f"{sorted(uploads)} are known before a step")
        if self._server_pool is None:
            kind = self.server_pool or default_server_pool(self.device)
            self._server_pool, self.server_pool_kind = server_pool(kind, threads, planners)
            self.rounds_ahead_threads = threads
            if self.server_threads is None and torch.device(self.device).type != "cuda":  # auto, on a CPU: the
                # clients keep half of the threads while rounds run ahead
                self._client_threads = torch.get_num_threads()
                torch.set_num_threads(max(1, self._client_threads // 2))
        for strategy in planners:
            strategy.plan_rounds(steps, {k: uploads[k] for k in lookahead_of(strategy)}, torch.stack(present),
                                 self._server_pool.submit)
        self._horizon = end

    def close(self) -> None:
        """Stop the server threads of ``prefetch`` (pending rounds are cancelled), drop what was prefetched and save
        the ``source_cache`` (if it has new entries and a file)."""
        if self.source_cache is not None:
            self.source_cache.save()
        if self._server_pool is not None:
            self._server_pool.shutdown(wait=True, cancel_futures=True)
            self._server_pool = None
        if self._client_threads is not None:
            torch.set_num_threads(self._client_threads)
            self._client_threads = None
        self._source_ahead.clear()
        self._horizon = None
        self._rounds_told = False

    def present(self, step: int) -> torch.Tensor:
        """Boolean [N]: the clients whose uploads reach the server at ``step`` (each with probability
        ``participation``, drawn from the run's seed and the step). An absent client (dropped out, or a straggler
        past the round's deadline) still adapts locally; it is left out of W and keeps its own model."""
        return participants(self.n_clients, self.participation, self.seed, step)

    def shares_local_phase(self) -> bool:
        """True when one local phase can serve several strategies: nothing trained, no state carried over."""
        return not self.bank.trainable and self.local.shares in ("bn_stats", "nothing")

    def step_strategies(self, batch: StreamBatch, strategies: Dict[str, Strategy]) -> Dict[str, StepResult]:
        """One step for several strategies that share this engine's stateless local phase (TTA-bn, source).

        The source pass and the batch-statistics pass run once; each strategy then computes its own W, mixes and
        predicts. Equal, step by step, to running each strategy in its own engine (tested), at 2 + S instead of 3S
        forward passes per step.
        """
        if not self.shares_local_phase():
            raise SharedPassError(f"local method {self.local.name!r} trains or carries state: strategies cannot share it")
        if any(client_regularizer(s, self.bank, batch.images) is not None for s in strategies.values()):
            raise SharedPassError("a strategy with a client regulariser cannot share the local phase")
        phase = self.local_phase(batch, self.strategy)
        seen: List[tuple] = []
        return {name: self.server_phase(phase, s, seen) for name, s in strategies.items()}

    def state_dict(self) -> dict:
        """Bank and strategy state for resuming."""
        return {"bank": self.bank.state_dict(), "strategy": self.strategy.state_dict(),
                "local": self.local.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict`` (and forget what was prefetched)."""
        self._source_ahead.clear()
        self._horizon = None
        self._rounds_told = False
        self.bank.load_state_dict(state["bank"])
        self.strategy.load_state_dict(state["strategy"])
        self.local.load_state_dict(state.get("local", {}))


def class_counts(pred: torch.Tensor, y: torch.Tensor, n_classes: int) -> Tuple[np.ndarray, np.ndarray]:
    """Per client and true class: correct predictions and samples ([N, K] int64 arrays each) of ``pred`` [N, B]."""
    onehot = torch.nn.functional.one_hot(y.long(), n_classes)             # [N, B, K]
    correct = (onehot * (pred == y).unsqueeze(-1)).sum(1)
    return correct.cpu().numpy().astype(np.int64), onehot.sum(1).cpu().numpy().astype(np.int64)


def _same_state_logits(seen: Optional[List[tuple]], mixed: Dict[str, torch.Tensor]) -> Optional[torch.Tensor]:
    """The logits stored in ``seen`` for a mixed state exactly equal to ``mixed``, if any."""
    for state, logits in seen or ():
        if state.keys() == mixed.keys() and all(torch.equal(state[k], mixed[k]) for k in mixed):
            return logits
    return None


def participants(n_clients: int, participation: float, seed: int, step: int) -> torch.Tensor:
    """Boolean [N]: the clients whose uploads reach the server at ``step``, each with probability ``participation``
    (drawn from the run's seed and the step; the engine and the Flower server draw the same)."""
    if participation >= 1.0:
        return torch.ones(n_clients, dtype=torch.bool)
    u = torch.rand(n_clients, generator=torch_generator(seed, "participation", step))
    return u < participation


def run_steps(engine: Engine, stream: Stream, start: int = 0, stop: Optional[int] = None,
              on_step: Optional[Callable[[StepResult], None]] = None) -> List[StepResult]:
    """Run ``engine`` over steps [start, stop) of ``stream``; the engine is closed after the last step or an error
    (its server threads stopped, torch's thread count restored)."""
    results = []
    stop = len(stream) if stop is None else stop
    try:
        for t in range(start, stop):
            engine.prefetch(stream, t, stop)
            res = engine.step(stream.batch(t))
            results.append(res)
            if on_step is not None:
                on_step(res)
    finally:
        engine.close()
    return results


@dataclass
class ServerRound:
    """One server step: the checked state and uploads [N, ...], the accepted clients [N] and a reason per rejected
    one, W [N, N] (CPU, float32) and the mixed state [N, ...] (rejected clients keep their own)."""

    state: Dict[str, torch.Tensor]
    uploads: Dict[str, torch.Tensor]
    valid: torch.Tensor
    reasons: Dict[int, str]
    weights: torch.Tensor
    mixed: Dict[str, torch.Tensor]
    inputs: ServerInputs


def server_round(strategy: Strategy, gate: UploadGate, step: int, state, uploads, present: torch.Tensor,
                 sizes: torch.Tensor, n_clients: int, device: torch.device | str = "cpu",
                 install: Optional[Callable[[Dict[str, torch.Tensor]], None]] = None) -> ServerRound:
    """The server's half of a step, the same for the engine and the Flower server: check the uploads (``gate``;
    state and uploads stacked [N, ...] or per client), compute W over the accepted clients (``restrict_to_valid``,
    ``check_collaboration``), mix the state with it (``strategy.mix``; a rejected or absent client keeps its own
    state exactly), hand the mixed state to ``install`` (the engine loads it into its bank) and let the strategy
    observe it (``after_mix``)."""
    with record_function("ftta.uploads"):
        state, uploads, valid, reasons = gate.check(state, uploads, present, n_clients)
    inputs = ServerInputs(step, state, uploads, valid, sizes)
    with record_function("ftta.server"):
        weights = strategy.collaboration(inputs).detach().float().cpu()
        weights = check_collaboration(restrict_to_valid(weights, valid), n_clients)
    mixed: Dict[str, torch.Tensor] = {}
    if state:
        with record_function("ftta.mix"):
            mixed = strategy.mix(state, weights.to(device))
            if not bool(valid.all()):  # a rejected client keeps its own state exactly
                mixed = {k: torch.where(valid.to(v.device).view(-1, *[1] * (v.dim() - 1)), v, state[k])
                         for k, v in mixed.items()}
            if install is not None:
                install(mixed)
            strategy.after_mix(mixed, inputs)
    return ServerRound(state, uploads, valid, reasons, weights, mixed, inputs)
