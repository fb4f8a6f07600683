"""The one grid runner: every study's runs of variants x seeds, looked up where they are kept, planned, run, kept and
returned as one tidy table.

``run(base, variants, seeds, store)`` is the single implementation behind every grid (``workbook.run_grid``,
``run_strategy_grid``, ``strategy_comparison``, ``run_stored`` and ``stored_summaries``, ``plan_runner.run_job``, the
studies' live grids, the leaderboard). A variant is a ``variants.Variant`` (or a plain mapping of config overrides);
each (variant, seed) is a ``Cell`` holding its config. For every cell the runner

1. looks the run up in its ``Store`` (``find``);
2. when it is missing: plans it instead, if the store plans (``$FTTA_PLAN``: ``plan.add_to_plan``, the job format
   ``plan_runner`` runs); or runs it: the missing strategies of one seed that differ only by name share one pass of a
   stateless local method (``experiment.run_strategies``; ``shared_pass``: from how many of them), every other run
   goes alone, through a resumable folder where the store keeps runs on disk (``resumable_run``);
3. keeps what it ran (``put``) and gives one row per run: ``variant`` (the label, for display only: never parsed),
   ``seed``, the store's measures and one column per factor of the variants (``variants.with_factors``).

Three stores: ``SummaryStore`` (a summary per run, ``results_dir/<config_key>.json``, plus ``also_read`` folders read
only; without a folder nothing is kept), ``FolderStore`` (a compact folder per run, ``out_dir/<label>/summary.json +
collaboration.npz + slots.csv``, for figures that need W) and ``MemoryStore`` (a dict the caller keeps, for variants
that hold live objects, e.g. a tensor of probe images, which no file can hold; ``run_live``).

Why one module beside ``workbook``: the workbook holds the notebooks' analysis (tables of stored runs, seeds,
papers); this module holds everything that decides where a run is kept and whether it runs, under one set of names,
below the workbook and ``plan_runner`` in the layers (``pyproject.toml``). The workbook keeps its former names.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from .build import build_run, build_stream, resolve_device
from .experiment import ExperimentConfig, Results, build_scenario, identity_of, run_experiment, run_strategies
from .loop import SharedPassError
from .plan import add_to_plan, plan_file
from .project import layout
from .progress import progress_bar, progress_line, progress_wanted
from .runstore import atomic_write, atomic_write_text, read_summary, stale_modules, store_summary, usable
from .stream import Stream
from .variants import overrides_of, with_factors

SUMMARY_KEYS = ("accuracy", "accuracy_local", "accuracy_source", "wall_time_s", "upload_bytes_per_client_step")
LIVE_KEYS = ("accuracy", "accuracy_local", "accuracy_source", "self weight")  # a MemoryStore's measures
SHARED_PASS_LOCALS = ("bn", "source")  # local methods whose strategies share one pass (TTA-bn, source)


# ---------------------------------------------------------------------------------------------------------------
# where a run is kept: its config hash, its resumable folder, its summary

def config_key(cfg: ExperimentConfig) -> str:
    """A short stable hash of what determines a config's results (``ExperimentConfig.identity``): the cache key."""
    return hashlib.sha1(json.dumps(cfg.identity(), sort_keys=True).encode()).hexdigest()[:16]


def partial_dir(cfg: ExperimentConfig) -> Path:
    """Where a grid keeps an unfinished run (``run_experiment``'s resumable folder) until its summary is stored:
    ``$FTTA_PARTIAL_DIR/<config hash>``, by default the project's scratch folder's ``partial/``
    (``project.layout().partial_runs``: ``runs/partial/`` here, not tracked). A grid interrupted mid-run resumes that
    run from its last completed slot."""
    root = os.environ.get("FTTA_PARTIAL_DIR")
    return (Path(root) if root else layout().partial_runs) / config_key(cfg)


CODE_MARK = "code.json"  # beside a resumable run: the code record it started with


