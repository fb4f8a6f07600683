"""One way to build a run: ``build_run(config)`` assembles the stream, the local method, the strategy, the engine
(client bank) and a recorder from an ``ExperimentConfig``; every runner builds through it (``run_experiment``,
``run_strategies``, ``fedctta.study.run_live``, ``leakage.collect_uploads``; the Flower apps build their server's
strategy and their clients' method with ``build_strategy_for`` / ``build_local_for``), so they cannot drift apart
(participation, the run's seed reaching the methods, the smoke cap, the engine's seed, closing the engine).

A ``Run`` is a context manager: leaving it closes the engine (stops the server threads of rounds computed ahead and
gives torch back its thread count), also when a step raises.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional

import numpy as np
import torch

from .loop import Engine, StepResult
from .scenarios import (CASE_STUDY_LEADS, Scenario, case_study_scenario, client_image_pools, dirichlet_client_pools,
                        fedctta_scenario, fedtsa_scenario, heterogeneity_scenario)
from .stream import CorruptedDomains, Stream

if TYPE_CHECKING:  # the config module imports this one (no import cycle at run time)
    from .experiment import ExperimentConfig
    from .strategies.base import Strategy
    from .tta.base import LocalMethod


# modules every simulated run depends on (besides its local method and strategy, and the data loader and model
# architecture it uses); packages list all their modules
RUN_ROOTS = ("build", "loop", "engine.bank", "engine.layers", "engine.mixing", "stream", "scenarios", "training",
             "rng", "corruptions", "data.registry", "data.base", "data.cache", "data.root")
# functions of ``experiment`` that make a run's numbers (the rest of that module is config checking and reporting)
RUN_FUNCTIONS = ("run_experiment", "_run", "run_strategies", "summarize", "accuracy_by")


def code_record(local: str, strategy: str, cfg: Optional["ExperimentConfig"] = None) -> Dict[str, Any]:
    """What made a run of local method ``local`` and strategy ``strategy`` (``runstore.code_record_of``): the
    semantic units (``ftta_core.units``) of ``RUN_ROOTS``, of the two methods (registered plugins included) and what
    they import, and of ``experiment``'s ``RUN_FUNCTIONS``; with the run's config ``cfg``, also its dataset's loader,
    its model's architecture and its source checkpoint by digest (without ``cfg``: every loader and architecture)."""
    from .runstore import PACKAGE, code_record_of
    from .strategies import STRATEGIES
    from .tta import LOCAL_METHODS
    from .units import checkpoint_input

    roots = [f"{PACKAGE}.{r}" for r in RUN_ROOTS]
    for registry, key in ((LOCAL_METHODS, local), (STRATEGIES, strategy)):
        obj = registry.get(key)
        if obj is not None:
            roots += [c.__module__ for c in getattr(obj, "__mro__", [obj]) if c.__module__.startswith(PACKAGE)]
    inputs: Dict[str, str] = {}
    if cfg is None:
        roots += [f"{PACKAGE}.data", f"{PACKAGE}.models"]
    else:
        from .data.registry import loader_module
        from .models import ARCHITECTURES
        from .training import SOURCE_MODELS

        roots.append(loader_module(cfg.dataset))
        spec = SOURCE_MODELS.get(cfg.model_name)
        roots += [ARCHITECTURES[spec.arch].__module__] if spec is not None else [f"{PACKAGE}.models"]
        inputs = checkpoint_input(cfg.model_name)
    return code_record_of(roots, [f"{PACKAGE}.experiment:{name}" for name in RUN_FUNCTIONS], inputs)


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when available, else 'cpu'."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available")
    return device


def local_params(cfg: "ExperimentConfig") -> Dict[str, Any]:
    """The local method's parameters; a method that draws random numbers gets the run's seed unless given one."""
    from .registry import accepts
    from .tta import LOCAL_METHODS

    params = dict(cfg.local_params)
    if accepts(LOCAL_METHODS, cfg.local, "seed"):
        params.setdefault("seed", cfg.seed)
    return params


