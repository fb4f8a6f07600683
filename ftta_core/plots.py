"""Figures read from the tidy results tables only: collaboration matrices, accuracy over time, comparisons.

Every figure follows ``ftta_core.style``: collaboration matrices on the fixed [0, 1] scale, legends outside the data,
error bars from seeds.
"""
from __future__ import annotations

import textwrap
from typing import Any, Mapping, Optional, Sequence, Tuple

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from . import style


def collaboration_heatmap(weights: np.ndarray, ax: Optional[plt.Axes] = None, title: str = "",
                          labels: Optional[Sequence[str]] = None, annotate: bool = False,
                          vmin: Optional[float] = style.W_RANGE[0], vmax: Optional[float] = style.W_RANGE[1],
                          groups: Optional[Sequence[Any]] = None, cbar: bool = True,
                          cbar_label: str = style.W_LABEL, cmap: str = style.W_CMAP) -> plt.Axes:
    """Heatmap of one collaboration matrix W (row i: how much client i takes from each client j), on the fixed
    [0, 1] scale unless ``vmin``/``vmax`` say otherwise (None: the data's range, for matrices that are not W);
    ``groups`` (client i's group, clients ordered by group) draws the group boundaries."""
    ax = ax or plt.gca()
    sns.heatmap(np.asarray(weights, dtype=float), ax=ax, cmap=cmap, vmin=vmin, vmax=vmax, square=True,
                annot=annotate, fmt=".2f", annot_kws={"fontsize": 7}, cbar=cbar,
                xticklabels=labels if labels is not None else "auto",
                yticklabels=labels if labels is not None else "auto",
                cbar_kws={"shrink": 0.7, "label": cbar_label} if cbar else None)
    if groups is not None:
        style.draw_groups(ax, groups)
    ax.set_xlabel("from client j")
    ax.set_ylabel("client i")
    ax.set_title(title)
    return ax


def collaboration_over_time(weights: np.ndarray, client: int, ax: Optional[plt.Axes] = None,
                            slot_steps: Optional[int] = None, title: str = "",
                            groups: Optional[Sequence[Any]] = None, cbar: bool = True) -> plt.Axes:
    """Row ``client`` of W over time ([T, N, N] -> image of clients x steps) on the fixed [0, 1] scale; white
    vertical lines separate slots, horizontal lines the client groups (``groups``)."""
    ax = ax or plt.gca()
    row = np.asarray(weights)[:, client, :].T
    im = ax.imshow(row, aspect="auto", cmap=style.W_CMAP, vmin=style.W_RANGE[0], vmax=style.W_RANGE[1],
                   interpolation="nearest", extent=(-0.5, row.shape[1] - 0.5, row.shape[0] - 0.5, -0.5))
    ax.grid(False)  # the style's grid would cross the image
    if cbar:
        ax.figure.colorbar(im, ax=ax, shrink=0.8, label=style.W_LABEL)
    if slot_steps:
        for x in range(slot_steps, row.shape[1], slot_steps):
            ax.axvline(x - 0.5, color="white", lw=0.5, alpha=0.6)
    if groups is not None:
        style.draw_groups(ax, groups, columns=False, offset=-0.5)
    ax.set_xlabel("step")
    ax.set_ylabel("weight on client j")
    ax.set_title(title or f"client {client}'s collaboration over time")
    return ax


def accuracy_per_slot(steps: pd.DataFrame, ax: Optional[plt.Axes] = None, label: str = "",
                      column: str = "correct_mixed", by: str = "slot") -> plt.Axes:
    """Accuracy (%) per slot (or any column of the steps table) of one run."""
    ax = ax or plt.gca()
    g = steps.groupby(by)[[column, "n"]].sum()
    ax.plot(g.index, 100 * g[column] / g["n"], marker="o", ms=3, label=label)
    ax.set_xlabel(by)
    ax.set_ylabel("accuracy (%)")
    return ax


