"""The workbook's one figure style (seaborn/matplotlib): call ``style.use()`` once per notebook.

What it fixes for every figure: a moderate default size (panels wrap into rows instead of 26-inch strips), one colour
scale for panels that are compared (``shared_limits``, ``heatmaps``; collaboration matrices always on [0, 1] so a
uniform 1/N never reads as "maximum"), legends and keys outside the data (``legend_outside``, ``category_key``),
group boundaries on W (``draw_groups``), error bars from seeds (``mean_sd``, ``errorbar_lines``; 95 % t intervals
from ``ftta_core.stats`` with the seeds each point rests on: ``interval_lines``, ``seed_text``), colours that stay
apart for colour-blind readers (``DISTINCT``, with a marker per series: ``MARKERS``), an equivalence margin drawn as
a band (``margin_band``), one outlier that must not squash the rest (``off_scale``) and y-ranges that do not turn a
fraction of a point into a cliff (``honest_ylim``).
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

from . import stats

PANEL: Tuple[float, float] = (3.6, 3.1)  # inches per panel
MAX_WIDTH = 11.0  # inches: a wider row of panels wraps into several rows
W_RANGE: Tuple[float, float] = (0.0, 1.0)  # every collaboration matrix W is drawn on this scale
W_CMAP = "viridis"
W_LABEL = "weight W[i, j]"
# Qualitative colours that stay distinct for colour-blind readers: Paul Tol's "bright" scheme (blue, red, green,
# yellow, cyan, purple) with a dark grey, then three of his "muted" colours (indigo, olive, wine) for series 8-10.
# seaborn's "colorblind" palette puts an orange, a vermillion and a tan, and two pinks, among its first seven.
DISTINCT: Tuple[str, ...] = ("#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377", "#555555",
                             "#332288", "#999933", "#882255")
MARKERS: Tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")  # one per series, with its colour
MARGIN_COLOR = "#E8C872"  # the equivalence band (``margin_band``): light enough for points on it, visible on white
RC: Dict[str, Any] = {
    "figure.figsize": (6.4, 3.6), "figure.dpi": 100, "savefig.dpi": 120, "savefig.bbox": "tight",
    "figure.constrained_layout.use": True, "legend.frameon": False, "axes.titlesize": 11, "axes.labelsize": 10,
    "legend.fontsize": 9, "legend.title_fontsize": 9, "xtick.labelsize": 9, "ytick.labelsize": 9,
    "image.cmap": W_CMAP, "axes.spines.top": False, "axes.spines.right": False,
}


def use(font_scale: float = 1.0) -> None:
    """Apply the workbook style (seaborn ``whitegrid``, the ``DISTINCT`` palette, constrained layout, readable
    fonts)."""
    sns.set_theme(context="notebook", style="whitegrid", palette=list(DISTINCT), font_scale=font_scale, rc=RC)


def distinct(n: int) -> list:
    """``n`` (colour, marker) pairs, one per series: ``DISTINCT`` colours with ``MARKERS`` (both repeat past 10)."""
    return [(DISTINCT[k % len(DISTINCT)], MARKERS[k % len(MARKERS)]) for k in range(n)]


def seed_ids(values: Any) -> Tuple[int, ...]:
    """The distinct seeds in ``values`` (a column, a tuple, NaN/None for none) as sorted ints."""
    if values is None or (isinstance(values, float) and math.isnan(values)):
        return ()
    values = pd.Series([values] if np.isscalar(values) else list(values), dtype=object).dropna()
    try:
        return tuple(sorted({int(v) for v in values}))
    except (TypeError, ValueError):  # seeds that are not numbers: named as they are
        return tuple(sorted({str(v) for v in values}))


def seed_text(seeds: Any, prefix: bool = True) -> str:
    """Which seeds, written out: "seed 0", "seeds 0, 1, 2" (``prefix`` False: "0, 1, 2"); "no seed" for none."""
    ids = seed_ids(seeds)
    if not ids:
        return "no seed"
    listed = ", ".join(map(str, ids))
    return (f"seed{'s' if len(ids) > 1 else ''} {listed}") if prefix else listed


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
    """Mean, standard deviation (NaN with one seed), number of seeds, 95 % t half-width (``stats.t_half_width``,
    NaN with one seed) and the seeds themselves (``seeds``: a sorted tuple, empty without a ``seed`` column) of ``y``
    per (``hue``, ``x``)."""
    keys = [k for k in (hue, x) if k]
    per_seed = table.groupby(keys + ([seed] if seed in table else []), sort=False)[y].mean().reset_index()
    g = per_seed.groupby(keys, sort=False)
    out = pd.DataFrame({"mean": g[y].mean(), "sd": g[y].std(ddof=1), "n": g.size()})
    out["ci95"] = stats.t_half_width(out["sd"], out["n"])
    out["seeds"] = g[seed].agg(seed_ids) if seed in per_seed else pd.Series([()] * len(out), index=out.index,
                                                                             dtype=object)
    return out.reset_index()


_ERRORBAR_ONLY = {"capsize", "capthick", "ecolor", "elinewidth", "errorevery", "barsabove", "lolims", "uplims",
                  "xlolims", "xuplims", "fmt"}


def errorbar_lines(ax: plt.Axes, table: pd.DataFrame, x: str, y: str, hue: Optional[str] = None,
                   seed: str = "seed", labels: Optional[Mapping[Any, str]] = None, interval: str = "sd",
                   state_seeds: bool = False, looks: Optional[Mapping[Any, Tuple[str, str]]] = None,
                   **kwargs: Any) -> pd.DataFrame:
    """One line per ``hue`` of mean ``y`` against ``x``, each in its own ``DISTINCT`` colour and marker, with error
    bars over seeds: ±1 sd (``interval="sd"``) or the 95 % t interval (``"ci95"``); a point with one seed has no
    bar and an open marker. ``state_seeds``: each line's key entry names its seeds when they are the same at every
    point, otherwise every point is labelled with its own. ``looks``: hue -> (colour, marker), to keep a series'
    look across panels that lack some series. Returns the ``mean_sd`` summary drawn."""
    if interval not in ("sd", "ci95"):
        raise ValueError(f"errorbar_lines: interval must be 'sd' or 'ci95', got {interval!r}")
    summary = mean_sd(table, x, y, hue, seed)
    groups = list(summary.groupby(hue, sort=False)) if hue else [(None, summary)]
    # one line without hue keeps the axes' colour cycle (several calls on one axes stay apart)
    order = distinct(len(groups)) if hue else [(None, "o")]
    if hue and looks:
        order = [looks.get(name, look) for (name, _), look in zip(groups, order)]
    for (name, g), (colour, marker) in zip(groups, order):
        g = g.sort_values(x)
        label = (labels or {}).get(name, name) if hue else kwargs.pop("label", None)
        same = len(set(g["seeds"])) == 1 and len(g["seeds"].iloc[0]) > 0
        if state_seeds and same and label is not None:
            label = f"{label} ({seed_text(g['seeds'].iloc[0])})"
        style_kw = {**({"color": colour} if hue else {}), "marker": marker, **kwargs}
        if (g["n"] <= 1).all():  # no interval anywhere: a plain line of open markers (its key shows no bar)
            line_kw = {k: v for k, v in style_kw.items() if k not in _ERRORBAR_ONLY}
            drawn = ax.plot(g[x], g["mean"], mfc="white", label=label, **line_kw)[0]
        else:
            drawn = ax.errorbar(g[x], g["mean"], yerr=g[interval].where(g["n"] > 1), capsize=3, label=label,
                                **style_kw).lines[0]
            single = g[g["n"] <= 1]
            if len(single):
                ax.plot(single[x], single["mean"], ls="none", marker=style_kw["marker"], mfc="white",
                        color=drawn.get_color(), zorder=3)
        if state_seeds and not same and any(len(ids) for ids in g["seeds"]):
            for at, mean, seeds in zip(g[x], g["mean"], g["seeds"]):
                ax.annotate(seed_text(seeds, prefix=False), (at, mean), xytext=(4, -9), textcoords="offset points",
                            fontsize=6, color=drawn.get_color())
    ax.set(xlabel=x, ylabel=y)
    return summary


# a marker as a character, for keys written in text (``seed_strip``)
GLYPHS = {"o": "●", "s": "■", "^": "▲", "D": "◆", "v": "▼", "P": "✚", "X": "✖", "<": "◀", ">": "▶",
          "h": "⬢"}


def seed_strip(ax: plt.Axes, rows: Sequence[Tuple[str, Any, Mapping[Any, Any]]], fontsize: float = 7.0,
               gap: float = 10.0, top: float = 24.0, glyphs: bool = True) -> None:
    """Which seeds every point rests on, where labels beside the points would collide: under the x tick labels one
    row per series (``rows``: (marker, colour, {x: seeds or a text})), the series' marker glyph at the left and each
    point's seeds under its x (``glyphs`` False: no glyphs, e.g. on panels right of the first); the x label moves
    below the rows."""
    for k, (marker, colour, by_x) in enumerate(rows):
        y = -(top + gap * k)
        if glyphs:
            ax.annotate(GLYPHS.get(marker, marker), (0, 0), xycoords="axes fraction", xytext=(-28, y),
                        textcoords="offset points", ha="right", va="top", fontsize=fontsize, color=colour)
        for x, seeds in by_x.items():
            text = seeds if isinstance(seeds, str) else seed_text(seeds, prefix=False)
            ax.annotate(text, (x, 0), xycoords=("data", "axes fraction"), xytext=(0, y),
                        textcoords="offset points", ha="center", va="top", fontsize=fontsize, color=colour)
    ax.xaxis.labelpad = top + gap * len(rows) - 12


def interval_note(summary: pd.DataFrame, interval: str = "ci95") -> str:
    """What the bars of a drawn ``mean_sd`` summary are, from what it holds: "mean ± 95 % interval over seeds",
    "..., open marker: one seed (no interval)", or "one seed per point: no interval"."""
    bar = "mean ± 95 % t interval over seeds" if interval == "ci95" else "mean ± 1 sd over seeds"
    if summary.empty or (summary["n"] <= 1).all():
        return "one seed per point: no interval"
    return bar + ("; open marker: one seed (no interval)" if (summary["n"] <= 1).any() else "")


def interval_lines(ax: plt.Axes, table: pd.DataFrame, x: str, y: str, hue: Optional[str] = None,
                   seed: str = "seed", labels: Optional[Mapping[Any, str]] = None, key_title: str = "",
                   key: bool = True, **kwargs: Any) -> pd.DataFrame:
    """``errorbar_lines`` as the workbook's figures draw seeds: 95 % t intervals, the seeds of every point stated
    (in the key, or beside each point where they differ), and a key outside the data whose title says what the
    bars are, computed from what was drawn (``interval_note``). Returns the summary drawn."""
    summary = errorbar_lines(ax, table, x, y, hue, seed, labels, interval="ci95", state_seeds=True, **kwargs)
    if key:
        legend_outside(ax, title=f"{key_title}\n({interval_note(summary)})" if key_title else interval_note(summary))
    return summary


def margin_band(ax: plt.Axes, margin: float = stats.MARGIN, label: Optional[str] = None) -> Patch:
    """Shade ±``margin`` around 0 (the equivalence margin of ``ftta_core.stats``) with dashed edges, visible on the
    style's grid; returns a key handle (``label``: its text, default "±MARGIN points: equal within the margin")."""
    ax.axhspan(-margin, margin, color=MARGIN_COLOR, alpha=0.55, lw=0, zorder=0)
    for edge in (-margin, margin):
        ax.axhline(edge, color="#B8860B", lw=0.7, ls="--", zorder=0.5)
    return margin_key(margin, label)


