"""Notebook-facing helpers: run grids of configs over seeds (cached, resumable) and compare with papers."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import pandas as pd

from .experiment import ExperimentConfig, Results, build_scenario, identity_of, run_experiment
from .plan import REPO_DIR, add_to_plan, plan_file
from .progress import progress_bar, progress_line, progress_wanted
from .runstore import atomic_write, atomic_write_text, read_summary, stale_modules, store_summary, usable
from .scenarios import CASE_STUDY_GROUPS

SUMMARY_KEYS = ("accuracy", "accuracy_local", "accuracy_source", "wall_time_s", "upload_bytes_per_client_step")


def config_key(cfg: ExperimentConfig) -> str:
    """A short stable hash of what determines a config's results (``ExperimentConfig.identity``): the cache key."""
    return hashlib.sha1(json.dumps(cfg.identity(), sort_keys=True).encode()).hexdigest()[:16]


def partial_dir(cfg: ExperimentConfig) -> Path:
    """Where a grid keeps an unfinished run (``run_experiment``'s resumable folder) until its summary is stored:
    ``$FTTA_PARTIAL_DIR/<config hash>``, by default ``runs/partial/`` in the repository (not tracked). A grid
    interrupted mid-run resumes that run from its last completed slot."""
    root = os.environ.get("FTTA_PARTIAL_DIR")
    return (Path(root) if root else REPO_DIR / "runs" / "partial") / config_key(cfg)


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


def grid_summary(res: "Results", cfg: ExperimentConfig) -> Dict[str, Any]:
    """What a grid stores of a run: its summary and ``weight_shares``, how W splits on average over steps and
    clients (``same_domain_weight``: self, same domain, other domains, and the uniform same-domain share), so a
    grid of summaries can say how personal each run's mixing was without keeping W."""
    shares = same_domain_weight(res.collaboration, cfg).mean()
    return {**res.summary, "weight_shares": {k: round(float(v), 6) for k, v in shares.items()}}


def run_grid(base: ExperimentConfig, variants: Mapping[str, Mapping[str, Any]], seeds: Sequence[int],
             results_dir: Optional[Path] = None, progress: bool = True, keep: bool = False,
             only_cached: bool = False, also_read: Sequence[Path] = ()) -> pd.DataFrame:
    """Run every variant (name -> config overrides) for every seed; one row per run.

    With ``results_dir`` each finished run's summary is stored under its config hash, so an interrupted grid
    resumes where it stopped and a rerun with the same configs reads the stored numbers.
    ``also_read``: more folders of stored runs, read (never written) when ``results_dir`` lacks a run, e.g. the
    Table 1 runs that an ablation grid's default variant equals.
    With ``keep`` the full ``Results`` of each run are attached as ``grid.attrs['results'][(name, seed)]``.
    With ``only_cached`` nothing runs: the table holds the runs already stored.
    Each run that starts says so in a progress line (``progress.progress_line``: the notebook runner's terminal).
    """
    rows, kept = [], {}
    jobs = [(name, seed) for name in variants for seed in seeds]
    for number, (name, seed) in enumerate(progress_bar(jobs, desc="runs", requested=progress), 1):
        cfg = dataclasses.replace(base, **dict(variants[name]), seed=seed)
        path = Path(results_dir) / f"{config_key(cfg)}.json" if results_dir is not None else None
        found = stored_path(cfg, results_dir, also_read)
        if found is not None and not keep:
            summary = read_summary(found)
        elif only_cached:
            continue
        elif path is not None and plan_file() is not None:  # planning: record the run, run nothing
            add_to_plan(cfg.to_dict(), results_dir)
            continue
        else:
            progress_line(f"run {number} of {len(jobs)}: {name}, seed {seed} ...", progress)
            partial = partial_dir(cfg) if path is not None else None  # resumable while it runs
            res = run_experiment(cfg) if partial is None else resumable_run(cfg, partial)
            summary = grid_summary(res, cfg)
            if keep:
                kept[(name, seed)] = res
            if path is not None:
                store_summary(path, summary)
                shutil.rmtree(partial, ignore_errors=True)
        rows.append({"variant": name, "seed": seed, **{k: summary[k] for k in SUMMARY_KEYS if k in summary}})
    table = pd.DataFrame(rows, columns=["variant", "seed", *SUMMARY_KEYS]) if not rows else pd.DataFrame(rows)
    table.attrs["results"] = kept
    return table


