"""Class imbalance (pFedBBN): the Table 1 grid over Dirichlet label skew, class-wise and major/minor-class accuracy,
read from stored run summaries (``class_counts`` / ``class_correct`` [N][K], ``accuracy_by_domain``) only."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ftta_core import stats, style
from ftta_core.experiment import ALL_CORRUPTIONS, ExperimentConfig, build_scenario
from studies.paper import paper_table
from ftta_core.workbook import same_domain_weight  # noqa: F401  (notebook 30 reads it from here)

TABLE1_METHODS = ("tent", "cotta", "roid", "rotta", "bbn")
TABLE1_STRATEGIES = ("local", "fedavg", "fedprox", "fedavgm", "pfedgraph", "fedamp")
FULL_METHOD = ("bbn", "pfedbbn")  # pFedBBN = BBN clients + the pFedBBN server
TABLE1_ALPHAS: Tuple[Optional[float], ...] = (None, 0.1, 0.01, 0.001)
# ASSUMED alpha of the paper's Non-IID columns 2, 3, 4 (left to right): the values were lost in extraction
# (data/paper_numbers/pfedbbn_table1.csv keeps the column position only)
PAPER_NONIID_ALPHAS: Tuple[float, ...] = (0.1, 0.01, 0.001)
STRATEGY_LABELS = {"local": "None-Fed", "fedavg": "FedAvg", "fedprox": "FedProx", "fedavgm": "FedAvgM",
                   "pfedgraph": "pFedGraph", "fedamp": "FedAMP", "pfedbbn": "pFedBBN"}
METHOD_LABELS = {"source": "Source", "bn": "BN", "tent": "Tent", "eata": "EATA", "cotta": "CoTTA", "roid": "ROID",
                 "rotta": "RoTTA", "bbn": "BBN"}
SOURCE_ROW = ("Any", "Source")


def setting_label(alpha: Optional[float]) -> str:
    """'IID' for no label skew, else 'alpha=<value>'."""
    return "IID" if alpha is None else f"alpha={alpha:g}"


def local_settings(method: str, model_name: str) -> Dict[str, Any]:
    """The benchmark's settings of a local method (``centralized.REFERENCE_PARAMS``), without the seed: the run's
    seed reaches the method through the config, so one variant serves every seed."""
    from studies.centralized import method_params

    params = method_params(method, model_name, seed=0)
    params.pop("seed", None)
    return params


def pfedbbn_config(dataset: str = "cifar10", clients: int = 10, batch_size: int = 200, images_per_client: int = 1000,
                   corruptions: Sequence[str] | str = ALL_CORRUPTIONS, severity: int = 5,
                   scenario: str = "fedtsa_niid", device: str = "auto", **fields: Any) -> ExperimentConfig:
    """pFedBBN's protocol: 10 clients, batch 200, the corruptions at severity 5 in FedTSA's 4-area map (clients in
    4 groups on different corruptions at a time), 1,000 images per client and corruption (75 rounds of 5 per
    corruption, the rounds of the paper's Tables 4-5); method, strategy and ``label_alpha`` come per variant."""
    return ExperimentConfig(dataset=dataset, scenario=scenario, clients=clients, batch_size=batch_size,
                            images_per_client=images_per_client, corruptions=corruptions, severity=severity,
                            device=device, **fields)


def table1_variants(base: ExperimentConfig, methods: Sequence[str] = TABLE1_METHODS,
                    strategies: Sequence[str] = TABLE1_STRATEGIES,
                    alphas: Sequence[Optional[float]] = TABLE1_ALPHAS,
                    full_method: bool = True) -> Dict[str, Dict[str, Any]]:
    """The Table 1 grid as ``run_grid`` variants: every method x strategy (+ BBN x pFedBBN) x alpha."""
    pairs = [(m, s) for m in methods for s in strategies]
    if full_method and FULL_METHOD not in pairs:
        pairs.append(FULL_METHOD)
    return {f"{m}+{s} {setting_label(a)}": {"local": m, "local_params": local_settings(m, base.model_name),
                                             "strategy": s, "strategy_params": {}, "label_alpha": a}
            for a in alphas for m, s in pairs}


def variant_cells(variants: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Method, strategy, alpha and setting of each variant (index: variant name)."""
    rows = {name: {"method": v["local"], "strategy": v["strategy"], "alpha": v.get("label_alpha"),
                   "setting": setting_label(v.get("label_alpha"))} for name, v in variants.items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def class_arrays(summary: Mapping[str, Any]) -> Tuple[np.ndarray, np.ndarray]:
    """(counts, correct) [N, K] of a run summary's mixed predictions per client and true class."""
    if "class_counts" not in summary:
        raise KeyError("summary has no class_counts: it was written before per-class recording (rerun it)")
    return np.asarray(summary["class_counts"], dtype=np.int64), np.asarray(summary["class_correct"], dtype=np.int64)


def macro_class_accuracy(counts: np.ndarray, correct: np.ndarray) -> float:
    """Mean over the classes with samples of the per-class accuracy (%) pooled over clients ([N, K] or [K])."""
    n, c = np.atleast_2d(counts).sum(0), np.atleast_2d(correct).sum(0)
    seen = n > 0
    return float(np.mean(100 * c[seen] / n[seen])) if seen.any() else float("nan")


def run_rows(summaries: Mapping[tuple, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per stored run ({(variant, seed): summary}, e.g. ``workbook.stored_summaries``)."""
    rows = []
    for (name, seed), s in summaries.items():
        c = s["config"]
        macro = macro_class_accuracy(*class_arrays(s)) if "class_counts" in s else float("nan")
        rows.append({"variant": name, "seed": seed, "method": c["local"], "strategy": c["strategy"],
                     "alpha": c.get("label_alpha"), "setting": setting_label(c.get("label_alpha")),
                     "accuracy": s["accuracy"], "accuracy_local": s["accuracy_local"],
                     "accuracy_source": s["accuracy_source"], "class_macro": macro})
    columns = ["variant", "seed", "method", "strategy", "alpha", "setting", "accuracy", "accuracy_local",
               "accuracy_source", "class_macro"]
    return pd.DataFrame(rows, columns=columns)


def missing_runs(rows: pd.DataFrame, variants: Mapping[str, Any], seeds: Sequence[int]) -> pd.DataFrame:
    """Which variants lack which seeds among ``rows`` (from ``run_rows``)."""
    have = set(zip(rows["variant"], rows["seed"]))
    out = [{"variant": v, "missing_seeds": " ".join(str(s) for s in seeds if (v, s) not in have)}
           for v in variants if any((v, s) not in have for s in seeds)]
    return pd.DataFrame(out, columns=["variant", "missing_seeds"])


def paper_column(alpha: Optional[float]) -> Optional[int]:
    """The column of the paper's Table 1 for ``alpha`` (1 = IID; 2-4 under the assumed ``PAPER_NONIID_ALPHAS``)."""
    if alpha is None:
        return 1
    matches = [i for i, a in enumerate(PAPER_NONIID_ALPHAS) if np.isclose(a, alpha)]
    return matches[0] + 2 if matches else None


def _paper_value(paper: pd.DataFrame, strategy: str, method: str, alpha: Optional[float]) -> float:
    col = paper_column(alpha)
    hit = paper[(paper.strategy == strategy) & (paper.method == method) & (paper.column == col)]
    return float(hit.accuracy.iloc[0]) if len(hit) else float("nan")


def beside_paper_table1(rows: pd.DataFrame, variants: Mapping[str, Mapping[str, Any]],
                        dataset: str = "cifar10") -> pd.DataFrame:
    """Table 1 long form: per (strategy, method, setting) ours (mean, std, seeds; NaN and 0 seeds where no run is
    stored) beside the paper's number; a Source row per setting (ours: the source model on the same stream)."""
    paper = paper_table("pfedbbn_table1")
    paper = paper[paper.dataset == dataset]
    cells = variant_cells(variants)
    out = []
    for (setting, alpha), _ in cells.groupby(["setting", cells["alpha"].fillna(-1.0)], sort=False):
        alpha = None if alpha == -1.0 else float(alpha)
        here = rows[rows.setting == setting]
        source = here.groupby("seed")["accuracy_source"].first()
        entries = [(SOURCE_ROW, source)]
        for m, s in cells[cells.setting == setting][["method", "strategy"]].itertuples(index=False):
            values = here[(here.method == m) & (here.strategy == s)]["accuracy"]
            entries.append(((STRATEGY_LABELS.get(s, s), METHOD_LABELS.get(m, m)), values))
        for (strategy, method), values in entries:
            out.append({"strategy": strategy, "method": method, "setting": setting, "ours": values.mean(),
                        "std": values.std(ddof=1) if len(values) > 1 else 0.0 if len(values) else float("nan"),
                        "seeds": len(values), "paper": _paper_value(paper, strategy, method, alpha)})
    table = pd.DataFrame(out, columns=["strategy", "method", "setting", "ours", "std", "seeds", "paper"])
    table["ours - paper"] = table["ours"] - table["paper"]
    return table


def table1_wide(long: pd.DataFrame) -> pd.DataFrame:
    """``beside_paper_table1`` as the paper's layout: rows (strategy, method), columns (setting, ours | paper)."""
    wide = long.pivot_table(index=["strategy", "method"], columns="setting", values=["ours", "paper"], sort=False,
                            dropna=False)
    order = list(dict.fromkeys(zip(long.strategy, long.method)))
    settings = list(dict.fromkeys(long.setting))
    wide = wide.swaplevel(0, 1, axis=1)
    return wide.reindex(index=pd.MultiIndex.from_tuples(order, names=["strategy", "method"]),
                        columns=pd.MultiIndex.from_product([settings, ["ours", "paper"]]))


def class_accuracy_table(groups: Mapping[str, Sequence[Mapping[str, Any]]]) -> pd.DataFrame:
    """Per-class accuracy (%) of the mixed predictions, pooled over clients and the runs of each group (rows).

    Columns: one per class (NaN: no sample of that class), ``macro`` (mean over classes with samples),
    ``avg (absent=0)`` (mean over all classes counting absent ones as 0: the paper's Table 3 'Avg'), ``overall``
    (all predictions) and ``absent`` (classes without samples)."""
    rows = {}
    for label, summaries in groups.items():
        if not summaries:
            continue
        counts = sum(class_arrays(s)[0].sum(0) for s in summaries)
        correct = sum(class_arrays(s)[1].sum(0) for s in summaries)
        with np.errstate(invalid="ignore", divide="ignore"):
            acc = np.where(counts > 0, 100 * correct / np.maximum(counts, 1), np.nan)
        row = {f"C{k}": acc[k] for k in range(len(acc))}
        row.update({"macro": float(np.nanmean(acc)) if (counts > 0).any() else float("nan"),
                    "avg (absent=0)": float(np.nan_to_num(acc).mean()),
                    "overall": float(100 * correct.sum() / counts.sum()),
                    "absent": " ".join(f"C{k}" for k in np.flatnonzero(counts == 0)) or "-"})
        rows[label] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def paper_class_table(dataset: str = "cifar10") -> pd.DataFrame:
    """The paper's Table 3 (alpha = 0.01) as rows (method, strategy) x columns C0..C9, Avg."""
    t = paper_table("pfedbbn_table3")
    t = t[t.dataset == dataset].assign(column=lambda d: ["Avg" if c == "avg" else f"C{c}" for c in d["class"]])
    wide = t.pivot_table(index=["method", "strategy"], columns="column", values="accuracy", sort=False)
    return wide[[c for c in wide.columns if c != "Avg"] + ["Avg"]]


def class_distribution(summary: Mapping[str, Any]) -> pd.DataFrame:
    """Samples per client (rows) and true class (columns C0..): the label skew the run saw."""
    counts, _ = class_arrays(summary)
    return pd.DataFrame(counts, columns=[f"C{k}" for k in range(counts.shape[1])]).rename_axis("client")


def major_minor_table(summary: Mapping[str, Any]) -> pd.DataFrame:
    """Per client: its major class (most samples) and minor class (fewest samples among the classes it has; ties go
    to the lower class id), their sample counts and accuracies (%), and the client's accuracy (pFedBBN Fig 4)."""
    counts, correct = class_arrays(summary)
    rows = []
    for i, (n, c) in enumerate(zip(counts, correct)):
        major = int(np.argmax(n))
        present = np.flatnonzero(n > 0)
        minor = int(present[np.argmin(n[present])])
        rows.append({"client": i, "major": major, "n_major": int(n[major]), "acc_major": 100 * c[major] / n[major],
                     "minor": minor, "n_minor": int(n[minor]), "acc_minor": 100 * c[minor] / n[minor],
                     "classes_seen": len(present), "accuracy": 100 * c.sum() / n.sum()})
    return pd.DataFrame(rows).set_index("client")


def major_minor_plot(table: pd.DataFrame, ax: Optional[plt.Axes] = None, title: str = "") -> plt.Axes:
    """Grouped bars per client: accuracy on its major and on its minor class (from ``major_minor_table``)."""
    ax = ax or plt.gca()
    x = np.arange(len(table))
    ax.bar(x - 0.2, table["acc_major"], 0.4, label="major class")
    ax.bar(x + 0.2, table["acc_minor"], 0.4, label="minor class")
    ax.set_xticks(x, [f"{i}\n(C{a}/C{b})" for i, a, b in zip(table.index, table["major"], table["minor"])], fontsize=8)
    ax.set(xlabel="client (major / minor class)", ylabel="accuracy (%)", ylim=(0, 105), title=title)
    style.legend_outside(ax)
    return ax


def per_domain_plot(table: pd.DataFrame, ax: Optional[plt.Axes] = None, title: str = "") -> plt.Axes:
    """Bars of accuracy (%) per domain (x) and row of ``workbook.per_domain_table`` (hue) (pFedBBN Fig 3)."""
    ax = ax or plt.gca()
    domains = [c for c in table.columns if c not in ("mean", "seeds")]
    table[domains].T.plot.bar(ax=ax, width=0.8)
    ax.set(xlabel="corruption", ylabel="accuracy (%)", ylim=(0, 100), title=title)
    ax.tick_params(axis="x", labelrotation=45)
    plt.setp(ax.get_xticklabels(), ha="right", rotation_mode="anchor")
    style.legend_outside(ax, title="server")
    return ax


def stored_runs(base: ExperimentConfig, strategies: Sequence[str], out_dir: Path | str, compute: bool,
                progress: bool = False) -> Optional[Dict[str, Any]]:
    """``workbook.run_stored`` (W kept); with ``compute=False`` only when every strategy is already stored with
    this config, else None (nothing runs)."""
    from ftta_core.runstore import read_summary, usable
    from ftta_core.workbook import run_stored

    if not compute:
        for s in strategies:
            path = Path(out_dir) / s / "summary.json"
            want = dataclasses.replace(base, strategy=s, strategy_params={}).to_dict()
            if usable(path) is None or read_summary(path)["config"] != want:
                return None
    return run_stored(base, strategies, Path(out_dir), progress=progress)


def group_summaries(summaries: Mapping[tuple, Mapping[str, Any]], cells: pd.DataFrame,
                    setting: str) -> Dict[str, List[Mapping[str, Any]]]:
    """The summaries of one setting grouped by 'Method / Strategy' label (for ``class_accuracy_table``)."""
    out: Dict[str, List[Mapping[str, Any]]] = {}
    for (name, _seed), s in summaries.items():
        if name in cells.index and cells.at[name, "setting"] == setting and "class_counts" in s:
            m, st = cells.at[name, "method"], cells.at[name, "strategy"]
            out.setdefault(f"{METHOD_LABELS.get(m, m)} / {STRATEGY_LABELS.get(st, st)}", []).append(s)
    return out


def _cell(table: pd.DataFrame, strategy: str, method: str, setting: str, column: str = "ours") -> float:
    hit = table[(table.strategy == strategy) & (table.method == method) & (table.setting == setting)]
    return float(hit[column].iloc[0]) if len(hit) else float("nan")


def _pair(table: pd.DataFrame, strategy: str, method: str, setting: str) -> str:
    ours, paper = (_cell(table, strategy, method, setting, c) for c in ("ours", "paper"))
    return f"{ours:.2f}" + ("" if np.isnan(paper) else f" (paper {paper:.2f})")


# the paper's claim: each of these (strategy, method) runs beats each of the next (``run_rows`` names)
BBN_ROWS, TENT_ROWS = (("local", "bbn"), ("pfedbbn", "bbn")), (("local", "tent"), ("fedavg", "tent"))


def claim_comparisons(runs: pd.DataFrame, setting: str) -> pd.Series:
    """``stats.comparison`` of each BBN row against each Tent row (``BBN_ROWS`` x ``TENT_ROWS``) in ``setting``,
    paired by seed (``runs``: ``run_rows``), with the fewest paired seeds among them as ``attrs['seeds']``."""
    def acc(strategy: str, method: str) -> pd.Series:
        r = runs[(runs.strategy == strategy) & (runs.method == method) & (runs.setting == setting)]
        return r.groupby("seed")["accuracy"].mean()

    ests = {(b, t): stats.paired(acc(*b), acc(*t)) for b in BBN_ROWS for t in TENT_ROWS}
    out = pd.Series({k: stats.comparison(e) for k, e in ests.items()})
    out.attrs["seeds"] = min(e.n for e in ests.values())
    return out


def claim_word(comparisons: pd.Series) -> str:
    """Whether BBN/pFedBBN beat Tent/Tent + FedAvg: 'yes' when every comparison of ``claim_comparisons`` is ahead,
    'no' when one is behind, equal within the margin or identical, else 'undetermined'."""
    if (comparisons == "ahead").all():
        return "yes"
    if comparisons.isin(["behind", "equal within the margin", "identical"]).any():
        return "no"
    return "undetermined"


def imbalance_reading(table: pd.DataFrame, runs: pd.DataFrame) -> str:
    """The notebook's reading of Table 1, computed from ``beside_paper_table1``'s long table and the runs behind it
    (``run_rows``): per label-skew setting, whether BBN and pFedBBN beat Tent and Tent + FedAvg (the paper's claim:
    each BBN row against each Tent row paired by seed, ``claim_comparisons``), where BBN's best server is, and which
    servers fall far below local adaptation. Settings with no stored BBN / Tent runs are skipped."""
    out: List[str] = []
    settings = list(dict.fromkeys(table.setting))
    for setting in settings:
        tent_local, tent_avg = _cell(table, "None-Fed", "Tent", setting), _cell(table, "FedAvg", "Tent", setting)
        bbn_local, pfedbbn = _cell(table, "None-Fed", "BBN", setting), _cell(table, "pFedBBN", "BBN", setting)
        if np.isnan([tent_local, tent_avg, bbn_local, pfedbbn]).any():
            continue
        source = _cell(table, *SOURCE_ROW, setting)
        bbn = table[(table.method == "BBN") & (table.setting == setting)].dropna(subset=["ours"])
        best = bbn.loc[bbn.ours.idxmax()]
        paper_best = bbn.dropna(subset=["paper"])
        paper_best = paper_best.loc[paper_best.paper.idxmax()] if len(paper_best) else None
        margin = min(bbn_local, pfedbbn) - max(tent_local, tent_avg)
        said = claim_comparisons(runs, setting)
        counts = said.value_counts()
        text = (f"**{setting}**: Tent {_pair(table, 'None-Fed', 'Tent', setting)}, Tent + FedAvg "
                f"{_pair(table, 'FedAvg', 'Tent', setting)}; BBN {_pair(table, 'None-Fed', 'BBN', setting)}, "
                f"BBN + pFedBBN {_pair(table, 'pFedBBN', 'BBN', setting)}; the source model {source:.2f} (BBN "
                f"{bbn_local - source:+.2f} from it). "
                f"BBN/pFedBBN beats Tent/Tent + FedAvg here: {claim_word(said)} ({margin:+.2f} points, the worse "
                f"of the two BBN rows' means against the better Tent row's; paired by seed, the four BBN-Tent "
                f"comparisons: "
                + ", ".join(f"{counts[c]} {c}" for c in counts.index)
                + f", over {said.attrs['seeds']} paired seed(s)). "
                f"BBN's best server is {best.strategy} ({best.ours:.2f})"
                + (f"; the paper's is {paper_best.strategy} ({paper_best.paper:.2f})" if paper_best is not None else "")
                + f"; pFedBBN is {pfedbbn - best.ours:+.2f} from it.")
        collapsed = table[(table.setting == setting) & (table.strategy != "None-Fed")
                          & table.method.isin(["RoTTA", "BBN"])]
        low = [f"{r.strategy} with {r.method} ({r.ours:.2f})" for r in collapsed.itertuples()
               if r.ours < _cell(table, "None-Fed", r.method, setting) - 10]
        if low:
            text += " More than 10 points below local adaptation: " + ", ".join(low) + "."
        out.append("- " + text)
    return "\n".join(out) if out else "No setting has stored Tent and BBN runs to compare."
