"""Readings shared by the studies: a table put into sentences computed from its own numbers (the ordering of means,
a heterogeneity sweep's wins and gaps, what uploads reveal). The library computes the tables; these say what they
show."""
from __future__ import annotations

from typing import Mapping, Optional

import pandas as pd


def sweep_reading(table: pd.DataFrame, field: str, method: str, labels: Optional[Mapping[str, str]] = None) -> str:
    """One paragraph computed from a ``heterogeneity_sweep`` table: at how many of the points where every strategy
    is stored ``method`` is best, its margin over the best other strategy there (mean over seeds, points), and
    which points lack runs. ``labels`` maps strategy names to display names."""
    name = (lambda s: (labels or {}).get(s, s))
    if table.empty or method not in set(table.variant):
        return f"No stored runs of {name(method)} over {field.upper()} yet."
    means = table.groupby([field, "variant"]).accuracy.mean().unstack()
    complete = means.dropna()
    gaps = [f"{v:g}" for v in means.index if v not in complete.index]
    if complete.empty or len(complete.columns) < 2:
        return f"No {field.upper()} point has every strategy stored yet."
    others = complete.drop(columns=method)
    margin = complete[method] - others.max(axis=1)
    best = complete.idxmax(axis=1)
    wins = int((best == method).sum())
    parts = [f"Over {field.upper()} = {', '.join(f'{v:g}' for v in complete.index)}, {name(method)} is best at "
             f"{wins} of {len(complete)} points; its margin over the best other strategy ranges from "
             f"{margin.min():+.2f} to {margin.max():+.2f} points."]
    losers = [f"{v:g} ({name(best[v])}, {-margin[v]:.2f} ahead)" for v in complete.index if best[v] != method]
    if losers:
        parts.append("Where it is not best, the winner is at " + "; ".join(losers) + ".")
    spread = complete.max() - complete.min()
    parts.append("Range of each strategy's accuracy across the points: "
                 + ", ".join(f"{name(s)} {spread[s]:.2f}" for s in [method, *others.columns]) + " points.")
    if gaps:
        parts.append(f"Not every strategy is stored at {field.upper()} = {', '.join(gaps)}.")
    return " ".join(parts)


def ordering_phrase(means: Mapping[str, float], labels: Optional[Mapping[str, str]] = None, digits: int = 2) -> str:
    """'A 72.76 > B 72.57 > C 71.71' (highest first; NaN left out)."""
    s = pd.Series(dict(means), dtype=float).dropna().sort_values(ascending=False)
    return " > ".join(f"{(labels or {}).get(k, k)} {v:.{digits}f}" for k, v in s.items())


def leakage_reading(table: pd.DataFrame, margin: float = 5.0) -> str:
    """The leakage table in words: each upload's guess accuracy against chance, most revealing first, and every pair
    where the smaller upload reveals more (by more than ``margin`` points) than a larger one."""
    if table.empty:
        return "No uploads were recorded."
    t = table.sort_values("guess accuracy (%)", ascending=False)
    acc, size = t["guess accuracy (%)"], t["bytes (float32)"]
    chance = float(t["chance (%)"].iloc[0])
    text = (f"From one upload, a probing classifier guesses the client's current corruption (chance {chance:.1f}%): "
            + ", ".join(f"{u} {acc[u]:.1f}% ({int(size[u])} bytes)" for u in t.index) + ".")
    pairs = [f"{a} ({int(size[a])} bytes, {acc[a]:.1f}%) more than {b} ({int(size[b])} bytes, {acc[b]:.1f}%)"
             for a in t.index for b in t.index if size[a] < size[b] and acc[a] > acc[b] + margin]
    if pairs:
        text += " Fewer bytes are not less revealed: " + "; ".join(pairs) + "."
    return text