def run_strategy_grid(base: ExperimentConfig, strategies: Sequence[str], seeds: Sequence[int],
                      results_dir: Optional[Path] = None, only_cached: bool = False,
                      progress: bool = True, also_read: Sequence[Path] = ()) -> pd.DataFrame:
    """Like ``run_grid`` over strategies, but strategies missing for a seed run together in one pass that
    shares the stateless local phase (``experiment.run_strategies``; TTA-bn and source only). Same cache, and the
    same ``also_read`` folders (read, never written)."""
    from .experiment import run_strategies

    rows = []
    bar = progress_bar(total=len(strategies) * len(seeds), desc="runs", requested=progress)
    for number, seed in enumerate(seeds, 1):
        cfgs = {s: dataclasses.replace(base, strategy=s, strategy_params={}, seed=seed) for s in strategies}
        paths = {s: Path(results_dir) / f"{config_key(c)}.json" if results_dir is not None else None
                 for s, c in cfgs.items()}
        found = {s: stored_path(c, results_dir, also_read) for s, c in cfgs.items()}
        missing = [s for s in strategies if found[s] is None]
        if missing and results_dir is not None and plan_file() is not None and not only_cached:
            add_to_plan(cfgs[missing[0]].to_dict(), results_dir, missing)  # planning: record the pass, run nothing
            missing = []
        if missing and not only_cached:
            progress_line(f"runs of seed {seed} ({number} of {len(seeds)} seeds): {', '.join(missing)} in one pass ...",
                          progress)
        fresh = {} if (only_cached or not missing) else run_strategies(cfgs[missing[0]], missing,
                                                                        progress=progress_wanted(progress))
        for s in strategies:
            if s in fresh:
                summary = grid_summary(fresh[s], cfgs[s])
                if paths[s] is not None:
                    store_summary(paths[s], summary)
            elif found[s] is not None:
                summary = read_summary(found[s])
            else:
                continue
            rows.append({"variant": s, "seed": seed, **{k: summary[k] for k in SUMMARY_KEYS if k in summary}})
        bar.update(len(strategies))
    bar.close()
    return pd.DataFrame(rows, columns=["variant", "seed", *SUMMARY_KEYS]) if not rows else pd.DataFrame(rows)


def strategy_comparison(cfg: ExperimentConfig, strategies: Sequence[str], seeds: Sequence[int],
                        results_dir: Optional[Path] = None, only_cached: bool = False,
                        also_read: Sequence[Path] = ()) -> pd.DataFrame:
    """One row per (strategy, seed) of ``cfg``: strategies share one pass per seed where the local method is
    stateless (TTA-bn, source; ``run_strategy_grid``), else one run each (``run_grid``). Same cache either way."""
    if cfg.local in ("bn", "source"):
        return run_strategy_grid(cfg, strategies, seeds, results_dir=results_dir, only_cached=only_cached,
                                 progress=False, also_read=also_read)
    return run_grid(cfg, {s: {"strategy": s, "strategy_params": {}} for s in strategies}, seeds,
                    results_dir=results_dir, only_cached=only_cached, progress=False, also_read=also_read)


