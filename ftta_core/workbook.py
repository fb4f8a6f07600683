"""Notebook-facing helpers: grids of configs over seeds (stored, resumable; run by ``grid.run``), tables of stored
runs, and comparisons with papers.

The grid functions here are the notebooks' names for ``grid.run`` with a store (``run_grid``, ``run_strategy_grid``,
``strategy_comparison``: a summary per run; ``run_stored``: a compact folder per run; ``stored_summaries``: the lookup
alone); the run store's names (``config_key``, ``partial_dir``, ``resumable_run``, ``stored_path``, ``grid_summary``,
``same_domain_weight``, ``StoredRun``, ``read_stored``, ...) live in ``grid`` and stay importable from here.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import pandas as pd

from . import grid
from .experiment import ExperimentConfig
from .grid import (CODE_MARK, SHARED_PASS_LOCALS, SUMMARY_KEYS, FolderStore, StoredRun, SummaryStore,  # noqa: F401
                   config_key, grid_cells, grid_summary, partial_dir, read_stored, resumable_run, same_domain_weight,
                   slot_table, stored_path, strategy_spec)
from .runstore import read_summary, stale_modules, store_summary
from .scenarios import CASE_STUDY_GROUPS
from .variants import strategy_variant, strategy_variants


def run_grid(base: ExperimentConfig, variants: Mapping[str, Mapping[str, Any]], seeds: Sequence[int],
             results_dir: Optional[Path] = None, progress: bool = True, keep: bool = False,
             only_cached: bool = False, also_read: Sequence[Path] = ()) -> pd.DataFrame:
    """``grid.run`` with a summary per run under ``results_dir`` (``grid.SummaryStore``; ``also_read``: more folders,
    read only): every variant (label -> ``Variant`` or config overrides) for every seed, one row per run with the
    variants' factors as columns. ``keep``: full ``Results`` in ``attrs['results'][(label, seed)]``; ``only_cached``:
    nothing runs; under ``$FTTA_PLAN`` missing runs are planned."""
    return grid.run(base, variants, seeds, SummaryStore(results_dir, also_read), keep=keep, only_cached=only_cached,
                    progress=progress)


def run_strategy_grid(base: ExperimentConfig, strategies: Sequence[str], seeds: Sequence[int],
                      results_dir: Optional[Path] = None, only_cached: bool = False,
                      progress: bool = True, also_read: Sequence[Path] = ()) -> pd.DataFrame:
    """``run_grid`` over strategies at their defaults (labelled by name), the ones missing for a seed in one pass
    that shares the stateless local phase (``grid.run``'s ``shared_pass``; TTA-bn and source only)."""
    return grid.run(base, strategy_variants(strategies), seeds, SummaryStore(results_dir, also_read),
                    only_cached=only_cached, shared_pass=1, progress=progress)


def strategy_comparison(cfg: ExperimentConfig, strategies: Sequence[str], seeds: Sequence[int],
                        results_dir: Optional[Path] = None, only_cached: bool = False,
                        also_read: Sequence[Path] = (), progress: bool = False) -> pd.DataFrame:
    """One row per (strategy, seed) of ``cfg``: strategies share one pass per seed where the local method is
    stateless (``grid.SHARED_PASS_LOCALS``: ``run_strategy_grid``), else one run each (``run_grid``). Same store."""
    if cfg.local in SHARED_PASS_LOCALS:
        return run_strategy_grid(cfg, strategies, seeds, results_dir, only_cached, progress, also_read)
    return run_grid(cfg, strategy_variants(strategies), seeds, results_dir, progress, only_cached=only_cached,
                    also_read=also_read)


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


def run_stored(base: ExperimentConfig, strategies: Sequence[str], out_dir: Path,
               progress: bool = True) -> Dict[str, StoredRun]:
    """``grid.run`` of ``base`` with every strategy (a name, or a ``strategy_spec`` such as ``fedctta@probe_bn=eval``)
    kept as a compact folder ``out_dir/<spec>/`` (``grid.FolderStore``: small enough to commit); stored runs with the
    same config are read back. Two or more missing strategies without parameters share one pass when the local
    method is stateless; every other missing run goes alone through a resumable folder."""
    variants = {s: strategy_variant(*strategy_spec(s)) for s in strategies}
    grid.run(base, variants, [base.seed], FolderStore(out_dir), shared_pass=2, progress=progress)
    return read_stored(out_dir, strategies)


def markdown_table(table: pd.DataFrame, digits: int = 2) -> str:
    """A plain markdown rendering of any table (floats rounded to ``digits``; the index is kept as columns)."""
    flat = table.reset_index() if not isinstance(table.index, pd.RangeIndex) else table
    cells = [[f"{v:.{digits}f}" if isinstance(v, float) else str(v) for v in row] for row in flat.itertuples(index=False)]
    lines = ["| " + " | ".join(map(str, flat.columns)) + " |", "|" + "---|" * len(flat.columns)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells]) + "\n"


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
    """The stored summaries (as ``run_grid`` / ``run_strategy_grid`` write them) of every (variant, seed) that has one
    under ``results_dir``: {(variant, seed): summary}. Runs nothing (``grid.SummaryStore.find``)."""
    store = SummaryStore(results_dir)
    found = ((c, store.find(c)) for c in grid_cells(base, variants, seeds))
    return {(c.name, c.seed): summary for c, summary in found if summary is not None}


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
