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