def resumable_run(cfg: ExperimentConfig, folder: Path, progress: bool = False) -> Results:
    """``run_experiment(cfg, out=folder)`` that never mixes code: the record of the code the run starts with is kept
    beside it (``code.json``), and a run left there (unfinished, or finished but not yet collected) by code that has
    changed since, or by code not recorded, is cleared and made again instead of resumed or read back (it would be
    stored as today's). A run during which the code changed raises ``RunStoreError`` and is stored nowhere. A
    finished run left there whose files fail their digests (``runstore.DamagedRun``) is made again, with a warning
    naming the damaged file."""
    from .build import code_record
    from .experiment import RunWriter
    from .runstore import DamagedRun, RunLock, RunStoreError, writing

    folder, mark = Path(folder), Path(folder) / CODE_MARK
    with RunLock(folder):  # the same lock run_experiment takes: never clear a folder another process is running
        try:
            known = json.loads(mark.read_text()) if mark.exists() else None
        except ValueError:  # a damaged mark: the code that made the run is unknown
            known = None
        if known is None or stale_modules(known):
            RunWriter(folder, cfg).clear()
            known = code_record(cfg.local, cfg.strategy, cfg)
            with writing(folder, CODE_MARK):
                atomic_write_text(mark, json.dumps(known))
    try:
        res = run_experiment(cfg, out=folder, progress=progress)
    except DamagedRun:  # a resumable folder holds nothing else: made again (one warning names the damaged file)
        res = run_experiment(cfg, out=folder, progress=progress, overwrite=True)
    changed = stale_modules(known)
    if changed:
        raise RunStoreError(f"{folder}: the code changed while the run ran ({', '.join(changed[:3])}); nothing was "
                            "stored, run it again")
    return res


def stored_path(cfg: ExperimentConfig, results_dir: Optional[Path], also_read: Sequence[Path] = ()) -> Optional[Path]:
    """Where ``cfg``'s stored summary is: under ``results_dir``, else in the first of ``also_read`` that has it;
    None if nowhere."""
    name = f"{config_key(cfg)}.json"
    folders = ([] if results_dir is None else [Path(results_dir)]) + [Path(f) for f in also_read]
    return next((f / name for f in folders if usable(f / name)), None)


def same_domain_weight(weights: np.ndarray, cfg: ExperimentConfig, steps: Optional[slice] = None) -> pd.DataFrame:
    """How client i's weight in W [T, N, N] splits between itself, peers on the same domain at that step and the
    others, averaged over ``steps`` (default: all; rows: clients); ``uniform same-domain`` is the share FedAvg
    would give those peers. Domains come from ``cfg``'s scenario, step by step."""
    scenario = build_scenario(cfg)
    w = np.asarray(weights)
    chosen = range(w.shape[0])[steps] if steps is not None else range(w.shape[0])
    rows = []
    for i in range(w.shape[1]):
        same, uniform = [], []
        for t in chosen:
            dom = scenario.domains_at(t)
            peers = (dom == dom[i]) & (np.arange(len(dom)) != i)
            same.append(w[t, i, peers].sum())
            uniform.append(peers.sum() / len(dom))
        own = float(np.mean([w[t, i, i] for t in chosen]))
        rows.append({"client": i, "self": own, "same domain": float(np.mean(same)),
                     "other domains": float(1 - own - np.mean(same)), "uniform same-domain": float(np.mean(uniform))})
    return pd.DataFrame(rows).set_index("client")


def grid_summary(res: Results, cfg: ExperimentConfig) -> Dict[str, Any]:
    """What a grid stores of a run: its summary and ``weight_shares``, how W splits on average over steps and
    clients (``same_domain_weight``: self, same domain, other domains, and the uniform same-domain share), so a
    grid of summaries can say how personal each run's mixing was without keeping W."""
    shares = same_domain_weight(res.collaboration, cfg).mean()
    return {**res.summary, "weight_shares": {k: round(float(v), 6) for k, v in shares.items()}}


# ---------------------------------------------------------------------------------------------------------------
# a run kept as a compact folder (``FolderStore``)