def method_comparison(table: pd.DataFrame, x: str, y: str = "accuracy", hue: Optional[str] = None,
                      ax: Optional[plt.Axes] = None, reference: Optional[float] = None,
                      seed: str = "seed") -> plt.Axes:
    """Bar chart of mean ``y`` per ``x`` (and ``hue``) from 0 to 100, ±1 sd over seeds as error bars (bars with
    one seed have none), each bar labelled with its mean and seed count; legend outside the data."""
    ax = ax or plt.gca()
    order = list(pd.unique(table[x]))
    hue_order = list(pd.unique(table[hue])) if hue else [None]
    sns.barplot(data=table, x=x, y=y, hue=hue, ax=ax, errorbar="sd", capsize=0.15, err_kws={"linewidth": 1.2},
                order=order, hue_order=hue_order if hue else None)
    summary = style.mean_sd(table, x, y, hue, seed)
    found = {key: (m, n) for key, m, n in
             zip(zip(summary[hue] if hue else [None] * len(summary), summary[x]), summary["mean"], summary["n"])}
    bars = [c for c in ax.containers if hasattr(c, "datavalues")]
    for group, container in zip(hue_order, bars):
        labels = [f"{found[(group, v)][0]:.1f}\nn={int(found[(group, v)][1])}" if (group, v) in found else ""
                  for v in order]
        ax.bar_label(container, labels=labels, fontsize=7, label_type="center")
    if reference is not None:
        ax.axhline(reference, color="k", ls="--", lw=1, label="source (no adaptation)")
    ax.set_ylim(0, 105)
    ax.set_ylabel(f"{y} (%)")
    style.legend_outside(ax)
    return ax


def collaboration_snapshots(weights: np.ndarray, steps: Sequence[int], axes: Optional[Sequence[plt.Axes]] = None,
                            labels: Optional[Sequence[str]] = None,
                            groups: Optional[Sequence[Any]] = None) -> Sequence[plt.Axes]:
    """W at each of ``steps`` ([T, N, N] -> one heatmap per step) on the fixed [0, 1] scale with one colour bar."""
    w = np.asarray(weights)
    _, axes = style.collaboration_matrices({f"step {t}": w[t] for t in steps}, groups=groups, axes=axes)
    if labels is not None:
        for ax in axes:
            ax.set_xticks(np.arange(len(labels)) + 0.5, labels)
            ax.set_yticks(np.arange(len(labels)) + 0.5, labels)
    return axes


def accuracy_curve(table: pd.DataFrame, x: str, y: str = "accuracy", hue: Optional[str] = None,
                   ax: Optional[plt.Axes] = None, log_x: bool = False, label: Optional[str] = None,
                   labels: Optional[Mapping[Any, str]] = None) -> plt.Axes:
    """Mean ``y`` (%) against ``x`` with ±1 sd over seeds as error bars (open marker: one seed), one line per
    ``hue`` (named by ``labels``) or one line named ``label``; legend outside."""
    ax = ax or plt.gca()
    style.errorbar_lines(ax, table, x, y, hue, labels=labels, **({} if hue else {"label": label}))
    if log_x:
        ax.set_xscale("log")
    ax.set_ylabel(f"{y} (%)")
    if hue:
        style.legend_outside(ax, title=hue)
    return ax