def margin_key(margin: float = stats.MARGIN, label: Optional[str] = None) -> Patch:
    """The key handle of ``margin_band``."""
    return Patch(facecolor=MARGIN_COLOR, alpha=0.55, edgecolor="#B8860B", ls="--",
                 label=label or f"±{margin:g} points: equal within the margin")


def outliers(values: Sequence[float], factor: float = 10.0, min_scale: float = 1.5) -> np.ndarray:
    """Which ``values`` lie so far from the rest that they would squash them on one axis: more than ``factor``
    robust scales (1.4826 x the median absolute deviation, at least ``min_scale``) from the median."""
    v = np.asarray(values, dtype=float)
    finite = v[np.isfinite(v)]
    if finite.size < 3:
        return np.zeros(v.shape, dtype=bool)
    med = np.median(finite)
    scale = max(1.4826 * float(np.median(np.abs(finite - med))), min_scale)
    return np.isfinite(v) & (np.abs(v - med) > factor * scale)


def off_scale(ax: plt.Axes, x: float, value: float, text: str, color: Any = "k") -> None:
    """Mark a point that lies outside the y-range drawn: a triangle on the edge it left by, pointing outwards, with
    ``text`` (its value) beside it, so the clipped axis never hides a number."""
    lo, hi = ax.get_ylim()
    below = value < lo
    edge = lo + 0.04 * (hi - lo) if below else hi - 0.04 * (hi - lo)
    ax.plot([x], [edge], marker="v" if below else "^", color=color, ms=8, ls="none", zorder=4, clip_on=False)
    ax.annotate(text, (x, edge), xytext=(6, 4 if below else -4), textcoords="offset points", fontsize=7,
                color=color, va="bottom" if below else "top", ha="left",
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})


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
