"""One leaderboard across methods: every local TTA method x every strategy on one protocol, with seed spread.

Each cell is a run of ``base`` with that local method (its settings from ``local_settings``) and strategy (its
defaults), for every seed; runs are stored under ``results_dir`` like every grid (``grid.run`` with a
``grid.SummaryStore``, through ``workbook.strategy_comparison``; runs of the same configs stored elsewhere are read
with ``also_read``), so a leaderboard fills in as runs are added and a rerun reads what is stored. The table gives mean, standard deviation,
the number of seeds and a 95% confidence half-width (Student t over seeds, ``stats.t_half_width``); the gains
over ``local`` are paired by seed and read by ``stats.comparison``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import pandas as pd

from ftta_core import stats
from ftta_core.experiment import ExperimentConfig
from studies.paper import METHOD_LABELS
from ftta_core.workbook import strategy_comparison

# the settings each local method runs with on the leaderboard (its reference defaults otherwise); TTA-grad with
# Tent is the FedTSA/FedCTTA papers' setting (all parameters, SGD 1e-4)
DEFAULT_LOCAL_SETTINGS: Dict[str, Dict[str, Any]] = {
    "tent": {"params": "all", "optimizer": "sgd", "lr": 1e-4},
}


def local_settings(name: str, cfg: ExperimentConfig) -> Dict[str, Any]:
    """The leaderboard's parameters for local method ``name`` under ``cfg`` (EATA's Fisher uses the source data)."""
    params = dict(DEFAULT_LOCAL_SETTINGS.get(name, {}))
    if name == "eata":
        params.setdefault("fisher_source", cfg.model_name)
    return params


def run_leaderboard(base: ExperimentConfig, locals_: Sequence[str], strategies: Sequence[str], seeds: Sequence[int],
                    results_dir: Optional[Path] = None, only_cached: bool = False,
                    settings: Optional[Mapping[str, Mapping[str, Any]]] = None,
                    also_read: Sequence[Path] = ()) -> pd.DataFrame:
    """One row per (local, strategy, seed) run with its accuracies (stored runs are read back, also from the
    ``also_read`` folders, e.g. the FedTSA Table 1 runs: TTA-bn and TTA-grad there are this board's ``bn`` and
    ``tent`` rows, same configs). A stateless local method (``bn``) runs its missing strategies in one shared pass
    per seed (``workbook.strategy_comparison``: the same results as separate runs)."""
    frames = []
    for local in locals_:
        params = dict(settings[local]) if settings and local in settings else local_settings(local, base)
        cfg = dataclasses.replace(base, local=local, local_params=params)
        g = strategy_comparison(cfg, list(strategies), seeds, results_dir=results_dir, only_cached=only_cached,
                                also_read=also_read)
        frames.append(g.rename(columns={"variant": "strategy"}).assign(local=local))
    frames = [f for f in frames if len(f)] or frames[:1]  # a local method with no stored run adds no rows
    grid = pd.concat(frames, ignore_index=True)
    numeric = [c for c in grid.columns if c not in ("local", "strategy")]
    grid[numeric] = grid[numeric].apply(pd.to_numeric)  # an empty frame's object columns must not leak into them
    return grid[["local", "strategy", "seed", *[c for c in grid.columns if c not in ("local", "strategy", "seed")]]]


def leaderboard_table(grid: pd.DataFrame, value: str = "accuracy") -> pd.DataFrame:
    """Mean, std, seeds and 95% CI half-width (``stats.t_half_width``) of ``value`` per (local, strategy), best
    first."""
    g = grid.groupby(["local", "strategy"])[value]
    table = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=1), "seeds": g.size()})
    table["ci95"] = stats.t_half_width(table["std"], table["seeds"])
    return table.sort_values("mean", ascending=False)


GAIN_COLUMNS = ["gain", "low", "high", "seeds", "comparison"]


def gains_over_local(grid: pd.DataFrame, value: str = "accuracy") -> pd.DataFrame:
    """Per (local, strategy): the gain in ``value`` over the ``local`` strategy of the same local method, paired by
    seed (``stats.paired``: a seed fixes the stream): mean, 95% interval, seeds and ``stats.comparison`` ('ahead' /
    'behind' only when the interval excludes 0, 'undetermined' under ``stats.MIN_SEEDS``); sorted by gain."""
    wide = grid.pivot_table(index=["local", "seed"], columns="strategy", values=value)
    if "local" not in wide:
        return pd.DataFrame(columns=GAIN_COLUMNS)
    rows = []
    for local, g in wide.groupby(level="local", sort=False):
        g = g.droplevel("local")
        for strategy in g.columns.drop("local"):
            est = stats.paired(g[strategy], g["local"])
            if est.n:
                rows.append({"local": local, "strategy": strategy, "gain": est.mean, "low": est.low,
                             "high": est.high, "seeds": est.n, "comparison": stats.comparison(est)})
    if not rows:
        return pd.DataFrame(columns=GAIN_COLUMNS)
    return pd.DataFrame(rows).set_index(["local", "strategy"]).sort_values("gain", ascending=False)


# how ``leaderboard_reading`` names each ``stats.comparison`` of a gain over local, in this order
GAIN_WORDS = {"ahead": "above local", "behind": "below local", "equal within the margin":
              f"equal to local within {stats.MARGIN:g} points", "identical": "identical to local at every seed",
              "undetermined": "undetermined", "few": f"fewer than {stats.MIN_SEEDS} paired seeds (undetermined)"}


def _gain_text(r: pd.Series) -> str:
    """A ``gains_over_local`` row as '+2.10 [+1.85, +2.35]', with its seeds when under ``stats.MIN_SEEDS``."""
    interval = f" [{r.low:+.2f}, {r.high:+.2f}]" if r.seeds > 1 and r.comparison != "identical" else ""
    few = f" ({int(r.seeds)} seed{'s' if r.seeds > 1 else ''})" if r.seeds < stats.MIN_SEEDS else ""
    return f"{r.gain:+.2f}{interval}{few}"


def leaderboard_reading(table: pd.DataFrame, gains: pd.DataFrame, n_locals: int, n_strategies: int,
                        n_seeds: int, locals_: Sequence[str] = ()) -> str:
    """What the stored board says: coverage, the best cell, and per local method each strategy's gain over
    ``local`` by its ``stats.comparison`` (above / below local only when the 95% interval excludes 0; fewer than
    ``stats.MIN_SEEDS`` paired seeds: undetermined) (``table``: ``leaderboard_table``; ``gains``:
    ``gains_over_local``); given the board's ``locals_``, the rows with no stored run are named."""
    if table.empty:
        return "No run is stored yet."
    runs = int(table["seeds"].sum())
    full = int((table["seeds"] >= n_seeds).sum())
    (best_local, best_strategy), best = table.index[0], table.iloc[0]
    text = [f"**Coverage.** {runs} of {n_locals * n_strategies * n_seeds} runs are stored: {len(table)} of "
            f"{n_locals * n_strategies} cells, {full} of them with all {n_seeds} seeds.",
            f"**Best cell.** {best_local} + {best_strategy}: {best['mean']:.2f}% over {int(best['seeds'])} seeds."]
    missing = [name for name in locals_ if name not in set(table.index.get_level_values("local"))]
    if missing:
        text[0] += f" No run stored yet for: {', '.join(missing)}."
    for local, g in gains.groupby(level="local", sort=False):
        said: Dict[str, List[str]] = {}
        for strategy, r in g.droplevel("local").iterrows():
            key = "few" if r.seeds < stats.MIN_SEEDS else r.comparison
            said.setdefault(key, []).append(f"{strategy} {_gain_text(r)}")
        parts = [f"above local: {', '.join(said.pop('ahead', [])) or 'none'}"]
        parts += [f"{GAIN_WORDS[k]}: {', '.join(said[k])}" for k in GAIN_WORDS if k in said]
        text.append(f"**{local}** (gain over local in points [95% CI], paired by seed): " + "; ".join(parts) + ".")
    return "\n\n".join(text)


