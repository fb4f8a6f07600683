"""One validated config -> one federated TTA experiment -> tidy result tables (and files, resumable)."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import math
import numbers
import os
import platform
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from torch.profiler import record_function

from .build import (ClassTally, Recorder, build_local_for, build_run, build_scenario, build_stream,  # noqa: F401
                    build_strategy_for, code_record, local_params, resolve_device, run_length, step_rows,
                    strategy_params)
from .loop import Engine, StepResult  # noqa: F401  (public names of this module before ``build``)
from .scenarios import CASE_STUDY_LEADS
from .stream import CLEAN, Stream
from .runstore import (DamagedRun, RunStoreError, atomic_write, atomic_write_text, checkpoint_bytes, file_sha256,
                       integrity_problem, load_checkpoint, sealed_summary_text, without_integrity, writing)

log = logging.getLogger(__name__)

DATASET_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "cifar10": {"model": "resnet8_cifar10"},
    "embedded_digits": {"model": "digits_cnn_embedded"},
    "digits/mnistm": {"model": "cnn2_digits"},
    "digits/usps": {"model": "cnn2_digits"},
    "digits/mnist": {"model": "cnn2_digits"},
}
SCENARIOS = ("fedtsa_niid", "fedtsa_iid", "fedctta_niid", "fedctta_iid", "case_study", "case_study_fedctta",
             "heterogeneity")
ALL_CORRUPTIONS = "all"


@dataclass(frozen=True)
class Range:
    """The values a numeric setting may take: between ``low`` and ``high`` (each included unless ``*_open``),
    finite, and an integer when ``integer``."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    integer: bool = False

    def describe(self) -> str:
        """The range in words: '> 0', 'in [0, 1]', 'an integer >= 1'."""
        kind = "an integer " if self.integer else ""
        if math.isinf(self.high):
            return f"{kind}{'>' if self.low_open else '>='} {self.low:g}"
        return f"{kind}in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def problem(self, value: Any) -> Optional[str]:
        """Why ``value`` is outside the range ('must be > 0, got -1'), or None."""
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            return f"must be a number {self.describe()}, got {value!r}"
        v = float(value)
        inside = (math.isfinite(v) and (v > self.low if self.low_open else v >= self.low)
                  and (v < self.high if self.high_open else v <= self.high) and (not self.integer or v.is_integer()))
        return None if inside else f"must be {self.describe()}, got {value!r}"


POSITIVE, NON_NEGATIVE, FRACTION = Range(0, low_open=True), Range(0), Range(0, 1)
COUNT, INDEX = Range(1, integer=True), Range(0, integer=True)
# method parameters with one meaning whichever local method or strategy takes them: checked before the method is
# built, the error naming the field, the parameter and the value (None is left to the method: a default)
PARAM_RANGES: Dict[str, Range] = {
    **dict.fromkeys(("lr", "server_lr", "temperature", "tau"), POSITIVE),
    **dict.fromkeys(("weight_decay", "mu", "lam"), NON_NEGATIVE),
    **dict.fromkeys(("momentum", "bn_momentum", "teacher_momentum", "probs_momentum", "momentum_src",
                     "momentum_probs", "beta"), FRACTION),
    **dict.fromkeys(("steps", "n_augmentations", "n_probes", "interval", "window", "memory_size",
                     "update_frequency", "fisher_samples", "fisher_batch"), COUNT),
    **dict.fromkeys(("server_steps", "seed"), INDEX),
}