def strategy_params(cfg: "ExperimentConfig") -> Dict[str, Any]:
    """The strategy's parameters; a strategy that draws random numbers gets the run's seed unless given one."""
    from .registry import accepts
    from .strategies import STRATEGIES

    params = dict(cfg.strategy_params)
    if accepts(STRATEGIES, cfg.strategy, "seed"):
        params.setdefault("seed", cfg.seed)
    return params


def build_local_for(cfg: "ExperimentConfig") -> "LocalMethod":
    """The config's local method, seeded from the run's seed (``local_params``)."""
    from .tta import build_local

    return build_local(cfg.local, **local_params(cfg))


def build_strategy_for(cfg: "ExperimentConfig", strategy: Optional[str] = None) -> "Strategy":
    """The config's strategy (or ``strategy`` at its defaults, as ``run_strategies`` runs it), seeded from the run's
    seed (``strategy_params``), mixing with the config's ``robust_mixing`` (``strategies.base.set_robust_mixing``)."""
    from .engine.robust import parse_robust_mixing
    from .strategies import build_strategy
    from .strategies.base import set_robust_mixing

    if strategy is not None:
        cfg = dataclasses.replace(cfg, strategy=strategy, strategy_params={})
    built = build_strategy(cfg.strategy, **strategy_params(cfg))
    robust = parse_robust_mixing(cfg.robust_mixing)
    if robust is not None and robust.mode == "clip":  # clipping measures deviations from the source model's values
        from .engine.uploads import reference_values
        from .training import load_source_model

        with torch.random.fork_rng(devices=[]):  # building the model draws its initial weights: not from the run's
            source = load_source_model(cfg.model_name, device="cpu")  # torch generator
        robust = dataclasses.replace(robust, reference=reference_values(source))
    return set_robust_mixing(built, robust)