# readable names of the board's local methods (rows) and strategies (columns) in its figures
LOCAL_LABELS: Dict[str, str] = {"bn": "BN-adapt (TTA-bn)", "tent": "Tent (TTA-grad)", "eata": "EATA",
                                "cotta": "CoTTA", "rotta": "RoTTA", "roid": "ROID", "bbn": "BBN"}
STRATEGY_LABELS: Dict[str, str] = {**METHOD_LABELS, "pfedbbn": "pFedBBN"}


def cell_seeds(grid: pd.DataFrame) -> Dict[Any, tuple]:
    """(local, strategy) -> the seeds stored for that cell of a ``run_leaderboard`` grid."""
    return {key: tuple(sorted(int(s) for s in g["seed"].unique())) for key, g in grid.groupby(["local", "strategy"])}


def leaderboard_heatmap(table: pd.DataFrame, ax: Any = None, title: str = "", rows: Sequence[str] = (),
                        columns: Sequence[str] = (), grid: Optional[pd.DataFrame] = None,
                        limits: Optional[Tuple[float, float]] = None) -> Any:
    """Heatmap of mean accuracy (rows: local methods, columns: strategies, readable names), each cell annotated
    'mean ± ci95' and its seed count; rows and columns named but never run are left out and named under it, on
    one unclipped colour scale. ``grid`` (the ``run_leaderboard`` rows of ``table``): the seeds behind every count
    are named too. Drawn by ``plots.leaderboard_heatmap``."""
    from ftta_core.plots import leaderboard_heatmap as draw

    return draw(table, ax=ax, title=title, rows=rows, columns=columns,
                seed_ids=cell_seeds(grid) if grid is not None and len(grid) else None,
                row_labels=LOCAL_LABELS, column_labels=STRATEGY_LABELS, limits=limits)


def participation_figure(rates: pd.DataFrame, ax: Any = None, title: str = "") -> Any:
    """Accuracy against the participation rate p, one line per strategy (readable names, ``style.DISTINCT``
    colours and markers), with 95 % t intervals where a point has several seeds and the seeds of every point
    stated (``style.interval_lines``). ``rates``: ``run_strategy_grid`` rows with a ``participation`` column.
    Returns the axes."""
    import matplotlib.pyplot as plt

    from ftta_core import style

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.6), layout="constrained")
    style.interval_lines(ax, rates, "participation", "accuracy", hue="variant", labels=STRATEGY_LABELS,
                         key_title="strategy")
    ax.set(xlabel="participation rate p (share of clients reporting at a step)", ylabel="accuracy (%)",
           title=title or "Accuracy when only some clients report each step (TTA-bn)")
    ax.set_xticks(sorted(rates["participation"].unique()))
    return ax
