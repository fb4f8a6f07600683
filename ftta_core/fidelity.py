"""Which of the papers' claims about their clients hold in our stored runs (issue "Fidelity I"), computed.

Every row of ``claims_table`` is one claim of FedTSA's Table 1 or FedCTTA's Table I, the paper's number for it, ours
from the runs stored under ``figures/fedtsa_table1/runs`` (paired by seed), the verdict with a tie band of ``tie``
points, and the runs that settle it (cell, setting, strategy variant, seeds). A claim without stored runs says so;
nothing here runs anything. The pFedBBN claims come from ``ftta_core.temperature`` (its own runs).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from .fedtsa.table1 import GRAD_CELLS, stored_table1_runs
from .paper import METHOD_LABELS, TTA_SETTINGS, paper_table
from .plan import REPO_DIR

RESULTS_DIR = REPO_DIR / "figures" / "fedtsa_table1" / "runs"  # in the repository, whatever the working folder
SEEDS = (0, 1, 2, 3, 4)
# a strategy variant: (strategy, its parameters); "fedctta (eval)" is FedCTTA with the reference clients' probes
Variant = Tuple[str, Dict[str, Any]]
# "reference code": the reference code's whole probe handling, eval mode with each client's own fresh noise every
# step and an EMA of W (0.9); the paper states neither of the last two
FEDCTTA_VARIANTS: Dict[str, Variant] = {"FedCTTA (probe_bn=client)": ("fedctta", {}),
                                        "FedCTTA (probe_bn=eval)": ("fedctta", {"probe_bn": "eval"}),
                                        "FedCTTA (reference code)": ("fedctta", {"probe_bn": "eval",
                                                                                 "probes": "per_client", "ema": 0.9})}
# the reference clients' cell at the step size where their Local drifts below its TTA-bn Local without collapsing,
# as the paper's does (Adam 3e-4: figures/fedtsa_table1/tta_grad_step_size.md, 1e-5 to 1e-3); the claims are also
# read there, with every strategy of FedTSA's Table 1 (the "if a cell reproduces the paper's pattern")
DRIFT_STEP: Tuple[str, float] = ("grad-running-adam", 3e-4)
# FedTSA Table 1's strategies (FedCTTA is not in that table: its claims are FedCTTA Table I's, below)
TABLE1_STRATEGIES = tuple(s for s in METHOD_LABELS if s not in ("source", "local", "fedctta"))
# the (TTA-grad cell, setting, step size: None for the cell's own) each probe normalisation is read in: "eval"
# normalises with running statistics (the reference clients), which only the running-BN cells keep; Table I's IID
# column is read for the reference clients' handling only (the "with the authors' probe handling"), and the
# drift step for our default and the reference code's handling
_DRIFT = DRIFT_STEP[0]
FEDCTTA_GRAD_CELLS: Dict[str, Tuple[Tuple[str, str, Optional[float]], ...]] = {
    "FedCTTA (probe_bn=client)": (("grad", "niid", None), ("grad-running-adam", "niid", None),
                                  (_DRIFT, "niid", DRIFT_STEP[1]), (_DRIFT, "iid", DRIFT_STEP[1])),
    "FedCTTA (probe_bn=eval)": (("grad-running-adam", "niid", None), ("grad-running-adam", "iid", None)),
    "FedCTTA (reference code)": (("grad-running-adam", "niid", None), ("grad-running-adam", "iid", None),
                                 (_DRIFT, "niid", DRIFT_STEP[1]), (_DRIFT, "iid", DRIFT_STEP[1]))}
FEDAVGM_VARIANTS: Dict[str, Variant] = {"FedAvgM (momentum on all)": ("fedavgm", {}),
                                        "FedAvgM (momentum on params)": ("fedavgm", {"momentum_on": "params"})}


def accuracies(results_dir: Path | str, tta: str, setting: str, variant: Variant, seeds: Sequence[int] = SEEDS,
               column: str = "accuracy", dataset: str = "cifar10", lr: Optional[float] = None) -> pd.Series:
    """``column`` of the stored Table 1 runs of one strategy variant in one column (tta, setting), by seed; the
    seeds whose run was made by code that has changed since are in ``.attrs["stale"]``. ``lr``: a TTA-grad cell's
    runs at this step size instead of its own (``fedtsa-table --lr``)."""
    strategy, params = variant
    grid = stored_table1_runs(results_dir, [strategy], list(seeds), dataset, (tta,), (setting,), params, lr=lr)
    out = grid.set_index("seed")[column] if len(grid) else pd.Series(dtype=float)
    out.attrs["stale"] = sorted(grid.loc[grid["code"] == "stale", "seed"]) if len(grid) else []
    return out


def paired(a: pd.Series, b: pd.Series) -> Tuple[float, float, List[int]]:
    """Mean and standard deviation (NaN below 2) of ``a - b`` over the seeds both have a value for (a run stored
    without the measure, NaN, does not count), and those seeds."""
    both = sorted(a.dropna().index.intersection(b.dropna().index))
    d = a[both] - b[both]
    return (float(d.mean()) if both else float("nan"), float(d.std(ddof=1)) if len(both) > 1 else float("nan"),
            list(both))


def stale_used(seeds: Sequence[int], *series: pd.Series) -> int:
    """How many of the runs behind ``series`` (``accuracies`` results) at ``seeds`` are stale."""
    return sum(len(set(s.attrs.get("stale", [])) & set(seeds)) for s in series)


# a difference on the paper's side of 0 but more than this many times the paper's, or under this fraction of it, has
# the paper's direction and not its size (e.g. FedAvgM 38 points below FedAvg where the paper has 2): 'direction only'
MAGNITUDE_FACTOR = 3.0


def verdict(ours: float, paper: float, tie: float, factor: Optional[float] = MAGNITUDE_FACTOR) -> str:
    """'holds' when ours is within ``tie`` of the paper's value, or falls on the paper's side of 0 by more than
    ``tie`` (within ``tie`` when the paper's is) and within a factor ``factor`` of it; 'direction only' when the side
    is the paper's and the size is not; 'does not hold' otherwise; 'no run' when ours is NaN. Within ``tie`` of the
    paper's value holds whichever side of the band each falls (+0.53 against +0.47 with ``tie`` 0.5).
    ``factor`` None: the side alone (a claim without a number, e.g. "W clusters by domain")."""
    if np.isnan(ours):
        return "no run"
    if factor is not None and abs(ours - paper) <= tie:
        return "holds"
    side = lambda x: 0 if abs(x) <= tie else (1 if x > 0 else -1)  # noqa: E731
    if side(ours) != side(paper):
        return "does not hold"
    if factor is None or side(paper) == 0 or 1 / factor <= ours / paper <= factor:
        return "holds"
    return "direction only"


def _paper(table: str, dataset: str = "cifar10") -> pd.Series:
    p = paper_table(table)
    return p[p.dataset == dataset].set_index(["method", "setting", "tta"])["mean"]


def _grad_difference(paper: pd.Series, method: str, against: str, setting: str) -> float:
    """The paper's ``method`` - ``against`` under TTA-grad in ``setting`` (labels of ``_paper``'s table)."""
    return paper[(method, setting, "grad")] - paper[(against, setting, "grad")]


def _difference_row(a: pd.Series, b: pd.Series, theirs: float, tie: float) -> Dict[str, Any]:
    """``a`` - ``b`` paired by seed beside the paper's ``theirs``: the columns every difference table shares
    (``ours``, ``ours sd``, ``seeds``, ``paper``, ``verdict``, ``stale runs``)."""
    mean, sd, seeds = paired(a, b)
    return {"ours": mean, "ours sd": sd, "seeds": len(seeds), "paper": theirs, "verdict": verdict(mean, theirs, tie),
            "stale runs": stale_used(seeds, a, b)}


def _row(claim: str, source: str, paper: float, ours: Tuple[float, float, List[int]], tie: float,
         settled_by: str, *runs: pd.Series) -> Dict[str, Any]:
    """One claim row; ``runs``: the ``accuracies`` series compared, whose stale runs at the paired seeds are
    counted (``stale runs``) and named in ``settled by``."""
    mean, sd, seeds = ours
    stale = stale_used(seeds, *runs)
    return {"claim": claim, "source": source, "paper": paper, "ours": mean, "ours sd": sd, "seeds": len(seeds),
            "verdict": verdict(mean, paper, tie), "stale runs": stale,
            "settled by": settled_by + (f", seeds {seeds}" if seeds else "")
            + (f" ({stale} run(s) made by code that has changed since)" if stale else "")}


def _cell_label(cell: str, lr: Optional[float] = None) -> str:
    """A TTA-grad cell's name with its BN statistics and optimiser (at ``lr`` when given, else the cell's own)."""
    params = TTA_SETTINGS[cell]["local_params"]
    return f"{cell} (BN {params.get('bn', 'batch')}, {params['optimizer']} {params['lr'] if lr is None else lr:g})"


def _best_of(parts: Sequence[pd.Series]) -> pd.Series:
    """Per seed, the best of several strategies' accuracies, at the seeds where every one of them has a run (a
    best over fewer would be a weaker rival)."""
    return pd.concat(parts, axis=1).dropna().max(axis=1)


def _grad_cell_claims(results_dir: Path | str, cell: str, lr: Optional[float], setting: str,
                      strategies: Sequence[str], tie: float, local_bn: pd.Series, best: bool) -> List[dict]:
    """The TTA-grad claims of FedTSA Table 1 in one (cell, step size, setting): Local(grad) - Local(bn), each of
    ``strategies`` - Local (FedAvg's also against FedCTTA's Table I) and, with ``best``, FedTSA - the best other
    strategy (the paper's "FedTSA best")."""
    paper, fedctta = _paper("fedtsa_table1"), _paper("fedctta_table1")
    local = accuracies(results_dir, cell, setting, ("local", {}), lr=lr)
    where = f"{_cell_label(cell, lr)}, {setting.upper()}"
    rows = [_row(f"Local(grad) below Local(bn), {setting.upper()}", "FedTSA Table 1",
                 paper[("Local", setting, "grad")] - paper[("Local", setting, "bn")], paired(local, local_bn), tie,
                 where, local, local_bn)]
    runs = {s: accuracies(results_dir, cell, setting, (s, {}), lr=lr) for s in strategies}
    for s, theirs in runs.items():
        label = METHOD_LABELS[s]
        ours = paired(theirs, local)
        rows.append({**_row(f"{label} above Local under TTA-grad, {setting.upper()}", "FedTSA Table 1",
                            _grad_difference(paper, label, "Local", setting), ours, tie, where,
                            theirs, local), "method": label, "setting": setting})
        if s == "fedavg":
            rows.append(_row(f"FedAvg - Local under TTA-grad, {setting.upper()}", "FedCTTA Table I",
                             _grad_difference(fedctta, label, "Local", setting), ours,
                             tie, where, theirs, local))
    if best:
        others = [s for s in strategies if s != "fedtsa"]
        rival = _best_of([runs[s] for s in others])
        theirs = max(paper[(METHOD_LABELS[s], setting, "grad")] for s in others)
        rows.append(_row(f"FedTSA best under TTA-grad, {setting.upper()} (minus the best other strategy)",
                         "FedTSA Table 1", paper[("FedTSA", setting, "grad")] - theirs,
                         paired(runs["fedtsa"], rival), tie, where, runs["fedtsa"], *runs.values()))
    return rows


def strategy_gains(results_dir: Path | str = RESULTS_DIR, tie: float = 0.5, step: Tuple[str, float] = DRIFT_STEP,
                   settings: Sequence[str] = ("niid", "iid")) -> pd.DataFrame:
    """Table 1's TTA-grad rows as gains over Local in one (cell, step size): per (setting, strategy of
    ``TABLE1_STRATEGIES``) our gain paired by seed (``ours``, ``ours sd``, ``seeds``), the paper's (FedTSA Table 1) and
    the verdict (``tie``); the rows of ``tta_grad_claims`` for that step."""
    cell, lr = step
    rows = [r for setting in settings
            for r in _grad_cell_claims(results_dir, cell, lr, setting, TABLE1_STRATEGIES, tie,
                                       accuracies(results_dir, "bn", setting, ("local", {})), False)
            if "method" in r]
    return pd.DataFrame(rows)[["setting", "method", "paper", "ours", "ours sd", "seeds", "verdict", "stale runs",
                               "settled by"]]


def strategy_gains_reading(table: pd.DataFrame, tie: float = 0.5) -> str:
    """``strategy_gains`` in sentences, per setting: how many strategies with runs gain more than ``tie`` over Local
    (and how many of the same strategies do in the paper), how alike the two rank them (Spearman, from three
    strategies on), and the best strategy in each."""
    parts = []
    for setting, g in table.groupby("setting", sort=False):
        ran = g.dropna(subset=["ours"])
        if ran.empty:
            parts.append(f"{setting.upper()}: no strategy has a run paired with Local yet.")
            continue
        seeds = sorted(set(ran["seeds"]))
        text = (f"{setting.upper()} ({len(ran)} of {len(g)} strategies with runs, "
                f"{seeds[0] if len(seeds) == 1 else f'{seeds[0]}-{seeds[-1]}'} seed(s) each): "
                f"{int((ran['ours'] > tie).sum())} gain more than {tie:g} points over Local (the paper: "
                f"{int((ran['paper'] > tie).sum())} of the same); the verdict holds for "
                f"{int((ran['verdict'] == 'holds').sum())} of {len(ran)}")
        for name, said in (("direction only", f"in direction only (size off by more than {MAGNITUDE_FACTOR:g}x)"),
                           ("does not hold", "does not hold")):
            differ = ran[ran["verdict"] == name]
            if len(differ):
                text += f", {said} for " + ", ".join(f"{r['method']} {r['ours']:+.2f} vs {r['paper']:+.2f}"
                                                     for r in differ.to_dict("records"))
        best, paper_best = ran.loc[ran["ours"].idxmax()], ran.loc[ran["paper"].idxmax()]
        text += (f"; best over Local: ours {best['method']} ({best['ours']:+.2f}), the paper's among the same "
                 f"strategies {paper_best['method']} ({paper_best['paper']:+.2f})"
                 + (" (our gains are means over different numbers of seeds)" if len(seeds) > 1 else ""))
        if len(ran) >= 3:
            text += f"; rank correlation with the paper's gains {ran['ours'].corr(ran['paper'], method='spearman'):.2f}"
        parts.append(text + ".")
    return " ".join(parts)


def difference_by_step(results_dir: Path | str = RESULTS_DIR, strategy: str = "fedavg_ft", against: str = "fedavg",
                       steps: Sequence[Tuple[str, Optional[float]]] = (("grad", None), (DRIFT_STEP[0], None),
                                                                       DRIFT_STEP),
                       settings: Sequence[str] = ("niid", "iid"), tie: float = 0.5,
                       params: Optional[Mapping[str, Any]] = None) -> pd.DataFrame:
    """``strategy`` - ``against`` in each (TTA-grad cell, step size: None for the cell's own) of ``steps``, paired
    by seed, beside the paper's difference of the two (FedTSA Table 1, TTA-grad) with the verdict (``tie``): what a
    strategy adds to another (e.g. FedAvg+FT's fine-tuning step after mixing) as the clients' steps grow.
    ``params``: ``strategy``'s runs with these parameters (e.g. FedAvgM's ``{"momentum_on": "params"}``)."""
    paper = _paper("fedtsa_table1")
    a_label, b_label = METHOD_LABELS[strategy], METHOD_LABELS[against]
    named = a_label + (" (" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "")
    rows = []
    for setting in settings:
        theirs = _grad_difference(paper, a_label, b_label, setting)
        for cell, lr in steps:
            a = accuracies(results_dir, cell, setting, (strategy, dict(params or {})), lr=lr)
            b = accuracies(results_dir, cell, setting, (against, {}), lr=lr)
            rows.append({"setting": setting, "cell": _cell_label(cell, lr), "difference": f"{named} - {b_label}",
                         **_difference_row(a, b, theirs, tie)})
    return pd.DataFrame(rows)


def difference_by_step_reading(table: pd.DataFrame) -> str:
    """``difference_by_step`` (one or several, concatenated) in one sentence per (setting, difference): ours at each
    cell and step size with runs, beside the paper's."""
    parts = []
    for (setting, difference), g in table.groupby(["setting", "difference"], sort=False):
        ran = g[g.seeds > 0]
        said = ", ".join(f"{r['ours']:+.2f} in {r['cell']} ({r['seeds']} seed(s))" for r in ran.to_dict("records"))
        parts.append(f"{setting.upper()}: {difference} " + (said or "not run yet")
                     + f"; the paper {g['paper'].iloc[0]:+.2f}.")
    return " ".join(parts)


def tta_grad_claims(results_dir: Path | str = RESULTS_DIR, tie: float = 0.5,
                    cells: Sequence[str] = GRAD_CELLS, settings: Sequence[str] = ("niid", "iid"),
                    drift: Sequence[Tuple[str, float]] = (DRIFT_STEP,)) -> List[dict]:
    """FedTSA Table 1 under TTA-grad, per 2x2 cell: Local(grad) - Local(bn), FedAvg - Local, FedTSA - Local (and
    FedAvg - Local against FedCTTA's Table I, whose TTA-grad numbers come from the reference clients' code); then in
    each ``drift`` (cell, step size) the same for every strategy of Table 1 (``TABLE1_STRATEGIES``) and FedTSA
    against the best of them."""
    rows = []
    for setting in settings:
        local_bn = accuracies(results_dir, "bn", setting, ("local", {}))
        for cell in cells:
            rows += _grad_cell_claims(results_dir, cell, None, setting, ("fedavg", "fedtsa"), tie, local_bn, False)
        for cell, lr in drift:
            rows += _grad_cell_claims(results_dir, cell, lr, setting, TABLE1_STRATEGIES, tie, local_bn, True)
    return rows


def fedctta_claims(results_dir: Path | str = RESULTS_DIR, tie: float = 0.5,
                   others: Sequence[str] = ("local", "fedavg", "fedavgm", "fedtsa")) -> List[dict]:
    """FedCTTA Table I: best under NIID TTA-bn (against the best of ``others`` per seed), not below FedAvg under IID
    TTA-bn, above Local under TTA-grad (in the cells, settings and step sizes ``FEDCTTA_GRAD_CELLS`` names: the batch-BN SGD cell, the
    reference code's running-BN Adam cell, and that cell at ``DRIFT_STEP``); for each probe normalisation stored."""
    paper = _paper("fedctta_table1")
    best_other_paper = max(paper[(METHOD_LABELS[s], "niid", "bn")] for s in others)
    rows = []
    for label, variant in FEDCTTA_VARIANTS.items():
        ours = accuracies(results_dir, "bn", "niid", variant)
        parts = [accuracies(results_dir, "bn", "niid", (s, {})) for s in others]
        best = _best_of(parts)
        rows.append(_row("FedCTTA best under TTA-bn, NIID (minus the best of Local/FedAvg/FedAvgM/FedTSA)",
                         "FedCTTA Table I", paper[("FedCTTA", "niid", "bn")] - best_other_paper,
                         paired(ours, best), tie, f"{label}, TTA-bn, NIID", ours, *parts))
        iid, fedavg = accuracies(results_dir, "bn", "iid", variant), accuracies(results_dir, "bn", "iid", ("fedavg", {}))
        rows.append(_row("FedCTTA not below FedAvg under TTA-bn, IID", "FedCTTA Table I",
                         paper[("FedCTTA", "iid", "bn")] - paper[("FedAvg", "iid", "bn")],
                         paired(iid, fedavg), tie, f"{label}, TTA-bn, IID", iid, fedavg))
        for cell, setting, lr in FEDCTTA_GRAD_CELLS[label]:
            grad, local = (accuracies(results_dir, cell, setting, variant, lr=lr),
                           accuracies(results_dir, cell, setting, ("local", {}), lr=lr))
            rows.append(_row(f"FedCTTA above Local under TTA-grad, {setting.upper()}", "FedCTTA Table I",
                             _grad_difference(paper, "FedCTTA", "Local", setting),
                             paired(grad, local), tie, f"{label}, {_cell_label(cell, lr)}, {setting.upper()}", grad,
                             local))
    return rows


def fedavgm_claims(results_dir: Path | str = RESULTS_DIR, tie: float = 0.5) -> List[dict]:
    """FedAvgM equal to FedAvg under TTA-bn (both papers' tables), for momentum on every shared tensor and on
    parameters only (under TTA-bn the shared tensors are BN statistics, so the latter is FedAvg by construction)."""
    paper = _paper("fedctta_table1")
    rows = []
    for setting in ("niid", "iid"):
        fedavg = accuracies(results_dir, "bn", setting, ("fedavg", {}))
        for label, variant in FEDAVGM_VARIANTS.items():
            ours = accuracies(results_dir, "bn", setting, variant)
            rows.append(_row(f"FedAvgM equal to FedAvg under TTA-bn, {setting.upper()}", "FedCTTA Table I",
                             paper[("FedAvgM", setting, "bn")] - paper[("FedAvg", setting, "bn")],
                             paired(ours, fedavg), tie, f"{label}, TTA-bn, {setting.upper()}", ours, fedavg))
    return rows


def claim_grids() -> List[Tuple[str, str, Optional[float], Dict[str, Dict[str, Any]]]]:
    """What ``fedctta_claims`` and ``fedavgm_claims`` read, with the TTA-grad cells' FedAvg that
    ``fedctta_probe_contrast(..., against="fedavg")`` pairs FedCTTA with: (tta, setting, step size or None for the
    cell's own, run_grid variants) with each variant as ``{"strategy": ..., "strategy_params": ...}``, for
    ``workbook.run_grid`` on ``table1_config(dataset, setting, tta, lr=step)`` (e.g. under ``FTTA_PLAN`` to plan the
    seeds a claim lacks). ``tta_grad_claims`` reads the 2x2 plan's runs
    (``figures/fedtsa_table1/tta_grad_2x2.plan.jsonl``) and, at ``DRIFT_STEP``, Table 1's
    (``figures/fedtsa_table1/step_size_table1.plan.jsonl``)."""
    def variants(*vs: Variant) -> Dict[str, Dict[str, Any]]:
        return {f"{s} {params}" if params else s: {"strategy": s, "strategy_params": dict(params)} for s, params in vs}

    fedctta = list(FEDCTTA_VARIANTS.values())
    grids = [("bn", "niid", None, variants(*fedctta, *[(s, {}) for s in ("local", "fedavg", "fedavgm", "fedtsa")],
                                           *FEDAVGM_VARIANTS.values())),
             ("bn", "iid", None, variants(*fedctta, ("fedavg", {}), *FEDAVGM_VARIANTS.values()))]
    places = {place for places in FEDCTTA_GRAD_CELLS.values() for place in places}
    for cell, setting, lr in sorted(places, key=lambda p: (p[0], p[1], p[2] or 0.0)):
        probes = [v for label, v in FEDCTTA_VARIANTS.items() if (cell, setting, lr) in FEDCTTA_GRAD_CELLS[label]]
        grids.append((cell, setting, lr, variants(("local", {}), ("fedavg", {}), *probes)))
    return grids


def claims_table(results_dir: Path | str = RESULTS_DIR, tie: float = 0.5,
                 extra: Optional[Sequence[Mapping[str, Any]]] = None) -> pd.DataFrame:
    """All client-fidelity claims with the paper's difference, ours (mean, sd, seeds), the verdict and the runs.
    ``extra``: more rows of the same shape (e.g. ``temperature.pfedbbn_claims``)."""
    rows = tta_grad_claims(results_dir, tie) + fedctta_claims(results_dir, tie) + fedavgm_claims(results_dir, tie)
    return pd.DataFrame(rows + list(extra or []))


def claims_reading(table: pd.DataFrame) -> str:
    """How many claims hold, do not hold, or lack runs, and which hold (computed from ``claims_table``)."""
    counts = table["verdict"].value_counts()
    held = table[table["verdict"] == "holds"]
    stale = int((table.get("stale runs", pd.Series(dtype=int)).fillna(0) > 0).sum())
    direction = table[table["verdict"] == "direction only"]
    said = lambda rows: "; ".join(f"{r['claim']} [{r['settled by']}] ({r['ours']:+.2f} vs paper {r['paper']:+.2f})"  # noqa: E731
                                  for r in rows.to_dict("records")) or "none"
    return (f"{counts.get('holds', 0)} claim(s) hold, {counts.get('direction only', 0)} hold in direction only (on "
            f"the paper's side of 0 but more than {MAGNITUDE_FACTOR:g}x or under 1/{MAGNITUDE_FACTOR:g} of its size), "
            f"{counts.get('does not hold', 0)} do not, {counts.get('no run', 0)} have no stored run. Holding: "
            + said(held) + "." + (f" In direction only: {said(direction)}." if len(direction) else "")
            + (f" {stale} row(s) rest on runs made by code that has changed since (`python -m ftta_core runs "
               f"figures --list stale` names them, `python -m ftta_core reproduce FILE` re-checks one)." if stale else ""))


__all__ = ["DRIFT_STEP", "TABLE1_STRATEGIES", "strategy_gains", "strategy_gains_reading", "difference_by_step",
           "difference_by_step_reading", "accuracies", "paired", "stale_used", "verdict", "MAGNITUDE_FACTOR", "tta_grad_claims", "fedctta_claims", "fedavgm_claims", "claims_table",
           "claims_reading", "claim_grids", "statistics_contrasts", "FEDCTTA_VARIANTS", "FEDAVGM_VARIANTS"]


# the 2x2's cells as (BN, optimiser): a contrast changes one factor and keeps the other
CELL_FACTORS: Dict[str, Tuple[str, str]] = {"grad": ("batch", "sgd"), "grad-adam": ("batch", "adam"),
                                            "grad-running": ("running", "sgd"),
                                            "grad-running-adam": ("running", "adam")}


def cell_contrasts(results_dir: Path | str = RESULTS_DIR, setting: str = "niid",
                   strategies: Sequence[str] = ("fedavg", "fedtsa")) -> pd.DataFrame:
    """Why a TTA-grad claim moves: for every pair of 2x2 cells that differ in one factor (BN statistics or the
    optimiser), how Local's accuracy and ``<strategy> - Local`` change, paired by seed (runs in both cells)."""
    local = {c: accuracies(results_dir, c, setting, ("local", {})) for c in CELL_FACTORS}
    gaps = {(c, s): accuracies(results_dir, c, setting, (s, {})) - local[c] for c in CELL_FACTORS for s in strategies}
    rows = []
    cells = list(CELL_FACTORS)
    for i, a in enumerate(cells):
        for b in cells[i + 1:]:
            fa, fb = CELL_FACTORS[a], CELL_FACTORS[b]
            changed = [k for k, (x, y) in enumerate(zip(fa, fb)) if x != y]
            if len(changed) != 1:
                continue
            factor = ("BN statistics", "optimiser")[changed[0]]
            keep = fa[1 - changed[0]]
            quantities = [("Local", local[b], local[a])] + [
                (f"{METHOD_LABELS[s]} - Local", gaps[(b, s)].dropna(), gaps[(a, s)].dropna()) for s in strategies]
            rows += _contrast_rows(quantities, factor=factor, source=f"{fa[changed[0]]} ({a})",
                                   target=f"{fb[changed[0]]} ({b})", kept=keep, setting=setting)
    return pd.DataFrame(rows)


def _contrast_rows(quantities, factor: str, source: str, target: str, kept: str, setting: str) -> List[dict]:
    """One contrast row per ``(quantity, after, before)``: the change paired by seed (``paired``)."""
    rows = []
    for what, after, before in quantities:
        mean, sd, seeds = paired(after, before)
        rows.append({"factor": factor, "from": source, "to": target, "kept": kept, "quantity": what, "change": mean,
                     "change sd": sd, "seeds": len(seeds), "setting": setting})
    return rows


def setting_contrasts(results_dir: Path | str = RESULTS_DIR,
                      strategies: Sequence[str] = ("fedavg", "fedtsa")) -> pd.DataFrame:
    """The other factor of a claim: per TTA-grad cell, how Local and ``<strategy> - Local`` change from the NIID to
    the IID protocol (which clients see which corruption), paired by seed; rows shaped like ``cell_contrasts``."""
    rows = []
    for cell, factors in CELL_FACTORS.items():
        local = {s: accuracies(results_dir, cell, s, ("local", {})) for s in ("niid", "iid")}
        quantities = [("Local", local["iid"], local["niid"])] + [
            (f"{METHOD_LABELS[s]} - Local", (accuracies(results_dir, cell, "iid", (s, {})) - local["iid"]).dropna(),
             (accuracies(results_dir, cell, "niid", (s, {})) - local["niid"]).dropna()) for s in strategies]
        rows += _contrast_rows(quantities, factor="clients' corruptions", source="NIID", target="IID",
                               kept=f"{cell} (BN {factors[0]}, {factors[1]})", setting="niid -> iid")
    return pd.DataFrame(rows)


def statistics_contrasts(results_dir: Path | str = RESULTS_DIR, settings: Sequence[str] = ("niid", "iid")) -> pd.DataFrame:
    """Within each running-statistics cell of the 2x2: how ``FedAvg - Local`` changes when the server stops averaging
    the clients' BN running statistics and averages their parameters only (``fedavg_localstats``, each client
    keeping its statistics), paired by seed; rows shaped like ``cell_contrasts``."""
    rows = []
    for cell, factors in CELL_FACTORS.items():
        if factors[0] != "running":
            continue
        for setting in settings:
            local = accuracies(results_dir, cell, setting, ("local", {}))
            after = (accuracies(results_dir, cell, setting, ("fedavg_localstats", {})) - local).dropna()
            before = (accuracies(results_dir, cell, setting, ("fedavg", {})) - local).dropna()
            rows += _contrast_rows([("FedAvg - Local", after, before)], factor="statistics mixed by the server",
                                   source="averaged (fedavg)", target="kept by each client (fedavg_localstats)",
                                   kept=f"{cell} (BN {factors[0]}, {factors[1]})", setting=setting)
    return pd.DataFrame(rows)


def fedctta_probe_contrast(results_dir: Path | str = RESULTS_DIR, settings: Sequence[str] = ("niid", "iid"),
                           seeds: Sequence[int] = SEEDS, tta: str = "bn", against: str = "fedavg",
                           lr: Optional[float] = None) -> pd.DataFrame:
    """In one column (``tta``: "bn" or a TTA-grad cell), each FedCTTA probe normalisation read there
    (``FEDCTTA_GRAD_CELLS`` for the TTA-grad cells and step sizes) against the strategy ``against``, paired by seed: the accuracy
    difference and W's mean shares (self, same domain, and the same-domain share uniform mixing gives) read from the
    stored runs; one row per (setting, probe normalisation). ``lr``: the TTA-grad cell at this step size (runs made
    with ``fedtsa-table --lr``) instead of its own."""
    from .fedtsa.table1 import stored_table1_runs

    rows = []
    for setting in settings:
        reference = accuracies(results_dir, tta, setting, (against, {}), seeds, lr=lr)
        for label in [k for k in FEDCTTA_VARIANTS if tta == "bn" or (tta, setting, lr) in FEDCTTA_GRAD_CELLS[k]]:
            strategy, params = FEDCTTA_VARIANTS[label]
            grid = stored_table1_runs(results_dir, [strategy], list(seeds), ttas=(tta,), settings=(setting,),
                                      strategy_params=params, extra_keys=("weight_shares",), lr=lr)
            ours = accuracies(results_dir, tta, setting, (strategy, params), seeds, lr=lr)
            mean, sd, both = paired(ours, reference)
            shares = pd.DataFrame(list(grid["weight_shares"].dropna())) if "weight_shares" in grid else pd.DataFrame()
            rows.append({"tta": tta, "setting": setting.upper(), "FedCTTA": label,
                         "against": METHOD_LABELS.get(against, against), "difference": mean, "sd": sd,
                         "seeds": len(both), "stale runs": stale_used(both, ours, reference),
                         **{f"W {k}": float(shares[k].mean()) if k in shares else float("nan")
                            for k in ("self", "same domain", "uniform same-domain")},
                         "runs with W's shares": len(shares)})
    return pd.DataFrame(rows)


def probe_contrast_reading(table: pd.DataFrame, n_clients: int = 20, tie: float = 0.5) -> str:
    """``fedctta_probe_contrast`` in sentences: each probe normalisation's gap to the reference strategy (``tie``
    points read as equal) and, where the runs kept W's shares, how far W is from uniform mixing (self-weight 1/N)."""
    lines = []
    for r in table.to_dict("records"):
        ref = r["against"]
        if not r["seeds"]:
            lines.append(f"- {r['FedCTTA']}, {r['setting']}: no run paired with {ref}.")
            continue
        gap = r["difference"]
        side = (f"equal to {ref} within the {tie} tie band" if abs(gap) <= tie
                else f"{'above' if gap > 0 else 'below'} {ref} beyond the {tie} tie band")
        text = (f"- {r['FedCTTA']}, {r['setting']}: {gap:+.2f} against {ref}"
                + (f" (sd {r['sd']:.2f})" if r["seeds"] > 1 else "") + f" over {r['seeds']} seed(s), {side}"
                + (f" ({r['stale runs']} run(s) made by code that has changed since)" if r["stale runs"] else ""))
        with_shares = r["runs with W's shares"]
        if with_shares:
            text += (f"; W keeps {r['W self']:.3f} on each client (uniform mixing: {1 / n_clients:.3f}) and gives "
                     f"{r['W same domain']:.3f} to the clients on its corruption (uniform: "
                     f"{r['W uniform same-domain']:.3f}; {with_shares} run(s))")
        lines.append(text + ".")
    return "\n".join(lines)


def contrasts_reading(contrasts: pd.DataFrame, tie: float = 0.5) -> str:
    """The contrasts that move a quantity by more than ``tie`` points, largest first (computed)."""
    moved = contrasts[contrasts["change"].abs() > tie].sort_values("change", key=abs, ascending=False)
    if moved.empty:
        return (f"No single factor moves Local or a strategy's gap over Local by more than {tie:g} points in the "
                "cells with runs in both.")
    return "; ".join(f"{r['factor']} {r['from']} -> {r['to']} ({r['kept']} kept) moves "
                     f"{r['quantity']} by {r['change']:+.2f} points ({r['seeds']} seed(s))"
                     for r in moved.to_dict("records")) + "."


PROXIMAL_ANCHORS: Dict[str, str] = {"fedprox": "the model received at the last mix",
                                    "fedprox_source": "the source model, for the whole run"}


def proximal_anchor_table(results_dir: Path | str = RESULTS_DIR, step: Tuple[str, Optional[float]] = DRIFT_STEP,
                          settings: Sequence[str] = ("niid", "iid"), tie: float = 0.5) -> pd.DataFrame:
    """FedProx - FedAvg in one TTA-grad cell (``step``: cell, step size) for each proximal anchor of
    ``PROXIMAL_ANCHORS``, paired by seed, beside the paper's FedProx - FedAvg (FedTSA Table 1, TTA-grad)."""
    paper = _paper("fedtsa_table1")
    cell, lr = step
    rows = []
    for setting in settings:
        theirs = _grad_difference(paper, "FedProx", "FedAvg", setting)
        fedavg = accuracies(results_dir, cell, setting, ("fedavg", {}), lr=lr)
        for strategy, anchor in PROXIMAL_ANCHORS.items():
            prox = accuracies(results_dir, cell, setting, (strategy, {}), lr=lr)
            rows.append({"setting": setting, "strategy": strategy, "anchor": anchor,
                         **_difference_row(prox, fedavg, theirs, tie)})
    return pd.DataFrame(rows)


def proximal_anchor_reading(table: pd.DataFrame) -> str:
    """Per setting of ``proximal_anchor_table``: each anchor's FedProx - FedAvg beside the paper's, and which anchor
    with runs comes nearer the paper's (computed)."""
    parts = []
    for setting, g in table.groupby("setting", sort=False):
        ran = g[g.seeds > 0]
        theirs = float(g["paper"].iloc[0])
        said = "; ".join(f"anchored at {r['anchor']} ({r['strategy']}) {r['ours']:+.2f}"
                         + (f" (sd {r['ours sd']:.2f})" if r["seeds"] > 1 else "") + f" over {r['seeds']} seed(s), "
                         f"{r['verdict']}" for r in ran.to_dict("records"))
        text = f"{setting.upper()}: FedProx - FedAvg " + (said or "not run yet") + f"; the paper {theirs:+.2f}."
        if len(ran) > 1:
            nearest = ran.loc[(ran["ours"] - theirs).abs().idxmin()]
            text += (f" Nearer the paper: the anchor at {nearest['anchor']}, by "
                     f"{float((ran['ours'] - theirs).abs().max() - abs(nearest['ours'] - theirs)):.2f} points.")
        parts.append(text)
    return " ".join(parts)


def over_local_claims(values: pd.DataFrame, column: str, method: str, reading: str,
                      results_dir: Path | str = RESULTS_DIR, step: Tuple[str, Optional[float]] = DRIFT_STEP,
                      tie: float = 0.5) -> List[dict]:
    """``values[column]`` (rows with ``setting`` and ``seed``, and a ``code`` status where stored, e.g. FedAvg+FT as
    the reference code reports it, ``ft_forward.ft_forward_table``) minus the Local run of the same seed in one
    TTA-grad cell (``step``: cell, step size), per setting, as ``claims_table`` rows (its ``extra``): the paper's
    ``method`` above Local (FedTSA Table 1, TTA-grad), with ``reading`` naming how ``column`` was read."""
    paper = _paper("fedtsa_table1")
    cell, lr = step
    rows = []
    for setting, g in values.groupby("setting", sort=False):
        local = accuracies(results_dir, cell, setting, ("local", {}), lr=lr)
        ours = g.set_index("seed")[column]
        ours.attrs["stale"] = sorted(g.loc[g["code"] == "stale", "seed"]) if "code" in g else []
        rows.append({**_row(f"{method} above Local under TTA-grad, {setting.upper()} ({reading})", "FedTSA Table 1",
                            _grad_difference(paper, method, "Local", setting), paired(ours, local), tie,
                            f"{_cell_label(cell, lr)}, {setting.upper()}, {reading}", ours, local),
                     "method": method, "setting": setting})
    return rows


# the column of ``ft_forward.ft_forward_table`` that holds FedAvg+FT as the reference code reports it
FT_REFERENCE_READING = "FedAvg+FT (reference reading)"


def ft_reference_claims(ft_table: pd.DataFrame, results_dir: Path | str = RESULTS_DIR,
                        step: Tuple[str, Optional[float]] = DRIFT_STEP, tie: float = 0.5) -> List[dict]:
    """FedAvg+FT above Local as the reference code reports it (``ft_forward.ft_forward_table``), as
    ``claims_table`` rows (``over_local_claims``)."""
    return over_local_claims(ft_table, FT_REFERENCE_READING, "FedAvg+FT", "as the reference code reports it",
                             results_dir, step, tie)


def over_local_table(values: pd.DataFrame, column: str, method: str, results_dir: Path | str = RESULTS_DIR,
                     step: Tuple[str, Optional[float]] = DRIFT_STEP, tie: float = 0.5) -> pd.DataFrame:
    """``over_local_claims`` per setting, in the columns every difference table shares."""
    rows = over_local_claims(values, column, method, column, results_dir, step, tie)
    return pd.DataFrame(rows, columns=["setting", "ours", "ours sd", "seeds", "paper", "verdict", "stale runs"])


def over_local_reading(table: pd.DataFrame, what: str) -> str:
    """One sentence from ``over_local_table``: ``what`` - Local per setting, its spread and seeds, beside the paper's
    and the verdict (computed)."""
    return f"{what} - Local: " + "; ".join(
        f"{r['setting'].upper()} {r['ours']:+.2f}" + (f" (sd {r['ours sd']:.2f})" if r["seeds"] > 1 else "")
        + f" over {r['seeds']} seed(s) against the paper's {r['paper']:+.2f} ({r['verdict']})"
        for r in table.to_dict("records")) + "."