def heterogeneity_sweep(base: ExperimentConfig, field: str, values: Sequence[float], fixed: Mapping[str, float],
                        strategies: Sequence[str], seeds: Sequence[int], results_dir: Optional[Path] = None,
                        only_cached: bool = False) -> pd.DataFrame:
    """Accuracy of ``strategies`` on the ``heterogeneity`` scenario as one of SH / TH (``field``: "sh" or "th")
    takes ``values`` and the other stays at ``fixed`` (FedTSA Fig 4, FedCTTA Fig 2); a column ``field`` is added."""
    if field not in ("sh", "th"):
        raise ValueError(f"heterogeneity_sweep: field must be 'sh' or 'th', got {field!r}")
    rows = []
    for v in values:
        cfg = dataclasses.replace(base, scenario="heterogeneity", **{field: v, **fixed})
        rows.append(strategy_comparison(cfg, strategies, seeds, results_dir, only_cached).assign(**{field: v}))
    return pd.concat(rows, ignore_index=True)


def mean_std(table: pd.DataFrame, by: Sequence[str] | str = "variant", value: str = "accuracy") -> pd.DataFrame:
    """Mean and standard deviation (over seeds) of ``value`` per group."""
    g = table.groupby(by, sort=False)[value]
    return pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=1).fillna(0.0), "runs": g.size()})


def beside_paper(ours: pd.DataFrame, paper: Mapping[str, float], label: str = "paper") -> pd.DataFrame:
    """Our mean +- std beside the paper's number and the difference (ours - paper), per row key."""
    out = ours.copy()
    out[label] = [paper.get(k, float("nan")) for k in out.index]
    out["difference"] = out["mean"] - out[label]
    return out


def format_mean_std(table: pd.DataFrame, digits: int = 2) -> pd.Series:
    """'mean ± std' strings ('–' where the mean is missing, e.g. a cell no run could fill)."""
    from .tables import mean_std_text

    return table.apply(lambda r: mean_std_text(r["mean"], r["std"], digits=digits), axis=1)


def over_seeds(table: pd.DataFrame, by: Sequence[str], value: str = "accuracy") -> Tuple[pd.DataFrame, pd.DataFrame]:
    """Seed-level summary of a long table with a ``seed`` column (e.g. one row per client, k, seed).

    Returns ('mean ± std' over seeds of the per-seed mean of ``value``, one row per ``by`` group, the last ``by``
    column unstacked into columns when there are two or more; the per-seed means as a long table).
    """
    by = list(by)
    per_seed = table.groupby(by + ["seed"], sort=False)[value].mean().reset_index()
    cells = format_mean_std(mean_std(per_seed, by=by, value=value))
    return (cells.unstack() if len(by) > 1 else cells.to_frame(value)), per_seed


def summary_config(summary: Dict[str, Any]) -> ExperimentConfig:
    """The config a stored summary was made with."""
    return ExperimentConfig.from_dict(summary["config"])


@dataclasses.dataclass
class StoredRun:
    """A run kept compactly for figures: summary, W over time [T, N, N] and per-(slot, client) accuracies."""

    summary: Dict[str, Any]
    collaboration: "np.ndarray"
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


def run_stored(base: ExperimentConfig, strategies: Sequence[str], out_dir: Path,
               progress: bool = True) -> Dict[str, StoredRun]:
    """Run ``base`` with every strategy (a name, or a ``strategy_spec`` such as ``fedctta@probe_bn=eval``) and keep
    each run under ``out_dir/<spec>/`` (``summary.json``, ``collaboration.npz``, ``slots.csv``: small enough to
    commit). Stored runs with the same config are read back. Two or more missing strategies without parameters
    share one pass when the local method is stateless (TTA-bn); every other missing run goes alone through a
    resumable folder (``partial_dir``, ``resumable_run``), so an interrupted run resumes where it stopped."""
    from .loop import SharedPassError
    from .experiment import run_strategies

    out_dir = Path(out_dir)
    cfgs = {}
    for s in strategies:
        name, params = strategy_spec(s)
        cfgs[s] = dataclasses.replace(base, strategy=name, strategy_params=params)

    def stored(s: str) -> bool:
        path = usable(out_dir / s / "summary.json")
        return path is not None and identity_of(read_summary(path)["config"]) == cfgs[s].identity()

    missing = [s for s in strategies if not stored(s)]
    progress = progress_wanted(progress)
    plain = [s for s in missing if not cfgs[s].strategy_params]
    fresh: Dict[str, Results] = {}
    if len(plain) > 1:
        try:
            fresh = run_strategies(cfgs[plain[0]], plain, progress=progress)
        except SharedPassError:  # the local method trains or carries state: one run per strategy
            pass
    for s, res in fresh.items():
        _keep_compact(out_dir / s, res)
    for s in missing:
        if s not in fresh:
            partial = partial_dir(cfgs[s])
            _keep_compact(out_dir / s, resumable_run(cfgs[s], partial, progress=progress))
            shutil.rmtree(partial, ignore_errors=True)
    return read_stored(out_dir, strategies)