@dataclasses.dataclass
class StoredRun:
    """A run kept compactly for figures: summary, W over time [T, N, N] and per-(slot, client) accuracies."""

    summary: Dict[str, Any]
    collaboration: np.ndarray
    slots: pd.DataFrame


def slot_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (slot, client, domain): predictions and accuracies (%) of source, local and mixed predictions."""
    g = steps.groupby(["slot", "client", "domain"], as_index=False)[
        ["n", "correct_source", "correct_local", "correct_mixed"]].sum()
    for kind in ("source", "local", "mixed"):
        g[f"accuracy_{kind}"] = 100 * g.pop(f"correct_{kind}") / g["n"]
    return g


def strategy_spec(spec: str) -> Tuple[str, Dict[str, Any]]:
    """A strategy named with its parameters, as ``run_stored`` and ``study fedtsa case-study --strategies`` take it:
    ``"fedctta"`` -> ``("fedctta", {})``, ``"fedctta@probe_bn=eval,ema=0.9"`` -> ``("fedctta", {"probe_bn": "eval",
    "ema": 0.9})`` (values read as YAML scalars). The spec is also the run's folder name."""
    import yaml

    name, _, rest = spec.partition("@")
    params: Dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"strategy {spec!r}: expected name@key=value[,key=value...], got {item!r}")
        params[key.strip()] = yaml.safe_load(value)
    if not name or (rest and not params):
        raise ValueError(f"strategy {spec!r}: expected name or name@key=value[,key=value...]")
    return name, params


def keep_compact(folder: Path, res: Results) -> None:
    """A run's compact folder: W (float32), the per-slot table, then the summary (written last: a folder with one is
    complete, ``runstore``)."""
    (folder / "summary.json").unlink(missing_ok=True)
    atomic_write(folder / "collaboration.npz", lambda fh: np.savez_compressed(fh, W=res.collaboration.astype(np.float32)))
    atomic_write(folder / "slots.csv", lambda fh: fh.write(slot_table(res.steps).to_csv(
        index=False, float_format="%.4f").encode()))
    store_summary(folder / "summary.json", res.summary, files=("collaboration.npz", "slots.csv"))  # sealed


def read_stored(out_dir: Path, names: Sequence[str]) -> Dict[str, StoredRun]:
    """The runs kept as compact folders ``out_dir/<name>/`` for those of ``names`` that are there (no config check,
    nothing runs)."""
    out_dir = Path(out_dir)
    return {s: StoredRun(read_summary(out_dir / s / "summary.json"),
                         np.load(out_dir / s / "collaboration.npz")["W"], pd.read_csv(out_dir / s / "slots.csv"))
            for s in names if (out_dir / s / "summary.json").exists()}


# ---------------------------------------------------------------------------------------------------------------
# a run in memory (``MemoryStore``)

def run_live(cfg: ExperimentConfig, strategy: Optional[Any] = None, stream: Optional[Stream] = None) -> Results:
    """Run ``cfg`` in memory (no files): its strategy built from the config (whose ``strategy_params`` may hold live
    objects, e.g. a tensor of probe images) or given as an object; the tidy steps table, W over time and a short
    summary. Built by ``build_run`` like ``run_experiment``: the same config gives the same table and W."""
    with build_run(cfg, stream=stream, strategy=strategy) as run:
        recorder = run.recorder()
        for t in run.steps():
            recorder.add(run.engine.step(run.stream.batch(t)))
        recorder.close_slot()
    table = recorder.table()
    n = table["n"].sum()
    summary = {f"accuracy{suffix}": 100 * table[f"correct_{kind}"].sum() / n
               for suffix, kind in (("", "mixed"), ("_local", "local"), ("_source", "source"))}
    summary["absent_uploads"] = int(table["absent"].sum())
    return Results(table, recorder.collaboration(),
                   {**summary, "steps": run.n_steps, "strategy": run.engine.strategy.name})


def _storable(value: Any) -> bool:
    """Whether a parameter value can be written to a file (JSON); a tensor cannot."""
    try:
        json.dumps(value, default=list)
    except (TypeError, ValueError):
        return False
    return True