@dataclass
class ExperimentConfig:
    """Everything that defines a run. Invalid values raise ``ValueError`` naming the field."""

    dataset: str = "embedded_digits"
    scenario: str = "heterogeneity"
    corruptions: Sequence[str] | str = ALL_CORRUPTIONS
    severity: int = 5
    clients: int = 20
    batch_size: int = 10
    images_per_client: int = 500
    sh: float = 0.2
    th: float = 0.02
    n_steps: Optional[int] = None
    slot_steps: Optional[int] = None
    label_alpha: Optional[float] = None
    local: str = "bn"
    local_params: Dict[str, Any] = field(default_factory=dict)
    strategy: str = "fedavg"
    strategy_params: Dict[str, Any] = field(default_factory=dict)
    model: Optional[str] = None
    seed: int = 0
    backend: str = "vectorized"
    device: str = "auto"
    max_steps: Optional[int] = None
    smoke: bool = False
    participation: float = 1.0
    robust_mixing: str = "off"
    attack: str = "none"

    def __post_init__(self) -> None:
        from .corruptions import CORRUPTIONS, SEVERITIES
        from .strategies import STRATEGIES
        from .tta import LOCAL_METHODS
        from .training import SOURCE_MODELS

        def bad(name: str, msg: str) -> None:
            raise ValueError(f"config field {name!r}: {msg}")

        # types, by each field's annotation: bool only True/False; int not a bool or a float (5.0); float an int or
        # a float, not a bool or a string; numpy scalars become Python ones
        for f in dataclasses.fields(self):
            optional = str(f.type).startswith("Optional[")
            kind = str(f.type).removeprefix("Optional[").removesuffix("]")
            v = getattr(self, f.name)
            got = f"{v!r} ({type(v).__name__})"
            or_null = " or null" if optional else ""
            if v is None and optional:
                continue
            if kind == "bool":
                if not isinstance(v, (bool, np.bool_)):
                    bad(f.name, f"must be true or false, got {got}")
                setattr(self, f.name, bool(v))
            elif kind == "int":
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
                    hint = f"; write {int(v)}" if isinstance(v, float) and v.is_integer() else ""
                    bad(f.name, f"must be an integer{or_null}, got {got}{hint}")
                setattr(self, f.name, int(v))
            elif kind == "float":
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
                    bad(f.name, f"must be a number{or_null}, got {got}")
                if not np.isfinite(float(v)):
                    bad(f.name, f"must be finite{or_null}, got {v!r}")
                if not isinstance(v, (int, float)):
                    setattr(self, f.name, float(v))
            elif kind == "str" and not isinstance(v, str):
                bad(f.name, f"must be a string{or_null}, got {got}")
            elif kind.startswith("Dict[") and not isinstance(v, dict):
                bad(f.name, f"must be a mapping of parameter names to values, got {got}")
            elif kind.startswith("Dict[") and not all(isinstance(k, str) for k in v):
                bad(f.name, f"parameter names must be strings, got {sorted(map(repr, v))}")
        c = self.corruptions
        if not (isinstance(c, str) or isinstance(c, (list, tuple, np.ndarray)) and all(isinstance(x, str) for x in c)):
            bad("corruptions", f"must be 'all', a comma-separated string or a list of names, got {c!r}")
        if self.dataset not in DATASET_DEFAULTS:
            bad("dataset", f"unknown dataset {self.dataset!r}; valid: {sorted(DATASET_DEFAULTS)}")
        if self.scenario not in SCENARIOS:
            bad("scenario", f"unknown scenario {self.scenario!r}; valid: {list(SCENARIOS)}")
        if isinstance(self.corruptions, str):
            if self.corruptions != ALL_CORRUPTIONS:
                self.corruptions = [c.strip() for c in self.corruptions.split(",") if c.strip()]
        if not isinstance(self.corruptions, str):
            self.corruptions = list(self.corruptions)
            unknown = [c for c in self.corruptions if c not in CORRUPTIONS and c != CLEAN]
            if unknown or not self.corruptions:
                bad("corruptions", f"unknown {unknown}; valid: {list(CORRUPTIONS) + [CLEAN]} or 'all'")
        if self.severity not in SEVERITIES:
            bad("severity", f"must be one of {SEVERITIES}, got {self.severity}")
        for name in ("clients", "batch_size", "images_per_client"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                bad(name, f"must be a positive integer, got {getattr(self, name)!r}")
        if self.images_per_client < self.batch_size:
            bad("images_per_client", f"must be at least batch_size ({self.batch_size}): a client sees "
                                     f"images_per_client // batch_size batches of each domain, got "
                                     f"{self.images_per_client}")
        for name in ("sh", "th"):
            if not 0 < float(getattr(self, name)) <= 1:
                bad(name, f"must be in (0, 1], got {getattr(self, name)}")
        for name in ("n_steps", "slot_steps", "max_steps"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                bad(name, f"must be a positive integer or None, got {v!r}")
        if self.scenario in CASE_STUDY_LEADS and self.clients != 10:
            bad("clients", f"the case study has 10 clients in 3 groups (4, 3, 3), got {self.clients}")
        if not 0.0 < float(self.participation) <= 1.0:
            bad("participation", f"must be in (0, 1] (the probability a client reports at a step), got "
                                 f"{self.participation}")
        from .engine.attacks import parse_attack
        from .engine.robust import parse_robust_mixing

        for name, parse, off in (("robust_mixing", parse_robust_mixing, "off"), ("attack", parse_attack, "none")):
            try:
                parsed = parse(getattr(self, name))
            except ValueError as err:
                bad(name, str(err))
            setattr(self, name, off if parsed is None else parsed.spec)  # one spelling per meaning ('trimmed:0.1')
        attack = parse_attack(self.attack)
        if attack is not None and max(attack.clients) >= self.clients:
            bad("attack", f"attacker id(s) {[i for i in attack.clients if i >= self.clients]} are not clients "
                          f"0..{self.clients - 1}, got {self.attack!r}")
        if self.label_alpha is not None and not self.label_alpha > 0:
            bad("label_alpha", f"must be positive or None (IID), got {self.label_alpha}")
        if INDEX.problem(self.seed):
            bad("seed", INDEX.problem(self.seed) or "")
        from .plugins import PLUGIN_HINT, load_plugins

        load_plugins()  # methods of plugins ($FTTA_PLUGINS, 'ftta.plugins' entry points): once per process, then cheap
        if self.local not in LOCAL_METHODS:
            bad("local", f"unknown local method {self.local!r}; valid: {sorted(LOCAL_METHODS)} ({PLUGIN_HINT})")
        if self.strategy not in STRATEGIES:
            bad("strategy", f"unknown strategy {self.strategy!r}; valid: {sorted(STRATEGIES)} ({PLUGIN_HINT})")
        if self.backend not in ("loop", "vectorized"):
            bad("backend", f"must be 'loop' or 'vectorized', got {self.backend!r}")
        if self.device != "auto" and not (self.device == "cpu" or self.device.startswith("cuda")):
            bad("device", f"must be 'auto', 'cpu' or 'cuda[:k]', got {self.device!r}")
        from .strategies import build_strategy
        from .tta import build_local

        build_local(self.local, **self.local_params)  # raises naming local_params and the bad key
        from .strategies.base import set_robust_mixing

        built = build_strategy(self.strategy, **self.strategy_params)
        try:  # a strategy whose own mix would ignore robust mixing is refused (``set_robust_mixing``)
            set_robust_mixing(built, parse_robust_mixing(self.robust_mixing))
        except ValueError as err:
            bad("robust_mixing", str(err))
        for name, method in (("local_params", self.local), ("strategy_params", self.strategy)):
            for key, value in getattr(self, name).items():
                problem = PARAM_RANGES[key].problem(value) if key in PARAM_RANGES and value is not None else None
                if problem:  # as ``registry.build_named`` names a parameter
                    raise ValueError(f"{name}[{key!r}] for {method!r}: {problem}")
        if self.model is not None and self.model not in SOURCE_MODELS:
            bad("model", f"unknown source model {self.model!r}; valid: {sorted(SOURCE_MODELS)}")
        if self.model is not None:  # a model fits the data its dataset's default model was trained on
            trained_on = {m: (s.dataset, s.dataset_kwargs) for m, s in SOURCE_MODELS.items()}
            fits = sorted(m for m, t in trained_on.items() if t == trained_on[DATASET_DEFAULTS[self.dataset]["model"]])
            if self.model not in fits:
                spec = SOURCE_MODELS[self.model]
                size = f" at size {spec.dataset_kwargs['size']}" if "size" in spec.dataset_kwargs else ""
                bad("model", f"source model {self.model!r} was trained on {spec.dataset}{size} and does not fit "
                             f"dataset {self.dataset!r} (models that do: {fits}; leave model unset for the default)")

    @property
    def corruption_list(self) -> List[str]:
        """The corruption names in stream order."""
        from .corruptions import CORRUPTIONS

        return list(CORRUPTIONS) if self.corruptions == ALL_CORRUPTIONS else list(self.corruptions)

    @property
    def model_name(self) -> str:
        """The source model (default for the dataset unless given)."""
        return self.model or DATASET_DEFAULTS[self.dataset]["model"]

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-friendly dict (without the fields of ``UNWRITTEN_AT_DEFAULT`` at their defaults)."""
        data = json.loads(json.dumps(dataclasses.asdict(self), default=list))
        return {k: v for k, v in data.items() if not (k in UNWRITTEN_AT_DEFAULT and v == LATER_FIELDS[k])}

    def identity(self) -> Dict[str, Any]:
        """``to_dict`` without the fields this config's scenario does not read: what determines the results.
        Stored runs are keyed and matched by it, so a changed default of an unread field does not orphan them."""
        return identity_of(self.to_dict())

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "ExperimentConfig":
        """Build from a mapping (e.g. YAML); anything else (None: an empty file, a list) and unknown keys raise
        ``ValueError`` naming them."""
        from collections.abc import Mapping

        if not isinstance(data, Mapping):
            got = "nothing (an empty file?)" if data is None else f"a {type(data).__name__} ({str(data)[:60]})"
            raise ValueError(f"a config must be a mapping of field names to values, got {got}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in set(data) - names)
        if unknown:
            raise ValueError(f"unknown config field(s) {unknown}; valid: {sorted(names)}")
        return cls(**data)


UNREAD_OUTSIDE_HETEROGENEITY = ("sh", "th", "n_steps")


# fields added after runs were stored: at their default they are left out of the identity, so older runs still match
LATER_FIELDS = {"participation": 1.0, "robust_mixing": "off", "attack": "none"}
# later fields also left out of ``to_dict`` at their defaults: configs, checkpoints and summaries written before they
# existed are equal to today's (compared as they are by resuming runs, presets and studies)
UNWRITTEN_AT_DEFAULT = ("robust_mixing", "attack")


def explicit_strategy_params(strategy: str, params: Dict[str, Any]) -> Dict[str, Any]:
    """``params`` without the entries equal to the strategy's own defaults (``{"window": 10}`` for FedTSA is ``{}``),
    so a sweep that names the default value finds the run stored without it. ``seed`` is always kept: left out, the
    run's seed fills it (``strategy_params``), so an explicit ``seed`` is not a default."""
    import inspect

    from .strategies import STRATEGIES

    if strategy not in STRATEGIES:
        return dict(params)
    signature = inspect.signature(STRATEGIES[strategy]).parameters
    return {k: v for k, v in params.items()
            if k == "seed" or k not in signature or signature[k].default is inspect.Parameter.empty
            or not _same_value(signature[k].default, v)}


def _same_value(a: Any, b: Any) -> bool:
    """``a == b`` for plain values (bool and numbers kept apart: ``True`` is not ``1``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    try:
        return bool(a == b)
    except Exception:  # e.g. arrays: never treated as a default
        return False


def identity_of(config: Dict[str, Any]) -> Dict[str, Any]:
    """``ExperimentConfig.identity`` of a stored config dict (e.g. a summary's ``config``): strategy parameters
    at the strategy's defaults are left out (``explicit_strategy_params``)."""
    out = {k: v for k, v in config.items() if not (k in LATER_FIELDS and v == LATER_FIELDS[k])}
    if out.get("strategy_params"):
        out["strategy_params"] = explicit_strategy_params(out["strategy"], out["strategy_params"])
    if config.get("scenario") == "heterogeneity":
        return out
    return {k: v for k, v in out.items() if k not in UNREAD_OUTSIDE_HETEROGENEITY}


@dataclass
class Results:
    """Tidy per-(step, client) table, W over time [T, N, N] and the summary dict."""

    steps: pd.DataFrame
    collaboration: np.ndarray
    summary: Dict[str, Any]

    def accuracy_table(self, by: str = "domain") -> pd.DataFrame:
        """Accuracies (%) of source, local and mixed predictions grouped by ``by``."""
        g = self.steps.groupby(by)[["n", "correct_source", "correct_local", "correct_mixed"]].sum()
        return pd.DataFrame({k: 100 * g[f"correct_{k}"] / g["n"] for k in ("source", "local", "mixed")})


def load_results(out: Path) -> Results:
    """Read a finished run folder written by ``run_experiment(out=...)`` / ``python -m ftta_core run``; its files
    are checked against the digests its summary records (``runstore.integrity_problem``; a folder written before
    digests existed is read unchecked): a damaged one raises ``DamagedRun`` naming it."""
    out = Path(out)
    summary = json.loads((out / "summary.json").read_text())
    problem = integrity_problem(out / "summary.json", summary)
    if problem:
        raise DamagedRun(f"{problem}: the stored run is damaged; --overwrite runs it again")
    steps = pd.read_csv(out / "steps.csv")
    collab = np.load(out / "collaboration.npz")["W"]
    return Results(steps, collab, without_integrity(summary))


def accuracy_by(steps: pd.DataFrame, column: str) -> Dict[str, Dict[str, float]]:
    """Accuracies (%) after mixing, after local adaptation and of the source, per value of ``column``."""
    g = steps.groupby(column)[["n", "correct_source", "correct_local", "correct_mixed"]].sum()
    return {kind: {str(k): float(100 * g.at[k, f"correct_{kind}"] / g.at[k, "n"]) for k in g.index}
            for kind in ("mixed", "local", "source")}


def summarize(steps: pd.DataFrame, cfg: ExperimentConfig, wall_s: float, device: str, upload_bytes: int,
              classes: Optional[ClassTally] = None, server_threads: int = 0,
              code: Optional[Dict[str, Any]] = None) -> dict:
    """Headline numbers, per-domain and (with ``classes``) per-class accuracies, the config, versions, device and
    wall time (with the torch and server threads it was measured with), and the code that made the run
    (``build.code_record``; computed now unless given, e.g. as recorded when the run started).

    Which prediction each accuracy counts, per step: ``accuracy`` the one after the local step and the server's mix
    (``LocalMethod.predict`` on the mixed model: under ``bn="running"`` in eval mode with the running statistics);
    ``accuracy_local`` the logits of the adaptation forward itself, before the optimiser step and the mix (under
    ``bn="running"`` a train-mode forward, normalised with the batch's own statistics); ``accuracy_source`` the frozen
    source model. So under ``bn="running"`` even a Local run's two accuracies differ: they normalise differently
    and one is taken after the step. With an ``attack``, also ``accuracy_honest`` (after mixing, over the clients
    that are not attackers) and ``attackers`` (their ids)."""
    from .engine.attacks import parse_attack

    n = steps["n"].sum()
    summary = {
        "accuracy": 100 * steps["correct_mixed"].sum() / n, "accuracy_local": 100 * steps["correct_local"].sum() / n,
        "accuracy_source": 100 * steps["correct_source"].sum() / n, "n_predictions": int(n),
        "accuracy_by_domain": accuracy_by(steps, "domain"), **(classes.summary() if classes is not None else {}),
        "rejected_uploads": int(steps["rejected"].sum()), "absent_uploads": int(steps["absent"].sum()),
        "upload_bytes_per_client_step": upload_bytes,
        "config": cfg.to_dict(), "versions": {"ftta": __import__("ftta_core").__version__,
                                              "torch": torch.__version__, "numpy": np.__version__,
                                              "python": platform.python_version()},
        "device": device, "wall_time_s": round(wall_s, 2), "threads": torch.get_num_threads(),
        "server_threads": server_threads, "code": code or code_record(cfg.local, cfg.strategy, cfg)}
    attack = parse_attack(cfg.attack)
    if attack is not None:  # the clients the attack is against: everyone but the attackers, after mixing
        honest = steps[~steps["client"].isin(attack.clients)] if len(steps) else steps
        n_honest = honest["n"].sum() if len(honest) else 0
        summary["accuracy_honest"] = 100 * honest["correct_mixed"].sum() / n_honest if n_honest else float("nan")
        summary["attackers"] = list(attack.clients)
    return summary


def run_experiment(cfg: ExperimentConfig, out: Optional[Path | str] = None, progress: bool = False,
                   data_root: Optional[str] = None, stream: Optional[Stream] = None,
                   server_threads: Optional[int] = None, overwrite: bool = False,
                   reuse_stale: bool = False) -> Results:
    """Run ``cfg``; with ``out``, write steps.csv / collaboration.npz / summary.json and resume if interrupted
    (``runstore``: the folder is locked while the run writes it; a finished run of the same config is read back,
    not run again; a finished run of another config is replaced only with ``overwrite``; a finished run made by
    code whose meaning changed since, a stale one, is refused unless ``reuse_stale`` reads it back anyway or
    ``overwrite`` runs it again).
    ``server_threads``: threads for server rounds computed ahead (``Engine.prefetch``; 0: none; None: on a CPU
    torch's thread count, and the clients then run on half of it; on a GPU two, ``default_server_threads``). An execution setting like the thread count: W is the
    same bit for bit; the clients' predictions differ at most by the float rounding of their own thread count."""
    if out is None:
        return _run(cfg, None, progress, data_root, stream, server_threads)
    from .runstore import RunLock

    if str(out).strip() == "":
        raise ValueError("out: an empty path would write into the current folder; name a run folder")
    with RunLock(out):
        writer = RunWriter(Path(out), cfg, overwrite, reuse_stale)
        if writer.finished():
            return load_results(Path(out))
        return _run(cfg, writer, progress, data_root, stream, server_threads)


def _run(cfg: ExperimentConfig, writer: Optional["RunWriter"], progress: bool, data_root: Optional[str],
         stream: Optional[Stream], server_threads: Optional[int]) -> Results:
    """``run_experiment``'s loop (with ``writer``: resumed from and committed to its folder)."""

    code = code_record(cfg.local, cfg.strategy, cfg)  # the code as it is when the run starts
    with build_run(cfg, stream=stream, data_root=data_root, server_threads=server_threads) as run:
        engine, recorder = run.engine, run.recorder()
        start = 0
        if writer is not None:
            start, recorder.rows, recorder.weights = writer.resume(engine)
            recorder.classes, recorder.upload_bytes = writer.classes, writer.upload_bytes
        t0 = time.perf_counter()
        for t in run.steps(start, progress=progress):
            with record_function("ftta.step"):  # the whole step, recording included
                with record_function("ftta.stream"):
                    batch = run.stream.batch(t)
                recorder.add(engine.step(batch))
                if recorder.slot_done(t, run.n_steps):
                    if writer is not None:
                        writer.commit(engine, t + 1, recorder.slot_rows, recorder.slot_weights, recorder.classes,
                                      recorder.upload_bytes)
                    recorder.close_slot()
    summary = summarize(recorder.table(), cfg, time.perf_counter() - t0, run.device, recorder.upload_bytes,
                        recorder.classes, engine.rounds_ahead_threads, code)
    results = Results(recorder.table(), recorder.collaboration(), summary)
    if writer is not None:
        writer.finish(results.steps, results.collaboration, summary)
    return results


class RunWriter:
    """Writes a run folder slot by slot so that a crash at any instant leaves a resumable or a complete run
    (``runstore`` explains the write order), and checks every file it resumes from or reads back against the digest
    recorded for it: the checkpoint vouches for the bytes of ``steps.csv`` and each W part (and carries its own
    payload's digest), the summary for ``steps.csv`` and ``collaboration.npz``. An unfinished run with a damaged file
    starts again from step 0 (one line names the file); a finished one is refused unless ``overwrite``. Use under
    ``runstore.RunLock`` (``run_experiment`` does)."""

    FINISHED_FILES = ("steps.csv", "collaboration.npz")  # what a finished run's summary vouches for

    def __init__(self, out: Path, cfg: ExperimentConfig, overwrite: bool = False, reuse_stale: bool = False) -> None:
        self.out, self.cfg, self.overwrite, self.reuse_stale = out, cfg, overwrite, reuse_stale
        self.steps_csv, self.ckpt, self.parts = out / "steps.csv", out / "checkpoint.pt", out / "collaboration_parts"
        self.summary_json, self.collab = out / "summary.json", out / "collaboration.npz"
        # per-class totals of the committed steps; None after resuming a checkpoint written without them
        self.classes: Optional[ClassTally] = ClassTally()
        # the recorder's upload size per client and step at the last committed step (restored by ``resume``)
        self.upload_bytes = 0
        self.part_digests: Dict[str, str] = {}  # "collaboration_parts/NAME.npy" -> sha256, for the checkpoint
        with writing(out, "the run folder"):
            out.mkdir(parents=True, exist_ok=True)
            self.remove_temporaries()

    def remove_temporaries(self) -> None:
        """Delete the temporary files of writes a kill interrupted (``.NAME.PID.XXXX.tmp``, ``atomic_write``): the
        folder is locked by this run (``RunLock``), so no other writer is using them."""
        for folder in (self.out, self.parts):
            for tmp in folder.glob(".*.tmp") if folder.is_dir() else ():
                tmp.unlink(missing_ok=True)

    def _other_config(self, stored: Dict[str, Any], what: str) -> None:
        """Raise (or, with ``overwrite``, clear the folder) when ``stored`` is not this run's config."""
        want = self.cfg.to_dict()
        if stored == want:
            return
        if not self.overwrite:
            diff = sorted(k for k in set(stored) | set(want) if stored.get(k) != want.get(k))
            first = diff[0] if diff else "?"
            raise RunStoreError(f"{self.out} holds {what} of another config ({len(diff)} field(s) differ, e.g. "
                                f"{first}: {stored.get(first)!r} there, {want.get(first)!r} here); use another "
                                "--out, or --overwrite to replace it")
        self.clear()

    def _stale(self, summary: Dict[str, Any]) -> None:
        """Refuse a finished run made by code whose meaning changed since (``runstore.stale_modules``): one line
        naming what changed, unless ``reuse_stale`` (read it back) or ``overwrite`` (clear the folder, run again)."""
        from .runstore import stale_modules

        changed = stale_modules(summary.get("code"))
        if not changed or self.reuse_stale:
            return
        if not self.overwrite:
            shown = ", ".join(changed[:4]) + (" ..." if len(changed) > 4 else "")
            raise RunStoreError(f"{self.out} holds a finished run made by code that has changed since ({shown}); "
                                "--overwrite runs it again, --reuse-stale reads it back as it is")
        self.clear()

    def clear(self) -> None:
        """Delete the run's files (summary first: an interrupted clear leaves no complete-looking run)."""
        with writing(self.out, "(deleting) the run's files"):
            for p in (self.summary_json, self.ckpt, self.collab, self.steps_csv):
                p.unlink(missing_ok=True)
            if self.parts.exists():
                shutil.rmtree(self.parts)
        self.classes, self.upload_bytes, self.part_digests = ClassTally(), 0, {}

    def finished(self) -> bool:
        """True when the folder holds this config's finished run (it is read back, not run again). A summary or a
        file it vouches for that fails its digest raises ``DamagedRun`` naming it (``overwrite``: run it again)."""
        if not self.summary_json.exists():
            return False
        try:
            summary = json.loads(self.summary_json.read_text())
        except ValueError:
            summary = {}
        stored = summary.get("config") if isinstance(summary, dict) else None
        problem = (f"{self.summary_json} cannot be read" if stored is None
                   else integrity_problem(self.summary_json, summary))
        if problem and not self.overwrite:
            raise DamagedRun(f"{problem}: the stored run is damaged; --overwrite runs it again (or delete {self.out})")
        if problem:
            log.warning("%s: the stored run is damaged; running it again", problem)
            self.clear()
            return False
        self._other_config(stored, "a finished run")
        if not self.summary_json.exists():  # cleared by --overwrite
            return False
        self._stale(summary)
        if not self.summary_json.exists():  # stale, cleared by --overwrite
            return False
        with writing(self.out, "(deleting) the resume state"):
            self.ckpt.unlink(missing_ok=True)  # resume state left by a kill after the summary was written
            if self.parts.exists():
                shutil.rmtree(self.parts)
        return True

    def _restart(self, problem: str) -> tuple[int, List[dict], List[np.ndarray]]:
        """Start again from step 0 after ``problem`` (a damaged file, named in one line): nothing committed can be
        trusted without it, and a run is deterministic, so the result is the same."""
        log.warning("%s; %s starts again from step 0, its last intact state (the result is the same)", problem,
                    self.out)
        self.clear()
        return 0, [], []

    def _unvouched(self, state: Dict[str, Any]) -> Optional[str]:
        """Why the rows or W parts the checkpoint ``state`` vouches for cannot be used (a file missing, short or
        not matching its digest), naming the file; None when they are intact. Checkpoints written before digests
        existed vouch for byte counts only."""
        size = state.get("csv_bytes")
        have = self.steps_csv.stat().st_size if self.steps_csv.exists() else 0
        if size is not None and have < size:
            return f"{self.steps_csv} is damaged (it has {have} bytes, its checkpoint vouches for {size})"
        for name, digest in state.get("files", {}).items():
            path = self.out / name
            if not path.is_file():
                return f"{path} is missing (its checkpoint vouches for it)"
            if file_sha256(path, size if name == "steps.csv" else None) != digest:
                return f"{path} is damaged (it does not match the sha256 its checkpoint records)"
        return None

    def resume(self, engine: Engine):
        """Restore engine state, completed rows and per-class totals (``self.classes``); returns
        (next_step, rows, weights). A damaged checkpoint, row or W part (named in one line) restarts from step 0."""
        if not self.ckpt.exists():
            self.clear()  # rows or W written before the first checkpoint are not covered by one
            return 0, [], []
        try:
            state = load_checkpoint(self.ckpt)
        except DamagedRun as err:
            return self._restart(str(err))
        self._other_config(state["config"], "an unfinished run")
        if not self.ckpt.exists():  # cleared by --overwrite
            return 0, [], []
        problem = self._unvouched(state)
        nxt = state["next_step"]
        parts = sorted(p for p in self.parts.glob("*.npy") if int(p.stem) <= nxt)
        try:
            weights = [w for p in parts for w in np.load(p)][:nxt] if not problem else []
        except (OSError, ValueError, EOFError) as err:
            problem = f"{self.parts} holds an unreadable part ({type(err).__name__}: {err})"
        if not problem and len(weights) != nxt:
            problem = f"{self.parts} is damaged (it holds W of {len(weights)} steps, its checkpoint vouches for {nxt})"
        if problem:
            return self._restart(problem)
        engine.load_state_dict(state["engine"])
        self.classes = ClassTally.from_state(state["classes"]) if "classes" in state else None
        self.upload_bytes = int(state.get("upload_bytes", 0))
        self.part_digests = {k: v for k, v in state.get("files", {}).items() if k != "steps.csv"}
        size = state.get("csv_bytes")
        with writing(self.out, "steps.csv (dropping rows after the checkpoint)"):
            if size is not None:  # drop what was appended after the checkpoint (a row cut by a kill included)
                with open(self.steps_csv, "r+b") as fh:
                    fh.truncate(size)
                table = pd.read_csv(self.steps_csv) if size else pd.DataFrame()
            else:  # a checkpoint written before byte counts were recorded
                table = pd.read_csv(self.steps_csv) if self.steps_csv.exists() else pd.DataFrame()
                table = table[table["step"] < nxt] if len(table) else table
                atomic_write(self.steps_csv, lambda fh: fh.write(table.to_csv(index=False).encode()))
        return nxt, table.to_dict("records"), weights

    def commit(self, engine: Engine, next_step: int, rows: List[dict], weights: List[np.ndarray],
               classes: Optional[ClassTally] = None, upload_bytes: int = 0) -> None:
        """Append a finished slot: rows (fsync-ed), W, then the checkpoint, written atomically last with the byte
        length and digest of ``steps.csv`` it covers, the digest of every W part, and the recorder's state
        (per-class totals, upload size): a run killed after its last commit resumes to the summary it would have
        written. A full disk or a permission error ends in one line (``runstore.RunWriteError``)."""
        with writing(self.out, f"the rows, W and checkpoint of steps up to {next_step}"):
            have = self.steps_csv.stat().st_size if self.steps_csv.exists() else 0
            text = pd.DataFrame(rows).to_csv(header=have == 0, index=False).encode()
            with open(self.steps_csv, "ab") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            self.parts.mkdir(exist_ok=True)
            buf = io.BytesIO()
            np.save(buf, np.stack(weights).astype(np.float32))
            block, name = buf.getvalue(), f"{self.parts.name}/{next_step:08d}.npy"
            atomic_write(self.out / name, lambda fh: fh.write(block))
            self.part_digests[name] = hashlib.sha256(block).hexdigest()
            csv_bytes = self.steps_csv.stat().st_size
            state = {"config": self.cfg.to_dict(), "engine": engine.state_dict(), "next_step": next_step,
                     "csv_bytes": csv_bytes, "upload_bytes": int(upload_bytes),
                     "files": {"steps.csv": file_sha256(self.steps_csv, csv_bytes), **self.part_digests}}
            if classes is not None:
                state["classes"] = classes.state()
            data = checkpoint_bytes(state)
            atomic_write(self.ckpt, lambda fh: fh.write(data))

    def finish(self, table: pd.DataFrame, collab: np.ndarray, summary: dict) -> None:
        """Write W and then the summary (atomically, last: it marks the run complete), sealed with its own digest
        and those of ``steps.csv`` and ``collaboration.npz``; drop the resume state. ``steps.csv`` already holds
        every row (appended slot by slot) and is not rewritten."""
        with writing(self.out, "the finished run's collaboration.npz and summary.json"):
            if not self.steps_csv.exists():  # a run of zero steps
                atomic_write(self.steps_csv, lambda fh: fh.write(table.to_csv(index=False).encode()))
            atomic_write(self.collab, lambda fh: np.savez_compressed(fh, W=collab.astype(np.float32),
                                                                      steps=np.arange(len(collab))))
            atomic_write_text(self.summary_json, sealed_summary_text(summary, self.out, self.FINISHED_FILES, indent=2))
            self.ckpt.unlink(missing_ok=True)
            if self.parts.exists():
                shutil.rmtree(self.parts)


def run_strategies(cfg: ExperimentConfig, strategies: Sequence[str], progress: bool = False,
                   data_root: Optional[str] = None, server_threads: Optional[int] = None) -> Dict[str, Results]:
    """Run ``cfg`` once per strategy in one pass over the stream, sharing the stateless local phase.

    Valid for local methods that train nothing and carry no state (``bn``, ``source``): the source pass and the
    batch-statistics pass are computed once per step for all strategies. Each result equals
    ``run_experiment(replace(cfg, strategy=name))`` (tested); configs per strategy are in each summary.
    """
    built = {name: build_strategy_for(cfg, name) for name in strategies}
    cfgs = {name: dataclasses.replace(cfg, strategy=name, strategy_params={}) for name in strategies}
    with build_run(cfg, strategy=built[strategies[0]], data_root=data_root, server_threads=server_threads) as run:
        engine = run.engine
        for s in built.values():
            s.reset(cfg.clients)
        recorders = {name: run.recorder() for name in strategies}
        t0 = time.perf_counter()
        for t in run.steps(progress=progress, strategies=built):
            for name, res in engine.step_strategies(run.stream.batch(t), built).items():
                recorders[name].add(res)
    wall = (time.perf_counter() - t0) / len(strategies)
    out = {}
    for name, rec in recorders.items():
        rec.close_slot()
        table = rec.table()
        summary = summarize(table, cfgs[name], wall, run.device, rec.upload_bytes, rec.classes,
                            engine.rounds_ahead_threads)
        summary["shared_pass"] = list(strategies)
        out[name] = Results(table, np.stack(rec.weights), summary)
    return out
