"""Tables beside the paper's numbers and the closing comparison for the FedICON notebook."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import pandas as pd

from ..paper import paper_table
from .study import ABLATION, ablation_name


def paper_columns(table: str, columns: Sequence[str], methods: Sequence[str]) -> pd.DataFrame:
    """Paper accuracies (methods x ``columns``) from ``data/paper_numbers/fedicon_<table>.csv``."""
    p = paper_table(f"fedicon_{table}")
    wide = p.pivot_table(index="method", columns="column", values="accuracy")
    return wide.reindex(index=[m for m in methods if m in wide.index], columns=list(columns))


def mean_by_method(rows: pd.DataFrame, shift: str = "shifted") -> pd.Series:
    """Mean over clients, then over seeds, of each method's accuracy."""
    r = rows[rows["shift"] == shift]
    return r.groupby(["method", "seed"]).accuracy.mean().groupby(level="method").mean()


def beside_paper(ours: pd.DataFrame, paper: pd.DataFrame, paper_label: str) -> pd.DataFrame:
    """Our table (strings) with the paper's columns appended, prefixed by ``paper_label``."""
    return ours.join(paper.add_prefix(f"{paper_label} ").round(2), how="left").fillna("")


def ablation_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Table 8: the eight (LIE, GIS, TTA) variants, our mean accuracy beside the paper's."""
    ours = mean_by_method(rows)
    paper = paper_table("fedicon_table8").set_index(["lie", "gis", "tta"]).accuracy
    out = []
    for flags in ABLATION:
        name = ablation_name(*flags)
        out.append({"local invariance extraction": "x" if flags[0] else "", "global invariance sharing":
                    "x" if flags[1] else "", "test-time adaptation": "x" if flags[2] else "",
                    "ours": round(float(ours.get(name, float("nan"))), 2),
                    "paper (Digit-5)": float(paper.loc[tuple(int(f) for f in flags)])})
    return pd.DataFrame(out)


def shift_table(rows: pd.DataFrame, methods: Sequence[str]) -> pd.DataFrame:
    """Table 4 shape: mean accuracy on the original and the shifted test sets, and their difference."""
    orig, shifted = mean_by_method(rows, "original"), mean_by_method(rows, "shifted")
    idx = [m for m in methods if m in shifted.index]
    return pd.DataFrame({"original": orig.reindex(idx), "shifted": shifted.reindex(idx),
                         "delta": shifted.reindex(idx) - orig.reindex(idx)}).round(2)


def verdict(name: str, means: pd.Series, tta_methods: Sequence[str] = ("Tent", "EATA", "T3A"),
            extra: Optional[Dict[str, float]] = None) -> str:
    """One sentence: FedICON against FedAvg and the best TTA baseline, with the numbers."""
    if "FedICON" not in means or "FedAvg" not in means:
        return f"{name}: not run."
    tta = {m: means[m] for m in tta_methods if m in means}
    best = max(tta, key=tta.get) if tta else None
    fi, fa = means["FedICON"], means["FedAvg"]
    text = (f"{name}: FedICON {fi:.2f}% vs FedAvg {fa:.2f}% ({'beats' if fi > fa else 'does not beat'} it by "
            f"{fi - fa:+.2f})")
    if best:
        text += (f"; best TTA baseline {best} {tta[best]:.2f}% (FedICON {'ahead' if fi > tta[best] else 'behind'} by "
                 f"{fi - tta[best]:+.2f})")
    return text + "."