def live_key(cfg: ExperimentConfig) -> Tuple[str, Tuple[Tuple[str, int], ...]]:
    """A run's key in a ``MemoryStore``: the config hash with the strategy parameters a file can hold (those at the
    strategy's defaults left out, ``config_key``), and the others (live objects) by identity."""
    live = {k: v for k, v in cfg.strategy_params.items() if not _storable(v)}
    plain = {k: v for k, v in cfg.strategy_params.items() if k not in live}
    return (config_key(dataclasses.replace(cfg, strategy_params=plain)),
            tuple(sorted((k, id(v)) for k, v in live.items())))


# ---------------------------------------------------------------------------------------------------------------
# the grid: cells, stores, the runner

@dataclass(frozen=True)
class Cell:
    """One run of a grid: its number (1-based, in the grid's order), the variant's label and the variant, the seed
    and the config they give."""

    number: int
    name: str
    variant: Any
    seed: int
    config: ExperimentConfig


def grid_cells(base: ExperimentConfig, variants: Mapping[str, Any], seeds: Sequence[int],
               by_seed: bool = False) -> List[Cell]:
    """Every (variant, seed) of a grid with its config (``base`` with the variant's overrides and the seed), variant
    by variant, or seed by seed with ``by_seed``."""
    pairs = [(n, s) for s in seeds for n in variants] if by_seed else [(n, s) for n in variants for s in seeds]
    return [Cell(i, n, variants[n], s, dataclasses.replace(base, **overrides_of(variants[n]), seed=s))
            for i, (n, s) in enumerate(pairs, 1)]


class Store:
    """Where a grid keeps its runs and how it makes one alone; the measures its table gives of each. This base is
    what every store shares: a run alone is ``run_experiment`` (in a resumable folder, ``partial_dir``, when the
    store keeps runs on disk), and its measures are ``SUMMARY_KEYS``."""

    plans = False  # a missing run is planned under $FTTA_PLAN instead of run
    resumable = False  # a run made alone goes through a resumable folder, removed once the run is kept
    by_seed = False  # runs go seed by seed (they share data per seed)
    measures: Tuple[str, ...] = SUMMARY_KEYS

    def find(self, cell: Cell) -> Optional[Dict[str, Any]]:
        """The stored record of ``cell``'s run, or None."""
        raise NotImplementedError

    def put(self, cell: Cell, res: Results) -> Dict[str, Any]:
        """Keep a run just made; returns its record (what ``find`` gives from then on)."""
        raise NotImplementedError

    def plan(self, cell: Cell, strategies: Sequence[str] = ()) -> None:
        """Plan ``cell``'s run (with ``strategies``: one shared pass for them) instead of running it."""
        raise NotImplementedError(f"{type(self).__name__} plans nothing")

    def run(self, cell: Cell, progress: bool) -> Results:
        """Make ``cell``'s run alone."""
        if not self.resumable:
            return run_experiment(cell.config, progress=progress)
        return resumable_run(cell.config, partial_dir(cell.config), progress=progress)

    def row(self, record: Mapping[str, Any]) -> Dict[str, Any]:
        """A record's measures: the columns of its row."""
        return {k: record[k] for k in self.measures if k in record}


class SummaryStore(Store):
    """A summary per run (``grid_summary``) under ``results_dir/<config_key>.json``; ``also_read``: more folders of
    stored runs, read (never written) when ``results_dir`` lacks one (e.g. the Table 1 runs that an ablation's
    default variant equals). Missing runs are planned under ``$FTTA_PLAN``. Without ``results_dir`` nothing is
    kept (or planned): every run is made, not resumable."""

    def __init__(self, results_dir: Optional[Path | str] = None, also_read: Sequence[Path | str] = ()) -> None:
        self.results_dir = None if results_dir is None else Path(results_dir)
        self.also_read = [Path(f) for f in also_read]
        self.plans = self.resumable = self.results_dir is not None

    def find(self, cell: Cell) -> Optional[Dict[str, Any]]:
        found = stored_path(cell.config, self.results_dir, self.also_read)
        return None if found is None else read_summary(found)

    def put(self, cell: Cell, res: Results) -> Dict[str, Any]:
        summary = grid_summary(res, cell.config)
        if self.results_dir is not None:
            store_summary(self.results_dir / f"{config_key(cell.config)}.json", summary)
        return summary

    def plan(self, cell: Cell, strategies: Sequence[str] = ()) -> None:
        add_to_plan(cell.config.to_dict(), self.results_dir, strategies)