def _keep_compact(folder: Path, res: Results) -> None:
    """``run_stored``'s folder of one run: W (float32), the per-slot table, then the summary (written last: a folder
    with one is complete, ``runstore``)."""
    import numpy as np

    (folder / "summary.json").unlink(missing_ok=True)
    atomic_write(folder / "collaboration.npz", lambda fh: np.savez_compressed(fh, W=res.collaboration.astype(np.float32)))
    atomic_write(folder / "slots.csv", lambda fh: fh.write(slot_table(res.steps).to_csv(
        index=False, float_format="%.4f").encode()))
    store_summary(folder / "summary.json", res.summary, files=("collaboration.npz", "slots.csv"))  # sealed


def read_stored(out_dir: Path, strategies: Sequence[str]) -> Dict[str, StoredRun]:
    """The runs ``run_stored`` kept under ``out_dir/<strategy>/`` for those of ``strategies`` that are there (no
    config check, nothing runs)."""
    import numpy as np

    out_dir = Path(out_dir)
    return {s: StoredRun(read_summary(out_dir / s / "summary.json"),
                         np.load(out_dir / s / "collaboration.npz")["W"], pd.read_csv(out_dir / s / "slots.csv"))
            for s in strategies if (out_dir / s / "summary.json").exists()}


def markdown_table(table: pd.DataFrame, digits: int = 2) -> str:
    """A plain markdown rendering of any table (floats rounded to ``digits``; the index is kept as columns)."""
    flat = table.reset_index() if not isinstance(table.index, pd.RangeIndex) else table
    cells = [[f"{v:.{digits}f}" if isinstance(v, float) else str(v) for v in row] for row in flat.itertuples(index=False)]
    lines = ["| " + " | ".join(map(str, flat.columns)) + " |", "|" + "---|" * len(flat.columns)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells]) + "\n"


def same_domain_weight(weights: "np.ndarray", cfg: ExperimentConfig, steps: Optional[slice] = None) -> pd.DataFrame:
    """How client i's weight in W [T, N, N] splits between itself, peers on the same domain at that step and the
    others, averaged over ``steps`` (default: all; rows: clients); ``uniform same-domain`` is the share FedAvg
    would give those peers. Domains come from ``cfg``'s scenario, step by step."""
    import numpy as np

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


def group_weight_shares(weights: "np.ndarray", groups: Mapping[str, Sequence[int]] = CASE_STUDY_GROUPS,
                        steps: Optional[slice] = None) -> pd.DataFrame:
    """How client i splits its weight in W [T, N, N] (averaged over ``steps`` and over the clients of each group):
    on itself, on the other members of its group, and on each other group. Rows: groups; columns: shares (sum 1)."""
    import numpy as np

    w = np.asarray(weights)[steps if steps is not None else slice(None)].mean(0)
    rows = {}
    for name, members in groups.items():
        members = list(members)
        row = {"self": float(np.mean([w[i, i] for i in members]))}
        row["own group (others)"] = float(np.mean([w[i, members].sum() - w[i, i] for i in members]))
        for other, others in groups.items():
            if other != name:
                row[other] = float(np.mean([w[i, list(others)].sum() for i in members]))
        rows[name] = row
    return pd.DataFrame(rows).T[["self", "own group (others)", *groups]]


