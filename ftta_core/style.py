"""The workbook's one figure style (seaborn/matplotlib): call ``style.use()`` once per notebook.

What it fixes for every figure: a moderate default size (panels wrap into rows instead of 26-inch strips), one colour
scale for panels that are compared (``shared_limits``, ``heatmaps``; collaboration matrices always on [0, 1] so a
uniform 1/N never reads as "maximum"), legends and keys outside the data (``legend_outside``, ``category_key``),
group boundaries on W (``draw_groups``), error bars from seeds (``mean_sd``, ``errorbar_lines``) and y-ranges that
do not turn a fraction of a point into a cliff (``honest_ylim``).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import Colormap
from matplotlib.patches import Patch

PANEL: Tuple[float, float] = (3.6, 3.1)  # inches per panel
MAX_WIDTH = 11.0  # inches: a wider row of panels wraps into several rows
W_RANGE: Tuple[float, float] = (0.0, 1.0)  # every collaboration matrix W is drawn on this scale
W_CMAP = "viridis"
W_LABEL = "weight W[i, j]"
RC: Dict[str, Any] = {
    "figure.figsize": (6.4, 3.6), "figure.dpi": 100, "savefig.dpi": 120, "savefig.bbox": "tight",
    "figure.constrained_layout.use": True, "legend.frameon": False, "axes.titlesize": 11, "axes.labelsize": 10,
    "legend.fontsize": 9, "legend.title_fontsize": 9, "xtick.labelsize": 9, "ytick.labelsize": 9,
    "image.cmap": W_CMAP, "axes.spines.top": False, "axes.spines.right": False,
}


def use(font_scale: float = 1.0) -> None:
    """Apply the workbook style (seaborn ``whitegrid``, colour-blind palette, constrained layout, readable fonts)."""
    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind", font_scale=font_scale, rc=RC)


def panels(n: int, ncols: Optional[int] = None, panel: Tuple[float, float] = PANEL, max_width: float = MAX_WIDTH,
           **subplot_kw: Any) -> Tuple[plt.Figure, np.ndarray]:
    """A figure with ``n`` axes wrapped into rows no wider than ``max_width`` inches (unused slots removed)."""
    ncols = ncols or max(1, min(n, int(max_width // panel[0])))
    nrows = math.ceil(n / ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(min(max_width, ncols * panel[0]), nrows * panel[1]),
                             squeeze=False, layout="constrained", **subplot_kw)
    flat = grid.ravel()
    for ax in flat[n:]:
        ax.remove()
    return fig, flat[:n]


def shared_limits(arrays: Sequence[Any], vmin: Optional[float] = None, vmax: Optional[float] = None,
                  robust: float = 0.0) -> Tuple[float, float]:
    """One (vmin, vmax) for several arrays (NaN ignored); given limits win; ``robust`` in (0, 50) clips the lower
    limit to that percentile so one outlier does not set the scale (the clipped values stay annotated)."""
    values = np.concatenate([np.asarray(a, dtype=float).ravel() for a in arrays]) if len(arrays) else np.array([])
    values = values[np.isfinite(values)]
    if vmin is None:
        vmin = float(np.percentile(values, robust)) if values.size else 0.0
    if vmax is None:
        vmax = float(values.max()) if values.size else 1.0
    return vmin, vmax


def draw_groups(ax: plt.Axes, groups: Sequence[Any], rows: bool = True, columns: bool = True,
                color: str = "white", lw: float = 1.5, offset: float = 0.0) -> list:
    """Lines between consecutive clients of different groups (``groups[i]``: client i's group, clients ordered by
    group) on a client x client heatmap (cell i spans [i, i + 1]; ``offset`` -0.5 for ``imshow``);
    ``rows``/``columns`` pick horizontal/vertical lines. Returns the boundary positions."""
    labels = list(groups)
    cuts = [i + offset for i in range(1, len(labels)) if labels[i] != labels[i - 1]]
    for c in cuts:
        if rows:
            ax.axhline(c, color=color, lw=lw)
        if columns:
            ax.axvline(c, color=color, lw=lw)
    return cuts


def heatmaps(matrices: Mapping[str, Any], vmin: Optional[float] = None, vmax: Optional[float] = None,
             cmap: str | Colormap = W_CMAP, cbar_label: str = "", groups: Optional[Sequence[Any]] = None,
             annotate: bool = False, fmt: str = ".2f", ncols: Optional[int] = None, axes: Optional[Sequence] = None,
             xlabel: str = "from client j", ylabel: str = "client i", robust: float = 0.0
             ) -> Tuple[plt.Figure, np.ndarray]:
    """Several heatmaps on ONE colour scale with one colour bar (``matrices``: title -> 2-D array); missing
    limits come from all matrices together (``shared_limits``); ``groups`` draws group boundaries on each."""
    vmin, vmax = shared_limits(list(matrices.values()), vmin, vmax, robust)
    if axes is None:
        fig, axes = panels(len(matrices), ncols=ncols, panel=(3.2, 3.0))
    else:
        axes = np.asarray(axes).ravel()
        fig = axes[0].figure
    for ax, (title, m) in zip(axes, matrices.items()):
        sns.heatmap(np.asarray(m, dtype=float), ax=ax, cmap=cmap, vmin=vmin, vmax=vmax, cbar=False, square=True,
                    annot=annotate, fmt=fmt, annot_kws={"fontsize": 7})
        if groups is not None:
            draw_groups(ax, groups)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    fig.colorbar(axes[0].collections[0], ax=list(axes), label=cbar_label, shrink=0.8)
    return fig, axes


def collaboration_matrices(matrices: Mapping[str, Any], groups: Optional[Sequence[Any]] = None,
                           **kwargs: Any) -> Tuple[plt.Figure, np.ndarray]:
    """Collaboration matrices W side by side on the fixed [0, 1] scale (``W_RANGE``) with one colour bar."""
    kwargs.setdefault("cbar_label", W_LABEL)
    return heatmaps(matrices, *W_RANGE, groups=groups, **kwargs)


def legend_outside(ax: plt.Axes, loc: str = "upper left", anchor: Tuple[float, float] = (1.01, 1.0),
                   title: Optional[str] = None, **kwargs: Any) -> Optional[Any]:
    """Put the axes' legend to the right of the data (seaborn's ``move_legend`` when seaborn made it)."""
    if ax.get_legend() is not None:
        sns.move_legend(ax, loc, bbox_to_anchor=anchor, title=title, frameon=False, **kwargs)
        return ax.get_legend()
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    return ax.legend(handles, labels, loc=loc, bbox_to_anchor=anchor, title=title, frameon=False,
                     borderaxespad=0.0, **kwargs)


def category_key(ax: plt.Axes, names: Sequence[str], cmap: str | Colormap = "tab10",
                 colors: Optional[Sequence[Any]] = None, title: str = "", **kwargs: Any) -> Any:
    """A legend of colour patches (one per ``names[k]``, colour k of ``cmap``) outside the axes: the key of a
    categorical image (scenario map, t-SNE classes)."""
    cmap = plt.get_cmap(cmap) if isinstance(cmap, str) else cmap
    colors = colors if colors is not None else [cmap(k % cmap.N) for k in range(len(names))]
    handles = [Patch(facecolor=c, label=str(n)) for c, n in zip(colors, names)]
    return ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=title or None,
                     frameon=False, borderaxespad=0.0, **kwargs)


def mean_sd(table: pd.DataFrame, x: str, y: str, hue: Optional[str] = None, seed: str = "seed") -> pd.DataFrame:
    """Mean, standard deviation (NaN with one seed) and number of seeds of ``y`` per (``hue``, ``x``)."""
    keys = [k for k in (hue, x) if k]
    per_seed = table.groupby(keys + ([seed] if seed in table else []), sort=False)[y].mean().reset_index()
    g = per_seed.groupby(keys, sort=False)[y]
    return pd.DataFrame({"mean": g.mean(), "sd": g.std(ddof=1), "n": g.size()}).reset_index()


def errorbar_lines(ax: plt.Axes, table: pd.DataFrame, x: str, y: str, hue: Optional[str] = None,
                   seed: str = "seed", labels: Optional[Mapping[Any, str]] = None, **kwargs: Any) -> pd.DataFrame:
    """One line per ``hue`` of mean ``y`` against ``x`` with ±1 sd error bars over seeds (a point with one seed has
    no error bar and an open marker). Returns the ``mean_sd`` summary drawn."""
    summary = mean_sd(table, x, y, hue, seed)
    groups = summary.groupby(hue, sort=False) if hue else [(None, summary)]
    for name, g in groups:
        g = g.sort_values(x)
        label = (labels or {}).get(name, name) if hue else kwargs.pop("label", None)
        line = ax.errorbar(g[x], g["mean"], yerr=g["sd"].where(g["n"] > 1), marker="o", capsize=3, label=label,
                           **kwargs)
        single = g[g["n"] <= 1]
        if len(single):
            ax.plot(single[x], single["mean"], "o", mfc="white", color=line.lines[0].get_color(), zorder=3)
    ax.set(xlabel=x, ylabel=y)
    return summary


def honest_ylim(ax: plt.Axes, min_span: float = 2.0, note: bool = True) -> float:
    """Widen the y-range to at least ``min_span`` (points) around the data so a tiny difference is not drawn as a
    cliff; with ``note``, say the span in the lower right corner. Returns the span shown."""
    lo, hi = ax.get_ylim()
    if hi - lo < min_span:
        mid = (lo + hi) / 2
        lo, hi = mid - min_span / 2, mid + min_span / 2
        ax.set_ylim(lo, hi)
    if note:
        ax.text(0.99, 0.02, f"y-axis spans {hi - lo:.1f} points", transform=ax.transAxes, ha="right", va="bottom",
                fontsize=8, color="0.35")
    return hi - lo


def legend_is_outside(ax: plt.Axes) -> bool:
    """True when the axes' legend does not overlap the data area (for tests and checks; needs a drawn figure)."""
    legend = ax.get_legend()
    if legend is None:
        return True
    renderer = ax.figure.canvas.get_renderer()
    return not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
