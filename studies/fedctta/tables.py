"""FedCTTA's tables (Rajib et al.) beside ours: Table I from the runs stored by ``study fedtsa table`` (the FedTSA
protocol), Table III from the case study with FedCTTA's orders, Table IV (probes x statistic x distance)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import pandas as pd

from studies.fedtsa.case_study import case_study_table
from studies.fedtsa.table1 import beside_fedtsa_table1
from studies.paper import METHOD_LABELS, paper_lookup, paper_table
from ftta_core.scenarios import CASE_STUDY_ALL

if TYPE_CHECKING:
    from ftta_core.workbook import StoredRun


def beside_fedctta_table3(runs: Mapping[str, "StoredRun"]) -> pd.DataFrame:
    """Our case study with FedCTTA's orders (``study fedtsa case-study --orders fedctta``) beside its Table III: accuracy (%) of
    all ten clients per slot (rows: method and source, ours / paper) and the mean over the slots both have, with each
    method's gain over No-Adapt (the paper's source model is weaker than ours, so gains compare better)."""
    paper = paper_table("fedctta_table3")
    paper = paper[paper.slot.astype(str) != "mean"].assign(slot=lambda d: d.slot.astype(int) - 1)  # ours count from 0
    ours = case_study_table(runs).xs(CASE_STUDY_ALL, level="group").drop(columns="mean")
    ours.index = [METHOD_LABELS.get(s, s) for s in ours.index]
    first = next(iter(runs.values()))
    source = first.slots.assign(c=first.slots.accuracy_source * first.slots.n).groupby("slot")[["c", "n"]].sum()
    ours.loc["No-Adapt"] = source.c / source.n
    wide = paper.pivot(index="method", columns="slot", values="accuracy")
    rows = []
    for method in ["No-Adapt", *[m for m in ours.index if m != "No-Adapt"], *wide.index.difference(ours.index)]:
        for who, table in (("ours", ours), ("paper", wide)):
            if method in table.index:
                rows.append({"method": method, "who": who, **table.loc[method].dropna().to_dict()})
    out = pd.DataFrame(rows).set_index(["method", "who"])
    shared = [c for c in out.columns if out[c].notna().all()]
    out["mean (slots run)"] = out[shared].mean(axis=1)
    base = out.xs("No-Adapt", level="method")["mean (slots run)"]
    out["gain over No-Adapt"] = [out.loc[(m, w), "mean (slots run)"] - base.get(w, float("nan")) for m, w in out.index]
    return out


def beside_fedctta_table1(grid: pd.DataFrame, dataset: str, tta: str, methods: Sequence[str]) -> pd.DataFrame:
    """Like ``beside_fedtsa_table1`` but against FedCTTA's Table I (``paper_mean``, ``paper_std``, ``difference``),
    with FedTSA's Table 1 number for the same row kept beside it (``fedtsa_paper_mean``): the two papers report
    different numbers for the same methods and protocol (e.g. No-Adapt on CIFAR-10-C)."""
    columns = ["method", "setting", "ours_mean", "ours_std", "seeds", "paper_mean", "paper_std", "difference",
               "fedtsa_paper_mean"]
    if grid.empty:
        return pd.DataFrame(columns=columns)
    out = beside_fedtsa_table1(grid, dataset, tta, methods)
    if out.empty:
        return pd.DataFrame(columns=columns)
    out = out.rename(columns={"paper_mean": "fedtsa_paper_mean"}).drop(columns=["paper_std", "difference"])
    paper = paper_table("fedctta_table1")
    paper = paper[(paper.dataset == dataset) & (paper.tta == tta)].set_index(["method", "setting"])
    keys = list(zip(out.method, out.setting))
    out["paper_mean"] = paper_lookup(paper, keys, "mean")
    out["paper_std"] = paper_lookup(paper, keys, "std")
    out["difference"] = out["ours_mean"] - out["paper_mean"]
    return out[columns]


def beside_fedctta_table4(ours: pd.DataFrame) -> pd.DataFrame:
    """Our Table IV cells (columns probes, statistic, distance, mean, std, seeds) beside the paper's accuracy, and
    each cell's rank within its table (1 = best), ours and the paper's."""
    paper = paper_table("fedctta_table4").rename(columns={"accuracy": "paper"})
    out = ours.merge(paper, on=["probes", "statistic", "distance"], how="left")
    out["rank_ours"] = out["mean"].rank(ascending=False, method="min").astype(int)
    out["rank_paper"] = out["paper"].rank(ascending=False, method="min").astype("Int64")
    return out