class FolderStore(Store):
    """A compact folder per run, ``out_dir/<variant label>/`` (``summary.json``, ``collaboration.npz``,
    ``slots.csv``: small enough to commit; ``read_stored``), read back when its summary's config is the cell's."""

    resumable = True

    def __init__(self, out_dir: Path | str) -> None:
        self.out_dir = Path(out_dir)

    def find(self, cell: Cell) -> Optional[Dict[str, Any]]:
        path = usable(self.out_dir / cell.name / "summary.json")
        summary = None if path is None else read_summary(path)
        return summary if summary is not None and identity_of(summary["config"]) == cell.config.identity() else None

    def put(self, cell: Cell, res: Results) -> Dict[str, Any]:
        keep_compact(self.out_dir / cell.name, res)
        return res.summary


class MemoryStore(Store):
    """Runs kept in ``cache`` (a dict the caller may keep across grids; nothing on disk), for variants whose strategy
    parameters hold live objects no file can hold (a tensor of probe images): a run with the same config, strategy
    and parameters as one in it (``live_key``) is read back. Runs are made by ``run_live``, on one stream per config
    and seed; their measures are the accuracies and W's mean self-weight (its diagonal over steps and clients)."""

    by_seed = True
    measures = LIVE_KEYS

    def __init__(self, cache: Optional[Dict[tuple, dict]] = None) -> None:
        self.cache = {} if cache is None else cache
        self.streams: Dict[str, Stream] = {}

    def find(self, cell: Cell) -> Optional[Dict[str, Any]]:
        return self.cache.get(live_key(cell.config))

    def run(self, cell: Cell, progress: bool) -> Results:
        cfg = cell.config
        key = config_key(dataclasses.replace(cfg, strategy="local", strategy_params={}))
        if key not in self.streams:
            self.streams[key] = build_stream(cfg, resolve_device(cfg.device))
        return run_live(cfg, stream=self.streams[key])

    def put(self, cell: Cell, res: Results) -> Dict[str, Any]:
        record = {**{k: res.summary[k] for k in LIVE_KEYS[:3]},
                  "self weight": float(np.diagonal(res.collaboration, axis1=1, axis2=2).mean())}
        self.cache[live_key(cell.config)] = record
        return record


def _passes(missing: Sequence[Cell], shared_pass: Optional[int]) -> List[List[Cell]]:
    """The missing runs that go in one shared pass: those without strategy parameters whose configs differ only by
    the strategy, when there are at least ``shared_pass`` of them (None: no pass)."""
    if shared_pass is None:
        return []
    passes: Dict[str, List[Cell]] = {}
    for c in missing:
        if not c.config.strategy_params:
            passes.setdefault(config_key(dataclasses.replace(c.config, strategy="local")), []).append(c)
    return [p for p in passes.values() if len(p) >= shared_pass]


def _strategies(cells: Sequence[Cell]) -> List[str]:
    """The strategies of a shared pass, each once."""
    return list(dict.fromkeys(c.config.strategy for c in cells))