def _seed_note(seed_ids: Mapping[Any, Sequence[int]], name: Any = str, few: int = 4) -> str:
    """Which seeds stand behind each cell count: "n=5: seeds 0, 1, 2, 3, 4 (70 cells); n=1: seed 0 (bn + FedAvg)";
    a seed set held by at most ``few`` cells names them (``name``: a cell key's text)."""
    by_set: dict = {}
    for key, ids in seed_ids.items():
        by_set.setdefault(style.seed_ids(ids), []).append(key)
    parts = []
    for ids, keys in sorted(by_set.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        cells = ", ".join(name(k) for k in keys) if len(keys) <= few else f"{len(keys)} cells"
        parts.append(f"n={len(ids)}: {style.seed_text(ids)} ({cells})")
    return "; ".join(parts)


def leaderboard_heatmap(table: pd.DataFrame, ax: Optional[plt.Axes] = None, title: str = "",
                        rows: Sequence[str] = (), columns: Sequence[str] = (), robust: float = 0.0,
                        seed_ids: Optional[Mapping[Tuple[str, str], Sequence[int]]] = None,
                        row_labels: Optional[Mapping[str, str]] = None,
                        column_labels: Optional[Mapping[str, str]] = None,
                        limits: Optional[Tuple[float, float]] = None) -> plt.Axes:
    """Mean accuracy per (local method, strategy), each cell annotated with its mean, '± ci95' (the 95 % t
    half-width over seeds) and its number of seeds 'n=...'. One colour scale over every cell, its full range
    unless ``robust`` (a percentile) clips the lower end (the colour bar then says so and ends in an arrow). Rows
    and columns named in ``rows``/``columns`` that have no stored run are left out and named under the heatmap; a
    missing cell inside a drawn row is hatched ('no run'). ``seed_ids``: (local, strategy) -> the seeds of that cell,
    named under the heatmap per count; ``row_labels``/``column_labels``: readable names; ``limits``: the colour scale
    (vmin, vmax) shared with other panels (default: this table's own range)."""
    ax = ax or plt.gca()
    means = table["mean"].unstack("strategy").astype(float)
    means = means.reindex(index=list(dict.fromkeys([*rows, *means.index])),
                          columns=list(dict.fromkeys([*columns, *means.columns])))
    empty_rows = [r for r in means.index if means.loc[r].isna().all()]
    empty_cols = [c for c in means.columns if means[c].isna().all()]
    means = means.drop(index=empty_rows, columns=empty_cols)
    ci = table["ci95"].unstack("strategy").reindex_like(means).astype(float)
    n = table["seeds"].unstack("strategy").reindex_like(means) if "seeds" in table else None

    def cell(i: int, j: int) -> str:
        m = means.iat[i, j]
        if pd.isna(m):
            return ""
        seeds = "" if n is None or pd.isna(n.iat[i, j]) else f"\nn={int(n.iat[i, j])}"
        half = "" if pd.isna(ci.iat[i, j]) else f"\n±{ci.iat[i, j]:.1f}"
        return f"{m:.1f}{half}{seeds}"

    labels = np.array([[cell(i, j) for j in range(means.shape[1])] for i in range(means.shape[0])], dtype=object)
    vmin, vmax = style.shared_limits([means.values], *(limits or (None, None)), robust=robust)
    clipped = bool((means.values < vmin).any())
    bar = f"mean accuracy (%); scale {vmin:.1f} to {vmax:.1f}, " + (
        f"clipped: cells below {vmin:.1f} share its colour" if clipped else "not clipped")
    shown = means.rename(index=lambda r: (row_labels or {}).get(r, r),
                         columns=lambda c: (column_labels or {}).get(c, c))
    sns.heatmap(shown, annot=labels, fmt="", cmap="viridis", ax=ax, vmin=vmin, vmax=vmax,
                cbar_kws={"label": bar, "extend": "min" if clipped else "neither"},
                annot_kws={"fontsize": 7}, linewidths=0.5, linecolor="white")
    for i, j in zip(*np.nonzero(means.isna().values)):
        ax.add_patch(plt.Rectangle((j, i), 1, 1, fill=False, hatch="///", edgecolor="0.6", lw=0))
        ax.text(j + 0.5, i + 0.5, "no run", ha="center", va="center", fontsize=7, color="0.3")
    notes = ["each cell: mean, ± 95 % t half-width over seeds (none with one seed), n = seeds"]
    if seed_ids:
        drawn = {k: v for k, v in seed_ids.items() if k[0] in means.index and k[1] in means.columns}
        notes.append(_seed_note(drawn, name=lambda k: " + ".join(
            [(row_labels or {}).get(k[0], k[0]), (column_labels or {}).get(k[1], k[1])])))
    left_out = ([(row_labels or {}).get(r, r) for r in empty_rows]
                + [(column_labels or {}).get(c, c) for c in empty_cols])
    if left_out:
        notes.append(f"not shown, no stored run: {', '.join(left_out)}")
    ax.set(xlabel="strategy (server)\n\n" + "\n".join(textwrap.fill(t, 130) for t in notes),
           ylabel="local method (client)", title=title)
    return ax


def scenario_map(ax: plt.Axes, domain_map: np.ndarray, title: str = "", xlabel: str = "slot",
                 cmap: str = "tab20", n_domains: Optional[int] = None) -> plt.Axes:
    """A clients x slots map of domain ids drawn with one fixed colour per domain id (key: ``style.category_key``
    with the same ``cmap``)."""
    n = n_domains or int(np.max(domain_map)) + 1
    colors = plt.get_cmap(cmap)
    sns.heatmap(domain_map, ax=ax, cmap=[colors(k % colors.N) for k in range(n)], vmin=-0.5, vmax=n - 0.5,
                cbar=False)
    ax.set(title=title, xlabel=xlabel, ylabel="client")
    return ax


def server_cost_figure(result: dict, axes: Optional[Sequence[plt.Axes]] = None) -> Sequence[plt.Axes]:
    """From ``benchmarks/results/server_cost_*.json``: server seconds per round and memory held between rounds
    against the number of clients (log-log), and memory held over rounds from an empty server."""
    if axes is None:
        _, axes = style.panels(3)
    scaling = pd.DataFrame(result["scaling"])
    scaling["seconds"] = scaling.get("round_s_at_default_steps", scaling["round_s"]).fillna(scaling["round_s"])
    for label, g in scaling.groupby("strategy", sort=False):
        axes[0].plot(g.clients, g.seconds, marker="o", label=label)
        held = g.retained_bytes.where(g.retained_bytes > 0)
        axes[1].plot(g.clients, held, marker="o", label=label)
    axes[0].set(xscale="log", yscale="log", xlabel="clients N", ylabel="server s / round (W + mixing)",
                title="server time per round")
    axes[1].set(xscale="log", yscale="log", xlabel="clients N", ylabel="bytes held between rounds",
                title="server memory (0 B not drawn)")
    rounds = pd.DataFrame(result["over_rounds"])
    for label, g in rounds.groupby("strategy", sort=False):
        axes[2].plot(g["round"], g.retained_bytes, marker=".", label=label)
    axes[2].set(xlabel="round", ylabel="bytes held after the round",
                title=f"memory over rounds ({result['over_rounds_clients']} clients)")
    style.legend_outside(axes[-1], title="strategy")
    return axes


def _series_seeds(rows: pd.DataFrame, seed_ids: str, seeds: str) -> Tuple[Optional[tuple], bool]:
    """The one seed set of a series' rows (or None when its points differ) and whether seed ids are known."""
    if seed_ids in rows:
        sets = {style.seed_ids(v) for v in rows[seed_ids]}
        return (next(iter(sets)) if len(sets) == 1 else None), True
    counts = set(rows[seeds].dropna().astype(int)) if seeds in rows else set()
    return ((next(iter(counts)),) if len(counts) == 1 else None), False


def gains_by_panel(table: pd.DataFrame, panel: Sequence[str], x: str = "method", hue: str = "model",
                   y: str = "gain over Local", err: str = "sd", seeds: str = "seeds", marker_hue: Optional[str] = None,
                   tie: Optional[float] = None, x_labels: Optional[Mapping[str, str]] = None,
                   axes: Optional[Sequence[plt.Axes]] = None, ncols: Optional[int] = None,
                   sort: bool = True, seed_ids: str = "seed ids", group: Optional[str] = None,
                   hue_labels: Optional[Mapping[str, str]] = None, clip_outliers: bool = False,
                   panel_size: Tuple[float, float] = style.PANEL, err_label: Optional[str] = None,
                   key_title: Optional[str] = None) -> Sequence[plt.Axes]:
    """Differences (e.g. each method's gain over Local) as points with +-``err`` bars: one panel per value of the
    ``panel`` columns, ``x`` on the x axis (grouped by ``group`` where given: separators and the group's name
    above), one dodged series per ``hue`` (``hue_labels``: readable names) in its own ``style.DISTINCT`` colour and
    marker, a shared y scale. Seeds are stated: a series whose points all rest on the same seeds names them in the
    key (from the ``seed_ids`` column, else the ``seeds`` count), otherwise each point is labelled with its own
    under it. A point without ``err`` (one seed) is an open marker with no bar, and the key then says so.
    ``marker_hue``'s series (e.g. a paper's means) is drawn as black crosses without error bars; ``tie`` shades
    +-tie around 0 (``style.margin_band``, with a key entry); ``clip_outliers``: points far from all the others
    (``style.outliers``) are left off the y-range and marked at its edge with their value (``style.off_scale``);
    ``x_labels`` renames x ticks; ``ncols``: panels per row (default: as many as fit), ``panel_size`` their size;
    ``sort`` False: panels in the order the table first shows them; ``err_label``: what the bars are, for the key.
    One key for every series of any panel: below the panels in a figure made here, right of the last panel when
    ``axes`` are given."""
    keys = list(dict.fromkeys(map(tuple, table[list(panel)].itertuples(index=False))))
    keys = sorted(keys) if sort else keys
    own_figure = axes is None
    if own_figure:
        _, axes = style.panels(len(keys), ncols=ncols, panel=panel_size, sharey=True)
    series = [h for h in pd.unique(table[hue]) if h != marker_hue]
    looks = dict(zip(series, style.distinct(len(series))))
    hues = series + ([marker_hue] if marker_hue in set(table[hue]) else [])
    width = 0.8 / max(1, len(hues))
    named = {h: _series_seeds(table[table[hue] == h], seed_ids, seeds) for h in series}
    any_single, clipped, drawn = False, [], []  # drawn: (ax, position, value, low, high, colour)
    for ax, key in zip(axes, keys):
        key = key if isinstance(key, tuple) else (key,)
        g = table[(table[list(panel)] == pd.Series(key, index=list(panel))).all(axis=1)]
        cols = [group, x] if group else x
        order = (list(dict.fromkeys(map(tuple, g[cols].itertuples(index=False)))) if group
                 else list(pd.unique(g[x])))
        for i, h in enumerate(hues):
            rows = g[g[hue] == h].drop_duplicates(cols).set_index(cols).reindex(order)
            pos = np.arange(len(order)) - 0.4 + width * (i + 0.5)
            if h == marker_hue:
                ax.scatter(pos, rows[y], marker="x", color="k", s=40, zorder=3)
                drawn += [(ax, p, v, v, v, "k") for p, v in zip(pos, rows[y]) if pd.notna(v)]
                continue
            colour, marker = looks[h]
            spread = rows[err] if err in rows else pd.Series(np.nan, index=rows.index)
            value = rows[y].to_numpy(dtype=float)
            single = spread.isna().to_numpy() & np.isfinite(value)
            any_single = any_single or bool(single.any())
            ax.errorbar(pos[~single], value[~single], yerr=spread[~single], fmt=marker, capsize=4.5, barsabove=True,
                        color=colour)  # bars over the markers, caps wider: an interval narrower than a marker shows
            ax.plot(pos[single], value[single], marker, mfc="white", color=colour)
            half = spread.fillna(0).to_numpy(dtype=float)
            drawn += [(ax, p, v, v - e, v + e, colour) for p, v, e in zip(pos, value, half) if np.isfinite(v)]
            if named[h][0] is None:  # this series' seeds differ between points: each point says its own
                ids = rows[seed_ids] if named[h][1] else rows[seeds]
                for p, v, e, s in zip(pos, value, half, ids):
                    if np.isfinite(v):
                        text = style.seed_text(s, prefix=False) if named[h][1] else f"n={int(s)}"
                        ax.annotate(text, (p, v - e), xytext=(0, -6), textcoords="offset points", rotation=90,
                                    ha="center", va="top", fontsize=6, color=colour)
        if tie:
            style.margin_band(ax, tie)
        ax.axhline(0, color="k", lw=0.8)
        names = [o[-1] for o in order] if group else order
        ax.set_xticks(np.arange(len(order)), [(x_labels or {}).get(m, m) for m in names], rotation=30, ha="right")
        if group:
            starts = [k for k in range(len(order)) if k == 0 or order[k][0] != order[k - 1][0]]
            for a, b in zip(starts, starts[1:] + [len(order)]):
                if a:
                    ax.axvline(a - 0.5, color="0.55", ls=":", lw=0.9)
                ax.text((a + b - 1) / 2, 1.01, str(order[a][0]), transform=ax.get_xaxis_transform(), ha="center",
                        va="bottom", fontsize=8)
        ax.set_title(" ".join(str(k) for k in key), pad=14 if group else None)
        ax.set_ylabel(f"{y} (points)")
        ax.grid(False, axis="x")
    if clip_outliers and drawn:
        out = style.outliers([d[2] for d in drawn])
        kept = [d for d, o in zip(drawn, out) if not o]
        if out.any() and kept:
            lo, hi = min(min(d[3] for d in kept), -(tie or 0)), max(max(d[4] for d in kept), tie or 0)
            pad = 0.08 * (hi - lo)
            for ax in axes:
                ax.set_ylim(lo - pad, hi + pad)
            for (ax, p, v, low, high, colour), o in zip(drawn, out):
                if o:
                    interval = f" [{low:+.1f}, {high:+.1f}]" if high > low else ""
                    style.off_scale(ax, p, v, f"{v:+.1f}{interval}\noff scale", colour)
                    clipped.append(p)
    key_entries = {}
    for h in hues:
        if h == marker_hue:
            key_entries[str((hue_labels or {}).get(h, h))] = plt.Line2D([], [], marker="x", color="k", ls="none")
            continue
        ids, known = named[h]
        said = ("seeds under each point" if ids is None else style.seed_text(ids) if known
                else f"{ids[0]} seed{'s' if ids[0] != 1 else ''}")
        colour, marker = looks[h]
        key_entries[f"{(hue_labels or {}).get(h, h)} ({said})"] = plt.Line2D([], [], marker=marker, color=colour,
                                                                              ls="none")
    if err_label:
        key_entries[err_label] = plt.Line2D([], [], marker="|", ms=12, color="0.3", ls="none")
    if any_single:  # say what an open marker is
        key_entries["open marker: one seed, no bar"] = plt.Line2D([], [], marker="o", mfc="white", color="0.4",
                                                                  ls="none")
    if tie:
        key_entries[f"±{tie:g} points: equal within the margin"] = style.margin_key(tie)
    if clipped:
        key_entries["off the y-range drawn (its value beside it)"] = plt.Line2D([], [], marker="v", color="0.3",
                                                                              ls="none")
    title = hue if key_title is None else key_title
    if own_figure:  # a key beside one panel would widen its column of the constrained grid
        axes[0].figure.legend(key_entries.values(), key_entries.keys(), loc="outside lower center", title=title,
                              frameon=False, ncols=min(len(key_entries), 3))
    else:
        axes[-1].legend(key_entries.values(), key_entries.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0),
                        title=title, frameon=False, borderaxespad=0.0)
    return axes