def stored_summaries(base: ExperimentConfig, variants: Mapping[str, Mapping[str, Any]], seeds: Sequence[int],
                     results_dir: Path) -> Dict[tuple, Dict[str, Any]]:
    """The stored summaries (as written by ``run_grid`` / ``run_strategy_grid``) of every (variant, seed) that
    has one under ``results_dir``: {(variant, seed): summary}. Runs nothing."""
    out = {}
    for name in variants:
        for seed in seeds:
            cfg = dataclasses.replace(base, **dict(variants[name]), seed=seed)
            path = Path(results_dir) / f"{config_key(cfg)}.json"
            if path.exists():
                out[(name, seed)] = read_summary(path)
    return out


def per_domain_table(summaries: Mapping[tuple, Dict[str, Any]], kind: str = "mixed",
                     source_row: Optional[str] = "No-Adapt") -> pd.DataFrame:
    """Accuracy (%) per domain (columns, plus ``mean`` over all predictions) and variant (rows), averaged over
    seeds, from the ``accuracy_by_domain`` of stored summaries (``kind``: mixed, local or source). With
    ``source_row`` a first row holds the source model's accuracies. Summaries without per-domain numbers are
    skipped; the ``seeds`` column (integer) says how many distinct seeds each row averages.

    Every seed weighs the same: a row's numbers are the mean over its seeds of the mean over that seed's entries
    (the source row gets one entry per stored run, and the runs of one seed can carry source numbers that differ in
    the last digits: Table 1's stored IID runs of seeds 3 and 4, FedTSA's against the other strategies')."""
    rows: Dict[str, Dict[Any, List[Dict[str, float]]]] = {}
    for (name, seed), summary in summaries.items():
        by_domain = summary.get("accuracy_by_domain")
        if not by_domain:
            continue
        if source_row is not None:
            rows.setdefault(source_row, {}).setdefault(seed, []).append(
                {**by_domain["source"], "mean": summary["accuracy_source"]})
        key = "accuracy" if kind == "mixed" else f"accuracy_{kind}"
        rows.setdefault(name, {}).setdefault(seed, []).append({**by_domain[kind], "mean": summary[key]})
    table = {}
    for name, by_seed in rows.items():
        per_seed = pd.DataFrame([pd.DataFrame(entries).mean() for entries in by_seed.values()])
        table[name] = {**per_seed.mean().to_dict(), "seeds": len(by_seed)}
    out = pd.DataFrame(table).T
    if not len(out):
        return out
    out["seeds"] = out["seeds"].astype("Int64")  # nullable: stays integer when aligned with rows it lacks
    return out[[c for c in out.columns if c not in ("mean", "seeds")] + ["mean", "seeds"]]


def per_seed_values(summaries: Mapping[tuple, Dict[str, Any]], key: str = "accuracy") -> pd.DataFrame:
    """``summary[key]`` of stored summaries {(variant, seed): summary} as a table (rows: seeds, columns: variants;
    NaN where a variant has no run at a seed), for comparisons paired by seed (``stats.paired``)."""
    cells = {(name, seed): s[key] for (name, seed), s in summaries.items() if s.get(key) is not None}
    if not cells:
        return pd.DataFrame()
    return pd.Series(cells).unstack(0).sort_index()


def common_seeds(summaries: Mapping[tuple, Dict[str, Any]],
                 key: str = "accuracy_by_domain") -> Dict[tuple, Dict[str, Any]]:
    """The summaries {(variant, seed): summary} at the seeds where every variant has one holding ``key``: tables of
    means built from them (``per_domain_table``) are over one set of seeds, so a difference of two rows is the mean
    of the differences paired by seed (``stats.paired``), never a difference of means over different seeds."""
    have: Dict[Any, set] = {}
    for (name, seed), summary in summaries.items():
        if summary.get(key):
            have.setdefault(name, set()).add(seed)
    seeds = set.intersection(*have.values()) if have else set()
    return {(name, seed): s for (name, seed), s in summaries.items() if name in have and seed in seeds}