def _make(missing: Sequence[Cell], store: Store, shared_pass: Optional[int], total: int,
          progress: bool) -> Dict[int, Tuple[Results, Dict[str, Any]]]:
    """Plan the missing runs (the store plans and ``$FTTA_PLAN`` is set: nothing runs, {}), or make and keep them:
    {cell number: (results, record)}. A shared pass the local method or a strategy cannot share
    (``SharedPassError``) leaves its runs to run alone."""
    passes = _passes(missing, shared_pass)
    if store.plans and plan_file() is not None:
        in_pass = {c.number for p in passes for c in p}
        for p in passes:
            store.plan(p[0], _strategies(p))
        for c in missing:
            if c.number not in in_pass:
                store.plan(c)
        return {}
    made: Dict[int, Tuple[Results, Dict[str, Any]]] = {}
    for p in passes:
        names = _strategies(p)
        progress_line(f"runs of seed {p[0].seed}: {', '.join(names)} in one pass ...", progress)
        try:
            results = run_strategies(p[0].config, names, progress=progress_wanted(progress))
        except SharedPassError:  # the local method trains or carries state, or a strategy regularises
            continue
        made.update({c.number: (results[c.config.strategy], store.put(c, results[c.config.strategy])) for c in p})
    for c in missing:
        if c.number not in made:
            progress_line(f"run {c.number} of {total}: {c.name}, seed {c.seed} ...", progress)
            res = store.run(c, progress_wanted(progress))
            made[c.number] = (res, store.put(c, res))
            if store.resumable:
                shutil.rmtree(partial_dir(c.config), ignore_errors=True)
    return made


def run(base: ExperimentConfig, variants: Mapping[str, Any], seeds: Sequence[int], store: Optional[Store] = None, *,
        keep: bool = False, only_cached: bool = False, shared_pass: Optional[int] = None,
        progress: bool = True) -> pd.DataFrame:
    """Every variant (label -> ``Variant`` or mapping of config overrides) at every seed; one row per run: ``variant``,
    ``seed``, the store's measures (``Store.measures``) and one column per factor of the variants (NaN where a variant
    lacks it).

    ``store``: where runs are looked up and kept (default: ``SummaryStore()``, nothing kept). Runs go variant by
    variant, or seed by seed when a seed's runs share a pass or data (``shared_pass``, ``MemoryStore``); a missing
    run is planned instead when the store plans and ``$FTTA_PLAN`` is set. ``shared_pass``: the missing runs of a
    seed that differ only by strategy (no strategy parameters) share one pass of the local method
    (``run_strategies``) when at least that many (None: every run alone). ``keep``: every run is made again, its
    full ``Results`` in ``attrs['results'][(label, seed)]``. ``only_cached``: nothing runs, the table holds the
    stored runs. ``progress``: a bar over the runs, a line per run started (``progress.progress_line``) and each
    run's own bar."""
    store = SummaryStore() if store is None else store
    todo = grid_cells(base, variants, seeds, by_seed=shared_pass is not None or store.by_seed)
    size = max(1, len(variants)) if shared_pass is not None else 1  # a group: the runs that may share a pass
    rows: List[Dict[str, Any]] = []
    kept: Dict[tuple, Results] = {}
    bar = progress_bar(total=len(todo), desc="runs", requested=progress)
    for group in (todo[i:i + size] for i in range(0, len(todo), size)):
        found = {c.number: None if keep else store.find(c) for c in group}
        missing = [c for c in group if found[c.number] is None]
        made = {} if only_cached or not missing else _make(missing, store, shared_pass, len(todo), progress)
        for c in group:
            if c.number in made:
                res, record = made[c.number]
                if keep:
                    kept[(c.name, c.seed)] = res
            elif found[c.number] is not None:
                record = found[c.number]
            else:
                continue
            rows.append({"variant": c.name, "seed": c.seed, **store.row(record)})
        bar.update(len(group))
    bar.close()
    table = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["variant", "seed", *store.measures])
    table = with_factors(table, variants)
    table.attrs["results"] = kept
    return table


__all__ = ["CODE_MARK", "Cell", "FolderStore", "LIVE_KEYS", "MemoryStore", "SHARED_PASS_LOCALS", "SUMMARY_KEYS",
           "Store", "StoredRun", "SummaryStore", "config_key", "grid_cells", "grid_summary", "keep_compact",
           "live_key", "partial_dir", "read_stored", "resumable_run", "run", "run_live", "same_domain_weight",
           "slot_table", "stored_path", "strategy_spec"]