def interval_dots(table: pd.DataFrame, category: str, value: str = "accuracy", panel: Optional[str] = None,
                  seed: str = "seed", order: Optional[Sequence[Any]] = None,
                  labels: Optional[Mapping[Any, str]] = None, title: str = "") -> plt.Figure:
    """A dot plot for means that differ by a few points: one row per ``category`` (in ``order``), its mean ``value``
    over seeds with the 95 % t interval (``style.mean_sd``; open marker and no bar with one seed), one panel per
    ``panel`` value on one shared x-range that starts near the data, not at 0 (so 65-74 % differences stay
    visible), and beside every row its mean, interval and the seeds it rests on. Returns the figure."""
    summary = style.mean_sd(table, category, value, hue=panel, seed=seed)
    order = list(order or pd.unique(table[category]))
    panels_ = list(pd.unique(table[panel])) if panel else [None]
    fig, axes = plt.subplots(1, len(panels_), figsize=(style.MAX_WIDTH, 0.45 * len(order) + 1.6), sharex=True,
                             sharey=True, squeeze=False, layout="constrained")
    colours = dict(zip(order, style.distinct(len(order))))
    for ax, key in zip(axes[0], panels_):
        here = summary[summary[panel] == key] if panel else summary
        for k, name in enumerate(order):
            row = here[here[category] == name]
            if row.empty:
                continue
            r = row.iloc[0]
            colour, marker = colours[name]
            one = r["n"] <= 1 or pd.isna(r["ci95"])
            ax.errorbar([r["mean"]], [k], xerr=None if one else [r["ci95"]], fmt=marker, color=colour, capsize=4,
                        mfc="white" if one else colour, ms=7)
            interval = "" if one else f" [{r['mean'] - r['ci95']:.1f}, {r['mean'] + r['ci95']:.1f}]"
            ax.annotate(f"{r['mean']:.1f}{interval}, {style.seed_text(r['seeds'])}", (1.0, k),
                        xycoords=("axes fraction", "data"), xytext=(6, 0), textcoords="offset points", va="center",
                        fontsize=8, color=colour)
        ax.set_yticks(range(len(order)), [(labels or {}).get(n, n) for n in order])
        ax.set_ylim(len(order) - 0.5, -0.5)
        ax.set_title("" if key is None else str(key))
        ax.set_xlabel(f"{value} (%)")
        ax.grid(False, axis="y")
    lo, hi = (summary["mean"] - summary["ci95"].fillna(0)).min(), (summary["mean"] + summary["ci95"].fillna(0)).max()
    pad = max(0.5, 0.08 * (hi - lo))
    axes[0, 0].set_xlim(lo - pad, hi + pad)
    note = "mean and 95 % t interval over seeds" + (
        "; open marker: one seed (no interval)" if (summary["n"] <= 1).any() else "")
    fig.suptitle(f"{title}\n({note}; the x-axis starts near the data, not at 0)" if title else note,
                 fontsize=plt.rcParams["axes.titlesize"])
    return fig