# metadata of a stored summary: how and where it was made, not what it measured
RUN_METADATA = ("config", "versions", "device", "wall_time_s", "threads", "server_threads", "shared_pass", "code",
                "reproduced")


def _measured(summary: Mapping[str, Any]) -> Dict[str, Any]:
    """What a stored summary measured (``RUN_METADATA`` left out), as its JSON file holds it."""
    return json.loads(json.dumps({k: v for k, v in summary.items() if k not in RUN_METADATA}, default=float))


def _differences(old: Any, new: Any, atol: float, where: str = "") -> List[str]:
    """The paths at which two JSON values differ (numbers by more than ``atol``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new), key=str)
                for d in (_differences(old.get(k), new.get(k), atol, f"{where}.{k}" if where else str(k)))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in _differences(a, b, atol, f"{where}[{i}]")]
    if isinstance(old, (int, float)) and isinstance(new, (int, float)) and not isinstance(old, bool):
        return [] if abs(old - new) <= atol else [f"{where}: {old} -> {new}"]
    return [] if old == new else [f"{where}: {old!r} -> {new!r}"]


def reproduce(path: Path | str, atol: float = 0.0, device: Optional[str] = None, update: bool = True,
              replace: bool = False) -> Dict[str, Any]:
    """Run a stored grid summary's config again with today's code and compare what it measured (every number,
    per domain and per class included, each field it has; ``atol`` 0: exactly; a run stored from a shared pass is
    run alone, which the shared pass equals). When they agree and ``update``, the summary's code
    record becomes today's (``build.code_record``) and ``reproduced`` notes when, on what and from which former
    record, so a run made before a change that moved no number counts as current again. When they differ the file
    is left as it is, unless ``replace`` (and ``update``): then today's run takes its place with a ``remade`` note
    (when, on what, the former record, the former accuracies and how many numbers moved), so a stale run whose
    numbers today's code moves is re-made rather than run twice. ``device``: run there instead of the recorded one
    (numbers then rarely agree exactly).
    The run goes through a resumable folder (``partial_dir``'s root, ``reproduce-<config hash>``): an interrupted
    reproduction resumes where it stopped while the code is unchanged (``resumable_run``). Returns ``{path, status:
    'reproduced' | 'differs' | 'remade', differences, seconds}``."""
    import time

    from .build import code_record

    path = Path(path)
    summary = read_summary(path)
    cfg = summary_config(summary)
    if device is not None:
        cfg = dataclasses.replace(cfg, device=device)
    t0 = time.perf_counter()
    partial = partial_dir(cfg)
    partial = partial.with_name(f"reproduce-{partial.name}")
    fresh = grid_summary(resumable_run(cfg, partial), cfg)
    shutil.rmtree(partial, ignore_errors=True)
    measured = _measured(summary)  # what it measured; a summary stored before a field existed lacks it
    differences = _differences(measured, {k: v for k, v in _measured(fresh).items() if k in measured}, atol)
    seconds = round(time.perf_counter() - t0, 1)
    former = summary.get("code") or {}
    note = {"date": time.strftime("%Y-%m-%d"), "device": fresh["device"], "atol": atol,
            "former_git": former.get("git"),
            "former_changed": sorted(stale_modules(former) or []) if former else "unrecorded"}
    status = "differs" if differences else "reproduced"
    if not differences and update:
        store_summary(path, {**summary, "code": code_record(cfg.local, cfg.strategy, cfg),
                             "reproduced": [*summary.get("reproduced", []), note]})
    elif differences and update and replace:
        former_numbers = {k: summary[k] for k in ("accuracy", "accuracy_local") if k in summary}
        remade = {**note, "former": former_numbers, "numbers_moved": len(differences)}
        store_summary(path, {**fresh, "remade": [*summary.get("remade", []), remade]})
        status = "remade"
    return {"path": str(path), "status": status, "differences": differences, "seconds": seconds}