def build_scenario(cfg: "ExperimentConfig") -> Scenario:
    """The scenario the config names."""
    names = cfg.corruption_list
    if cfg.scenario in CASE_STUDY_LEADS:
        return case_study_scenario(names, cfg.batch_size, cfg.images_per_client,
                                   cfg.slot_steps or cfg.images_per_client // cfg.batch_size,
                                   lead=CASE_STUDY_LEADS[cfg.scenario])
    if cfg.scenario.startswith(("fedtsa", "fedctta")):
        build = fedtsa_scenario if cfg.scenario.startswith("fedtsa") else fedctta_scenario
        return build(names, niid=cfg.scenario.endswith("_niid"), n_clients=cfg.clients, batch_size=cfg.batch_size,
                     images_per_domain=cfg.images_per_client,
                     slot_steps=cfg.slot_steps or cfg.images_per_client // cfg.batch_size)
    n_steps = cfg.n_steps or len(names) * (cfg.images_per_client // cfg.batch_size)
    if cfg.slot_steps:
        return heterogeneity_scenario(cfg.clients, names, cfg.sh, 1 / cfg.slot_steps, n_steps, cfg.batch_size)
    return heterogeneity_scenario(cfg.clients, names, cfg.sh, cfg.th, n_steps, cfg.batch_size)


def build_stream(cfg: "ExperimentConfig", device: str = "cpu", data_root: Optional[str] = None) -> Stream:
    """Load the test set, corrupt it per domain (cached) and build the clients' stream."""
    from .data import load_dataset
    from .data.root import cache_dir

    base = load_dataset(cfg.dataset, "test", root=data_root)
    scenario = build_scenario(cfg)
    domains = CorruptedDomains(base, cfg.corruption_list, cfg.severity, seed=cfg.seed,
                               cache_dir=cache_dir() / "corrupted")
    if cfg.label_alpha is None:
        pools = client_image_pools(len(base), cfg.clients, cfg.images_per_client, cfg.seed)
    else:
        pools = dirichlet_client_pools(base.labels, cfg.clients, cfg.images_per_client, cfg.label_alpha, cfg.seed)
    return Stream(scenario, domains, pools, device=device)


def run_length(cfg: "ExperimentConfig", stream: Stream) -> int:
    """Steps the config runs on ``stream``: all of it, or ``max_steps``; a smoke run at most two slots and 20."""
    n_steps = min(len(stream), cfg.max_steps or len(stream))
    if cfg.smoke:
        n_steps = min(n_steps, 2 * stream.scenario.slot_steps, 20)
    return n_steps


# ---------------------------------------------------------------------------------------------------------------
# the recorder

def step_rows(res: StepResult, scenario: Scenario) -> List[Dict[str, Any]]:
    """The tidy rows (one per client) of one step."""
    return [{"step": res.step, "slot": scenario.slot_of(res.step), "client": i,
             "domain": scenario.domain_names[int(res.domains[i])], "n": int(res.n[i]),
             "correct_source": int(res.correct_source[i]), "correct_local": int(res.correct_local[i]),
             "correct_mixed": int(res.correct_mixed[i]), "rejected": bool(res.rejected[i]),
             "absent": bool(res.absent[i])}
            for i in range(len(res.n))]


@dataclass
class ClassTally:
    """Per-client, per-true-class samples and correct predictions after mixing, summed over steps ([N, K] each)."""

    counts: Optional[np.ndarray] = None
    correct: Optional[np.ndarray] = None

    def add(self, res: StepResult) -> None:
        """Add one step's ``n_by_class`` / ``correct_by_class``."""
        if res.n_by_class is None or res.correct_by_class is None:
            return
        if self.counts is None:
            self.counts, self.correct = np.zeros_like(res.n_by_class), np.zeros_like(res.correct_by_class)
        self.counts = self.counts + res.n_by_class
        self.correct = self.correct + res.correct_by_class

    def state(self) -> Dict[str, Any]:
        """What a checkpoint keeps (``from_state`` restores it)."""
        return {"counts": self.counts, "correct": self.correct}

    @classmethod
    def from_state(cls, state: Dict[str, Any]) -> "ClassTally":
        """Restore ``state()``."""
        return cls(state.get("counts"), state.get("correct"))

    def summary(self) -> Dict[str, Any]:
        """``accuracy_by_class`` (%, all clients; None for a class no client saw) and the per-client tables
        ``class_counts`` / ``class_correct`` [N][K] (mixed predictions); {} when nothing was recorded."""
        if self.counts is None:
            return {}
        n, c = self.counts.sum(0), self.correct.sum(0)
        return {"accuracy_by_class": {str(k): (float(100 * c[k] / n[k]) if n[k] else None) for k in range(len(n))},
                "class_counts": self.counts.tolist(), "class_correct": self.correct.tolist()}


@dataclass
class Recorder:
    """Collects a run's tidy rows, W per step, per-class totals and upload size, slot by slot: ``add`` a step's
    result; ``slot_done`` says when the pending slot is complete (a writer commits it then), ``close_slot`` moves it
    to the recorded rows."""

    scenario: Scenario
    n_clients: int
    classes: Optional[ClassTally] = field(default_factory=ClassTally)
    rows: List[dict] = field(default_factory=list)
    weights: List[np.ndarray] = field(default_factory=list)
    slot_rows: List[dict] = field(default_factory=list)
    slot_weights: List[np.ndarray] = field(default_factory=list)
    upload_bytes: int = 0

    def add(self, res: StepResult) -> None:
        """Record one step."""
        self.upload_bytes = res.upload_bytes
        self.slot_rows += step_rows(res, self.scenario)
        self.slot_weights.append(res.weights)
        if self.classes is not None:
            self.classes.add(res)

    def slot_done(self, step: int, n_steps: int) -> bool:
        """True when ``step`` ends a slot of the scenario or the run."""
        return (step + 1) % self.scenario.slot_steps == 0 or step + 1 == n_steps

    def close_slot(self) -> None:
        """Move the pending slot to the recorded rows and W."""
        self.rows += self.slot_rows
        self.weights += self.slot_weights
        self.slot_rows, self.slot_weights = [], []

    def table(self):
        """The recorded rows as a DataFrame (one row per step and client)."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def collaboration(self) -> np.ndarray:
        """W over the recorded steps [T, N, N] (float32)."""
        if not self.weights:
            return np.zeros((0, self.n_clients, self.n_clients), np.float32)
        return np.stack(self.weights)


# ---------------------------------------------------------------------------------------------------------------
# the run

@dataclass
class Run:
    """A built run: its config, device, stream, engine (client bank, local method, strategy) and length. A context
    manager: leaving it closes the engine (``Engine.close``), whatever happened inside."""

    config: "ExperimentConfig"
    device: str
    stream: Stream
    engine: Engine
    n_steps: int

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the engine's server threads and restore torch's thread count."""
        self.engine.close()

    def recorder(self) -> Recorder:
        """A fresh recorder for this run's scenario."""
        return Recorder(self.stream.scenario, self.engine.n_clients)

    def steps(self, start: int = 0, stop: Optional[int] = None, progress: bool = False,
              strategies: Optional[Dict[str, "Strategy"]] = None) -> Iterator[int]:
        """The step indices [start, stop or n_steps), each after ``Engine.prefetch`` handed the look-ahead
        strategies (this engine's, or ``strategies``) their uploads; with ``progress`` a tqdm bar."""
        stop = self.n_steps if stop is None else stop
        steps = range(start, stop)
        if progress:
            from tqdm.auto import tqdm

            what = (f"{self.config.local} x {len(strategies)} strategies" if strategies
                    else f"{self.config.local}+{self.config.strategy}")
            steps = tqdm(steps, desc=what, initial=start, total=stop)
        for t in steps:
            self.engine.prefetch(self.stream, t, stop, strategies)
            yield t


def build_engine(cfg: "ExperimentConfig", device: str, strategy: Optional["Strategy"] = None,
                 server_threads: Optional[int] = None) -> Engine:
    """The config's engine on ``device``: torch seeded from the run's seed, the source model, the local method and
    the strategy (``strategy``, e.g. an object a config cannot hold, or the config's), with its participation and
    its attack (``engine.attacks``)."""
    from .engine.attacks import parse_attack
    from .rng import derive_seed
    from .training import load_source_model

    torch.manual_seed(derive_seed(cfg.seed, "engine"))
    source = load_source_model(cfg.model_name, device=device)
    local = build_local_for(cfg)
    strategy = strategy if strategy is not None else build_strategy_for(cfg)
    return Engine(source, local, strategy, cfg.clients, cfg.backend, device, cfg.participation, cfg.seed,
                  server_threads, attack=parse_attack(cfg.attack))


# Every run built here keeps the frozen source model's outputs per batch in a file per model and stream
# (``engine.source_cache``, under ``cache_dir()/source_outputs``, ~21 MB per CIFAR-10-C protocol stream) and reads
# them in later runs of that stream: a run of a grid skips one of TTA-bn's three forwards. An entry is read only by
# a forward on the same device with the same thread count (``source_cache.entry_key``), so a run equals the run
# without the cache bit for bit (tests/test_speed_levers.py). FTTA_SOURCE_CACHE=0 switches it off.
SOURCE_CACHE_ENV = "FTTA_SOURCE_CACHE"


def build_run(cfg: "ExperimentConfig", *, stream: Optional[Stream] = None, strategy: Optional["Strategy"] = None,
              data_root: Optional[str] = None, server_threads: Optional[int] = None,
              device: Optional[str] = None) -> Run:
    """Assemble ``cfg``'s run: the stream (``stream`` if given: streams are costly, share them between runs of the
    same data), the engine (``build_engine``; ``strategy`` replaces the config's strategy by an object) and the
    number of steps (``run_length``). ``device`` overrides the config's (e.g. 'cpu' for a run collected on CPU);
    ``server_threads`` is ``Engine.server_threads``. Use it as a context manager (``with build_run(cfg) as run``)."""
    device = resolve_device(device or cfg.device)
    stream = stream or build_stream(cfg, device, data_root)
    engine = build_engine(cfg, device, strategy, server_threads)
    if os.environ.get(SOURCE_CACHE_ENV, "1") != "0":  # reuse the source model's outputs across runs of a stream
        from .engine.source_cache import SourceCache

        engine.source_cache = SourceCache.open_for(engine.source_model, stream)
    return Run(cfg, device, stream, engine, run_length(cfg, stream))


__all__ = ["Run", "Recorder", "ClassTally", "build_run", "build_engine", "build_stream", "build_scenario",
           "build_local_for", "build_strategy_for", "local_params", "strategy_params", "resolve_device",
           "run_length", "step_rows"]