def sweep_figure(sweeps: Sequence[Tuple[pd.DataFrame, str, str]], y: str = "accuracy", hue: str = "variant",
                 labels: Optional[Mapping[Any, str]] = None, log_x: Sequence[str] = (), key_title: str = "strategy",
                 xlabels: Optional[Mapping[str, str]] = None, title: str = "") -> plt.Figure:
    """Several sweeps side by side on one y-scale (``sweeps``: (table, x column, panel title)), one line per ``hue``
    in ``style.DISTINCT`` colours and markers (``labels``: readable names), 95 % t intervals where a point has
    several seeds and the seeds of every point stated (``style.interval_lines``); one key, right of the last panel,
    whose title says what the bars are. ``log_x``: x columns drawn on a log scale. Returns the figure."""
    fig, axes = plt.subplots(1, len(sweeps), figsize=(style.MAX_WIDTH, 3.8), sharey=True, squeeze=False,
                             layout="constrained")
    names = list(dict.fromkeys(h for table, _, _ in sweeps if len(table) for h in pd.unique(table[hue])))
    looks = dict(zip(names, style.distinct(len(names))))  # a strategy keeps its look in every panel
    for k, (ax, (table, x, panel_title)) in enumerate(zip(axes[0], sweeps)):
        if table.empty:
            ax.set_title(f"{panel_title}: no stored run")
            continue
        last = k == len(sweeps) - 1
        style.interval_lines(ax, table, x, y, hue=hue, labels=labels, key_title=key_title, key=last, looks=looks)
        ax.set(xlabel=(xlabels or {}).get(x, x), ylabel=f"{y} (%)", title=panel_title,
               xscale="log" if x in log_x else "linear")
        ax.set_xticks(sorted(table[x].unique()), [f"{v:g}" for v in sorted(table[x].unique())])
        ax.minorticks_off()
    if title:
        fig.suptitle(title, fontsize=plt.rcParams["axes.titlesize"])
    return fig


def domain_groups(table: pd.DataFrame | np.ndarray) -> list:
    """Client i's group (0, 1, ...: clients with the same domain at every step/slot, numbered by first appearance),
    from a steps or slots table (columns client, domain and step or slot) or a clients x slots domain map."""
    if isinstance(table, pd.DataFrame):
        time = "step" if "step" in table else "slot"
        table = table.pivot_table(index="client", columns=time, values="domain", aggfunc="first").astype(str).values
    ids: dict = {}
    return [ids.setdefault(tuple(row), len(ids)) for row in np.asarray(table)]
