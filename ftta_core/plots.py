"""Figures read from the tidy results tables only: collaboration matrices, accuracy over time, comparisons."""
from __future__ import annotations

from typing import Optional, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns


def collaboration_heatmap(weights: np.ndarray, ax: Optional[plt.Axes] = None, title: str = "",
                          labels: Optional[Sequence[str]] = None, annotate: bool = False) -> plt.Axes:
    """Heatmap of one collaboration matrix W (row i: how much client i takes from each client j)."""
    ax = ax or plt.gca()
    sns.heatmap(np.asarray(weights), ax=ax, cmap="viridis", vmin=0, square=True, annot=annotate, fmt=".2f",
                xticklabels=labels if labels is not None else "auto",
                yticklabels=labels if labels is not None else "auto", cbar_kws={"shrink": 0.7})
    ax.set_xlabel("from client j")
    ax.set_ylabel("client i")
    ax.set_title(title)
    return ax


def collaboration_over_time(weights: np.ndarray, client: int, ax: Optional[plt.Axes] = None,
                            slot_steps: Optional[int] = None, title: str = "") -> plt.Axes:
    """Row ``client`` of W over time ([T, N, N] -> image of clients x steps)."""
    ax = ax or plt.gca()
    row = np.asarray(weights)[:, client, :].T
    im = ax.imshow(row, aspect="auto", cmap="viridis", vmin=0, interpolation="nearest")
    plt.colorbar(im, ax=ax, shrink=0.8)
    if slot_steps:
        for x in range(slot_steps, row.shape[1], slot_steps):
            ax.axvline(x - 0.5, color="white", lw=0.5, alpha=0.6)
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
                      ax: Optional[plt.Axes] = None, reference: Optional[float] = None) -> plt.Axes:
    """Bar chart of ``y`` per ``x`` (and ``hue``) with seed spread as error bars."""
    ax = ax or plt.gca()
    sns.barplot(data=table, x=x, y=y, hue=hue, ax=ax, errorbar="sd")
    if reference is not None:
        ax.axhline(reference, color="k", ls="--", lw=1, label="source (no adaptation)")
    lo = float(table[y].min())
    ax.set_ylim(max(0.0, lo - 10), min(100.0, float(table[y].max()) + 5))
    ax.set_ylabel(f"{y} (%)")
    return ax


def collaboration_snapshots(weights: np.ndarray, steps: Sequence[int], axes: Optional[Sequence[plt.Axes]] = None,
                            labels: Optional[Sequence[str]] = None) -> Sequence[plt.Axes]:
    """W at each of ``steps`` ([T, N, N] -> one heatmap per step, shared colour scale): the matrices over rounds."""
    w = np.asarray(weights)
    if axes is None:
        _, axes = plt.subplots(1, len(steps), figsize=(3.2 * len(steps), 3))
    axes = np.atleast_1d(axes)
    vmax = float(w[list(steps)].max())
    for ax, t in zip(axes, steps):
        sns.heatmap(w[t], ax=ax, cmap="viridis", vmin=0, vmax=vmax, square=True, cbar=ax is axes[-1],
                    xticklabels=labels if labels is not None else "auto",
                    yticklabels=labels if labels is not None else "auto", cbar_kws={"shrink": 0.7})
        ax.set_title(f"step {t}")
        ax.set_xlabel("from client j")
    axes[0].set_ylabel("client i")
    return axes


def accuracy_curve(table: pd.DataFrame, x: str, y: str = "accuracy", hue: Optional[str] = None,
                   ax: Optional[plt.Axes] = None, log_x: bool = False) -> plt.Axes:
    """Mean ``y`` (%) against ``x`` with the seed spread (sd) as a band, one line per ``hue``."""
    ax = ax or plt.gca()
    sns.lineplot(data=table, x=x, y=y, hue=hue, ax=ax, marker="o", errorbar="sd")
    if log_x:
        ax.set_xscale("log")
    ax.set_ylabel(f"{y} (%)")
    return ax


def server_cost_figure(result: dict, axes: Optional[Sequence[plt.Axes]] = None) -> Sequence[plt.Axes]:
    """From ``benchmarks/results/server_cost_*.json``: server seconds per round and memory held between rounds
    against the number of clients (log-log), and memory held over rounds from an empty server."""
    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(16, 4))
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
    for ax in axes:
        ax.legend(fontsize=7)
    return axes
