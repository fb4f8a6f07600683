"""The papers' published numbers (quoted from their tables) and our results laid beside them."""
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
}


def paper_table(name: str) -> pd.DataFrame:
    """A quoted paper table from ``data/paper_numbers/<name>.csv`` (comment lines start with #)."""
    path = PAPER_DIR / f"{name}.csv"
    if not path.exists():
        raise FileNotFoundError(f"no paper table {path}; available: {sorted(p.stem for p in PAPER_DIR.glob('*.csv'))}")
    return pd.read_csv(path, comment="#")


def beside_fedtsa_table1(grid: pd.DataFrame, dataset: str, tta: str, methods: Sequence[str]) -> pd.DataFrame:
    """Rows = methods (plus No-Adapt), columns = ours (mean ± std over seeds) and paper, for NIID and IID.

    ``grid`` has one row per run with columns strategy, setting ('niid'/'iid'), seed, accuracy, accuracy_source.
    """
    paper = paper_table("fedtsa_table1")
    paper = paper[(paper.dataset == dataset) & (paper.tta == tta)].set_index(["method", "setting"])
    rows = []
    for setting in ("niid", "iid"):
        g = grid[grid.setting == setting]
        if g.empty:
            continue
        src = g.groupby("seed")["accuracy_source"].first()
        entries = [("No-Adapt", src)]
        if tta == "bn" and "local" not in methods:
            # under TTA-bn a client's prediction before mixing does not depend on the strategy (no state is
            # carried between steps), so every run's accuracy_local is the Local number of its seed
            entries.append(("Local", g.groupby("seed")["accuracy_local"].first()))
        entries += [(METHOD_LABELS.get(m, m), g[g.strategy == m]["accuracy"]) for m in methods]
        for label, values in entries:
            if values.empty:
                continue
            key = (label, setting)
            rows.append({"method": label, "setting": setting, "ours_mean": values.mean(),
                         "ours_std": values.std(ddof=1) if len(values) > 1 else 0.0, "seeds": len(values),
                         "paper_mean": paper.loc[key, "mean"] if key in paper.index else float("nan"),
                         "paper_std": paper.loc[key, "std"] if key in paper.index else float("nan")})
    out = pd.DataFrame(rows)
    out["difference"] = out["ours_mean"] - out["paper_mean"]
    return out


def to_markdown(table: pd.DataFrame) -> str:
    """A compact markdown rendering: 'mean ± std' for ours and the paper, and the difference."""
    lines = ["| method | setting | ours (mean ± std, seeds) | paper (mean ± std) | ours − paper |", "|---|---|---|---|---|"]
    for r in table.itertuples():
        paper = "–" if pd.isna(r.paper_mean) else f"{r.paper_mean:.2f} ± {r.paper_std:.2f}"
        diff = "–" if pd.isna(r.difference) else f"{r.difference:+.2f}"
        lines.append(f"| {r.method} | {r.setting.upper()} | {r.ours_mean:.2f} ± {r.ours_std:.2f} ({r.seeds}) | "
                     f"{paper} | {diff} |")
    return "\n".join(lines) + "\n"
