"""Figures read from the tidy results tables only: collaboration matrices, accuracy over time, comparisons.

Every figure follows ``ftta_core.style``: collaboration matrices on the fixed [0, 1] scale, legends outside the data,
error bars from seeds.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

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


def leaderboard_heatmap(table: pd.DataFrame, ax: Optional[plt.Axes] = None, title: str = "",
                        rows: Sequence[str] = (), columns: Sequence[str] = (), robust: float = 10.0) -> plt.Axes:
    """Mean accuracy per (local method, strategy), annotated 'mean ± ci95'. The colour scale starts at the
    ``robust`` percentile of the cells (lower cells keep their number, the colour bar's arrow marks the clip), so
    one collapsed cell does not flatten the rest; ``rows``/``columns`` that have no run are drawn hatched, 'not run'."""
    ax = ax or plt.gca()
    means = table["mean"].unstack("strategy").astype(float)
    means = means.reindex(index=list(dict.fromkeys([*rows, *means.index])),
                          columns=list(dict.fromkeys([*columns, *means.columns])))
    ci = table["ci95"].unstack("strategy").reindex_like(means).astype(float)
    labels = means.map(lambda v: "" if pd.isna(v) else f"{v:.1f}") + ci.map(
        lambda v: "" if pd.isna(v) else f"\n±{v:.1f}")
    vmin, vmax = style.shared_limits([means.values], robust=robust)
    clipped = bool((means.values < vmin).any())
    sns.heatmap(means, annot=labels.values, fmt="", cmap="viridis", ax=ax, vmin=vmin, vmax=vmax,
                cbar_kws={"label": "accuracy (%)", "extend": "min" if clipped else "neither"},
                annot_kws={"fontsize": 7}, linewidths=0.5, linecolor="white")
    for i, j in zip(*np.nonzero(means.isna().values)):
        ax.add_patch(plt.Rectangle((j, i), 1, 1, fill=False, hatch="///", edgecolor="0.6", lw=0))
        ax.text(j + 0.5, i + 0.5, "not run", ha="center", va="center", fontsize=7, color="0.3")
    ax.set(xlabel="strategy", ylabel="local method", title=title)
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


def gains_by_panel(table: pd.DataFrame, panel: Sequence[str], x: str = "method", hue: str = "model",
                   y: str = "gain over Local", err: str = "sd", seeds: str = "seeds", marker_hue: Optional[str] = None,
                   tie: Optional[float] = None, x_labels: Optional[Mapping[str, str]] = None,
                   axes: Optional[Sequence[plt.Axes]] = None, ncols: Optional[int] = None,
                   sort: bool = True) -> Sequence[plt.Axes]:
    """Differences (e.g. each method's gain over Local) as points with +-``err`` bars: one panel per value of the
    ``panel`` columns, ``x`` on the x axis, one dodged series per ``hue`` (its key entry gives its seed range),
    a shared y scale; a point without ``err`` (one seed) is an open marker with no bar, and the key then says so. ``marker_hue``'s series
    (e.g. a paper's means) is drawn as black crosses without error bars; ``tie`` shades +-tie around 0;
    ``x_labels`` renames x ticks; ``ncols``: panels per row (default: as many as fit); ``sort`` False: panels in the
    order the table first shows them. One key for every series of any panel: below the panels in a figure made
    here, right of the last panel when ``axes`` are given."""
    keys = list(dict.fromkeys(map(tuple, table[list(panel)].itertuples(index=False))))
    keys = sorted(keys) if sort else keys
    own_figure = axes is None
    if own_figure:
        _, axes = style.panels(len(keys), ncols=ncols, sharey=True)
    series = [h for h in pd.unique(table[hue]) if h != marker_hue]
    colours = dict(zip(series, sns.color_palette(n_colors=max(1, len(series)))))
    hues = series + ([marker_hue] if marker_hue in set(table[hue]) else [])
    width = 0.8 / max(1, len(hues))
    key_entries = {}
    any_single = False
    for ax, key in zip(axes, keys):
        key = key if isinstance(key, tuple) else (key,)
        g = table[(table[list(panel)] == pd.Series(key, index=list(panel))).all(axis=1)]
        order = list(pd.unique(g[x]))
        for i, h in enumerate(hues):
            rows = g[g[hue] == h].set_index(x).reindex(order)
            pos = np.arange(len(order)) - 0.4 + width * (i + 0.5)
            if h == marker_hue:
                ax.scatter(pos, rows[y], marker="x", color="k", s=40, zorder=3)
                continue
            spread = rows[err] if err in rows else pd.Series(np.nan, index=rows.index)
            single = spread.isna().to_numpy() & rows[y].notna().to_numpy()
            any_single = any_single or bool(single.any())
            ax.errorbar(pos[~single], rows[y][~single], yerr=spread[~single], fmt="o", capsize=3, color=colours[h])
            ax.plot(pos[single], rows[y][single], "o", mfc="white", color=colours[h])
        if tie:
            ax.axhspan(-tie, tie, color="0.9", zorder=0)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(order)), [(x_labels or {}).get(m, m) for m in order], rotation=30, ha="right")
        ax.set_title(" ".join(str(k) for k in key))
        ax.set_ylabel(f"{y} (points)")
        ax.grid(False, axis="x")
    for h in hues:
        n = table.loc[table[hue] == h, seeds]
        label = str(h) if h == marker_hue else f"{h} ({int(n.min())}" + (
            f"-{int(n.max())}" if n.max() != n.min() else "") + f" seed{'s' if n.max() > 1 else ''})"
        key_entries[label] = (plt.Line2D([], [], marker="x", color="k", ls="none") if h == marker_hue
                              else plt.Line2D([], [], marker="o", color=colours[h], ls="none"))
    if any_single:  # say what an open marker is
        key_entries["open marker: one seed, no bar"] = plt.Line2D([], [], marker="o", mfc="white", color="0.4",
                                                                  ls="none")
    if own_figure:  # a key beside one panel would widen its column of the constrained grid
        axes[0].figure.legend(key_entries.values(), key_entries.keys(), loc="outside lower center", title=hue,
                              frameon=False, ncols=min(len(key_entries), 4))
    else:
        axes[-1].legend(key_entries.values(), key_entries.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0),
                        title=hue, frameon=False, borderaxespad=0.0)
    return axes


def domain_groups(table: pd.DataFrame | np.ndarray) -> list:
    """Client i's group (0, 1, ...: clients with the same domain at every step/slot, numbered by first appearance),
    from a steps or slots table (columns client, domain and step or slot) or a clients x slots domain map."""
    if isinstance(table, pd.DataFrame):
        time = "step" if "step" in table else "slot"
        table = table.pivot_table(index="client", columns=time, values="domain", aggfunc="first").astype(str).values
    ids: dict = {}
    return [ids.setdefault(tuple(row), len(ids)) for row in np.asarray(table)]
