"""The papers' published numbers (quoted from their tables, ``data/paper_numbers/``), their method labels and TTA
settings, shared by every paper's study (``fedtsa/``, ``fedctta/``, ``pfedbbn/``, ``fedicon/``, ``fedacross/``),
which lay our results beside them."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Sequence

import pandas as pd

PAPER_DIR = Path(__file__).resolve().parent.parent / "data" / "paper_numbers"

METHOD_LABELS: Dict[str, str] = {
    "source": "No-Adapt", "local": "Local", "fedavg": "FedAvg", "fedavg_ft": "FedAvg+FT", "fedprox": "FedProx",
    "fedavgm": "FedAvgM", "fedamp": "FedAMP", "moon": "MOON", "pfedsd": "pFedSD", "pfedgraph": "pFedGraph",
    "ldawa": "LDAWA", "fedtsa": "FedTSA", "fedctta": "FedCTTA",
}

# the local-method settings the papers call TTA-bn and TTA-grad (FedTSA Sec. 5.1: SGD, lr 1e-4, entropy)
TTA_SETTINGS: Dict[str, Dict[str, object]] = {
    "bn": {"local": "bn", "local_params": {}},
    "grad": {"local": "tent", "local_params": {"params": "all", "optimizer": "sgd", "lr": 1e-4}},
    # the TTA-grad 2x2 (issue "Fidelity I"): BatchNorm {batch, running} x optimiser {SGD 1e-4 (the paper), Adam 1e-5
    # (the reference code)}; "grad" above is the (batch, SGD) cell. bn="running" is the reference clients' BN:
    # train-mode adaptation updating running statistics, eval-mode prediction, whole state mixed (tta.running).
    "grad-adam": {"local": "tent", "local_params": {"params": "all", "optimizer": "adam", "lr": 1e-5}},
    "grad-running": {"local": "tent", "local_params": {"params": "all", "optimizer": "sgd", "lr": 1e-4,
                                                      "bn": "running"}},
    "grad-running-adam": {"local": "tent", "local_params": {"params": "all", "optimizer": "adam", "lr": 1e-5,
                                                           "bn": "running"}},
}


def paper_tta(tta: str) -> str:
    """The paper's TTA mode ('bn' or 'grad') a ``TTA_SETTINGS`` cell is compared with."""
    if tta not in TTA_SETTINGS:
        raise ValueError(f"unknown TTA setting {tta!r}; valid: {list(TTA_SETTINGS)}")
    return "bn" if tta == "bn" else "grad"


def paper_table(name: str) -> pd.DataFrame:
    """A quoted paper table from ``data/paper_numbers/<name>.csv`` (comment lines start with #)."""
    path = PAPER_DIR / f"{name}.csv"
    if not path.exists():
        raise FileNotFoundError(f"no paper table {path}; available: {sorted(p.stem for p in PAPER_DIR.glob('*.csv'))}")
    return pd.read_csv(path, comment="#")


def beside_per_corruption(ours: pd.DataFrame, name: str, dataset: str | None = None) -> pd.DataFrame:
    """Row means of a per-corruption table (``workbook.per_domain_table``) beside the means of the paper table
    ``name`` (columns method, corruption, accuracy, optionally dataset): ours, the paper's, their difference, and
    each method's gap to FedAvg in both (the ordering is what can transfer between source models)."""
    paper = paper_table(name)
    if dataset is not None and "dataset" in paper:
        paper = paper[paper.dataset == dataset]
    paper_mean = paper[paper.corruption == "mean"].set_index("method")["accuracy"].rename({"Source": "No-Adapt"})
    ours_mean = ours["mean"].rename(index=lambda s: METHOD_LABELS.get(s, s)) if len(ours) else pd.Series(dtype=float)
    out = pd.DataFrame({"ours": ours_mean, "paper": paper_mean})
    out = out.reindex([*ours_mean.index, *paper_mean.index.difference(ours_mean.index)])
    out["ours - paper"] = out["ours"] - out["paper"]
    if "FedAvg" in out.index:
        for col in ("ours", "paper"):
            out[f"{col} - FedAvg"] = out[col] - out.loc["FedAvg", col]
    if "seeds" in ours:
        out["seeds"] = ours["seeds"].rename(index=lambda s: METHOD_LABELS.get(s, s))
    return out


def paper_lookup(table: pd.DataFrame, keys: Sequence[tuple], column: str) -> list:
    """``table.loc[key, column]`` for each key, NaN where the paper has no such row."""
    return [table.loc[k, column] if k in table.index else float("nan") for k in keys]
