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

from ftta_core import stats
from studies.fedtsa import step_rule
from studies.fedtsa.table1 import GRAD_CELLS, stored_table1_runs
from studies.paper import METHOD_LABELS, TTA_SETTINGS, paper_table
from ftta_core.plan import REPO_DIR
from ftta_core.stats import MARGIN, Estimate

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
DRIFT_STEP: Tuple[str, float] = (step_rule.CELL, step_rule.POST_HOC_STEP)
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
    runs at this step size instead of its own (``study fedtsa table --lr``)."""
    strategy, params = variant
    grid = stored_table1_runs(results_dir, [strategy], list(seeds), dataset, (tta,), (setting,), params, lr=lr)
    out = grid.set_index("seed")[column] if len(grid) else pd.Series(dtype=float)
    out.attrs["stale"] = sorted(grid.loc[grid["code"] == "stale", "seed"]) if len(grid) else []
    return out


def paired(a: pd.Series, b: pd.Series) -> Estimate:
    """``a - b`` paired by seed with its 95 % interval (``stats.paired``; a run stored without the measure, NaN,
    does not count)."""
    return stats.paired(a, b)


def stale_used(seeds: Sequence[int], *series: pd.Series) -> int:
    """How many of the runs behind ``series`` (``accuracies`` results) at ``seeds`` are stale."""
    return sum(len(set(s.attrs.get("stale", [])) & set(seeds)) for s in series)


def cell_class(tta: str, lr: Optional[float] = None, seeds: Sequence[int] = SEEDS,
               results_dir: Path | str = RESULTS_DIR) -> str:
    """The class a claim's cell is counted in (``stats.CELL_CLASSES``): TTA-bn and FedTSA's stated TTA-grad ("grad":
    batch BN, SGD 1e-4) are the paper's protocol; the running-BN Adam cell at its own step the reference code's; the
    other two cells of the TTA-grad 2x2 were set before any result; a step other than the cell's own is the
    step-size rule's pick on the replication seeds, or the post-hoc drift step (on the seeds it was chosen on, or on
    unseen ones)."""
    if lr is None:
        return {"bn": "paper protocol", "grad": "paper protocol",
                "grad-running-adam": "reference code protocol"}.get(tta, "factorial cell (set before results)")
    unseen = bool(seeds) and set(seeds) <= set(step_rule.REPLICATION_SEEDS)
    rule = step_rule.chosen_step(results_dir) if unseen else None
    if unseen and rule is not None and abs(lr - rule) < 1e-12 and tta == step_rule.CELL:
        return "rule-chosen (pre-registered)"
    return "post hoc, unseen seeds" if unseen else "post hoc"


def _paper(table: str, dataset: str = "cifar10") -> pd.Series:
    p = paper_table(table)
    return p[p.dataset == dataset].set_index(["method", "setting", "tta"])["mean"]


def _grad_difference(paper: pd.Series, method: str, against: str, setting: str) -> float:
    """The paper's ``method`` - ``against`` under TTA-grad in ``setting`` (labels of ``_paper``'s table)."""
    return paper[(method, setting, "grad")] - paper[(against, setting, "grad")]


def _difference_row(a: pd.Series, b: pd.Series, theirs: float, tie: float = MARGIN) -> Dict[str, Any]:
    """``a`` - ``b`` paired by seed beside the paper's ``theirs``: the columns every difference table shares
    (``stats.compare``: ``ours``, ``low``, ``high``, ``seeds``, ``paper``, ``verdict``, ``identical``; and
    ``stale runs``)."""
    out = stats.compare(a, b, theirs, tie)
    return {**out, "stale runs": stale_used(list(paired(a, b).seeds), a, b)}


def claim_row(claim: str, source: str, paper: float, ours: Estimate, tie: float, settled_by: str, *runs: pd.Series,
         cell: str = "", cell_class: str = "paper protocol", kind: Optional[str] = None, side: int = 1,
         not_counted: str = "") -> Dict[str, Any]:
    """One claim row: the paper's number, ours (``ours``: a ``stats.paired`` estimate) with its interval, the
    verdict (``stats.verdict``; ``kind``/``side`` for a claim without a number), the former rule's verdict, the
    cell and its class, whether both sides are equal at every seed (``identical``: holds by construction),
    ``not counted`` (why a row is not counted as a reproduction, e.g. decided by the step-size rule) and the
    runs compared (``runs``: ``accuracies`` series whose stale runs at the paired seeds are counted)."""
    seeds = list(ours.seeds)
    stale = stale_used(seeds, *runs)
    former = ("no run" if pd.isna(ours.mean) else
              stats.former_verdict(ours.mean, 1.0 + tie if kind == "direction" else paper, tie,
                                   None if kind == "direction" else 3.0))
    return {"claim": claim, "source": source, "paper": paper, "ours": ours.mean, "low": ours.low,
            "high": ours.high, "seeds": ours.n, "verdict": stats.verdict(ours, paper, tie, kind, side),
            "former verdict": former, "identical": ours.identical,
            "not counted": "by construction" if ours.identical else not_counted,
            "cell": cell, "cell class": cell_class, "stale runs": stale,
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
                      strategies: Sequence[str], tie: float, local_bn: pd.Series, best: bool,
                      seeds: Sequence[int] = SEEDS) -> List[dict]:
    """The TTA-grad claims of FedTSA Table 1 in one (cell, step size, setting) at ``seeds``: Local(grad) -
    Local(bn), each of ``strategies`` - Local (FedAvg's also against FedCTTA's Table I, one row per paper) and, with
    ``best``, FedTSA - the best other strategy (the paper's "FedTSA best"); each row with its cell and cell class."""
    paper, fedctta = _paper("fedtsa_table1"), _paper("fedctta_table1")
    local = accuracies(results_dir, cell, setting, ("local", {}), seeds, lr=lr)
    where = f"{_cell_label(cell, lr)}, {setting.upper()}"
    klass = cell_class(cell, lr, seeds, results_dir)
    at = {"cell": _cell_label(cell, lr), "cell_class": klass}
    rows = [claim_row(f"Local(grad) below Local(bn), {setting.upper()}", "FedTSA Table 1",
                 paper[("Local", setting, "grad")] - paper[("Local", setting, "bn")], paired(local, local_bn), tie,
                 where, local, local_bn, **at,
                 not_counted="decided by the step-size rule" if klass == "rule-chosen (pre-registered)" else "")]
    runs = {s: accuracies(results_dir, cell, setting, (s, {}), seeds, lr=lr) for s in strategies}
    for s, theirs in runs.items():
        label = METHOD_LABELS[s]
        ours = paired(theirs, local)
        rows.append({**claim_row(f"{label} above Local under TTA-grad, {setting.upper()}", "FedTSA Table 1",
                            _grad_difference(paper, label, "Local", setting), ours, tie, where,
                            theirs, local, **at), "method": label, "setting": setting})
        if s == "fedavg":
            rows.append(claim_row(f"FedAvg - Local under TTA-grad, {setting.upper()}", "FedCTTA Table I",
                             _grad_difference(fedctta, label, "Local", setting), ours,
                             tie, where, theirs, local, **at))
    if best:
        others = [s for s in strategies if s != "fedtsa"]
        rival = _best_of([runs[s] for s in others])
        theirs = max(paper[(METHOD_LABELS[s], setting, "grad")] for s in others)
        rows.append(claim_row(f"FedTSA best under TTA-grad, {setting.upper()} (minus the best other strategy)",
                         "FedTSA Table 1", paper[("FedTSA", setting, "grad")] - theirs,
                         paired(runs["fedtsa"], rival), tie, where, runs["fedtsa"], *runs.values(), **at))
    return rows


def strategy_gains(results_dir: Path | str = RESULTS_DIR, tie: float = MARGIN, step: Tuple[str, float] = DRIFT_STEP,
                   settings: Sequence[str] = ("niid", "iid")) -> pd.DataFrame:
    """Table 1's TTA-grad rows as gains over Local in one (cell, step size): per (setting, strategy of
    ``TABLE1_STRATEGIES``) our gain paired by seed (``ours`` with its 95 % interval ``low``-``high``, ``seeds``),
    the paper's (FedTSA Table 1) and the verdict (``stats.verdict``); the rows of ``tta_grad_claims`` for that
    step."""
    cell, lr = step
    rows = [r for setting in settings
            for r in _grad_cell_claims(results_dir, cell, lr, setting, TABLE1_STRATEGIES, tie,
                                       accuracies(results_dir, "bn", setting, ("local", {})), False)
            if "method" in r]
    return pd.DataFrame(rows)[["setting", "method", "paper", "ours", "low", "high", "seeds", "verdict",
                               "cell class", "stale runs", "settled by"]]


def strategy_gains_reading(table: pd.DataFrame, tie: float = MARGIN) -> str:
    """``strategy_gains`` in sentences, per setting: how many strategies with runs gain over Local with an
    interval that excludes 0 (and how many of the same strategies gain more than ``tie`` in the paper), the verdict
    counts (``stats.verdict``), how alike the two rank them (Spearman, from three strategies on), and the best
    strategy in each."""
    parts = []
    for setting, g in table.groupby("setting", sort=False):
        ran = g.dropna(subset=["ours"])
        if ran.empty:
            parts.append(f"{setting.upper()}: no strategy has a run paired with Local yet.")
            continue
        seeds = sorted(set(ran["seeds"]))
        text = (f"{setting.upper()} ({len(ran)} of {len(g)} strategies with runs, "
                f"{seeds[0] if len(seeds) == 1 else f'{seeds[0]}-{seeds[-1]}'} seed(s) each): "
                f"{int((ran['low'] > 0).sum())} gain over Local with a 95 % interval above 0 (the paper: "
                f"{int((ran['paper'] > tie).sum())} of the same gain more than {tie:g}); the verdict holds for "
                f"{int((ran['verdict'] == 'holds').sum())} of {len(ran)}")
        for name, said in (("direction only", "in direction only (the interval misses the paper's size)"),
                           ("does not hold", "does not hold"), ("undetermined", "is undetermined")):
            differ = ran[ran["verdict"] == name]
            if len(differ):
                text += f", {said} for " + ", ".join(
                    f"{r['method']} {r['ours']:+.2f} [{r['low']:+.2f}, {r['high']:+.2f}] vs {r['paper']:+.2f}"
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
                       settings: Sequence[str] = ("niid", "iid"), tie: float = MARGIN,
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


def _interval(r: Mapping[str, Any]) -> str:
    """A row's mean with its interval and seeds: '+1.23 [+0.10, +2.36] (5 seeds)'."""
    if r["seeds"] < 2:
        return f"{r['ours']:+.2f} (1 seed)"
    return f"{r['ours']:+.2f} [{r['low']:+.2f}, {r['high']:+.2f}] ({r['seeds']} seeds)"


def difference_by_step_reading(table: pd.DataFrame) -> str:
    """``difference_by_step`` (one or several, concatenated) in one sentence per (setting, difference): ours at each
    cell and step size with runs, beside the paper's."""
    parts = []
    for (setting, difference), g in table.groupby(["setting", "difference"], sort=False):
        ran = g[g.seeds > 0]
        said = ", ".join(f"{_interval(r)} in {r['cell']} ({r['verdict']})" for r in ran.to_dict("records"))
        parts.append(f"{setting.upper()}: {difference} " + (said or "not run yet")
                     + f"; the paper {g['paper'].iloc[0]:+.2f}.")
    return " ".join(parts)


def tta_grad_claims(results_dir: Path | str = RESULTS_DIR, tie: float = MARGIN,
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


def replication_claims(results_dir: Path | str = RESULTS_DIR, tie: float = MARGIN,
                       settings: Sequence[str] = ("niid", "iid")) -> List[dict]:
    """The TTA-grad claims about ``step_rule.REPLICATION_STRATEGIES`` on the replication seeds (none of the stored
    protocol runs used them), at the step the pre-registered rule picks and, when it picks another, at the
    post-hoc drift step (docs/statistics.md); nothing until the rule has picked."""
    rule = step_rule.chosen_step(results_dir)
    if rule is None:
        return []
    steps = [rule] + ([DRIFT_STEP[1]] if abs(rule - DRIFT_STEP[1]) > 1e-12 else [])
    strategies = [s for s in step_rule.REPLICATION_STRATEGIES if s != "local"]
    seeds = step_rule.REPLICATION_SEEDS
    rows = []
    for setting in settings:
        local_bn = accuracies(results_dir, "bn", setting, ("local", {}), seeds)
        for lr in steps:
            rows += _grad_cell_claims(results_dir, step_rule.CELL, lr, setting, strategies, tie, local_bn, False,
                                      seeds)
    return rows


def fedctta_claims(results_dir: Path | str = RESULTS_DIR, tie: float = MARGIN,
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
        rows.append(claim_row("FedCTTA best under TTA-bn, NIID (minus the best of Local/FedAvg/FedAvgM/FedTSA)",
                         "FedCTTA Table I", paper[("FedCTTA", "niid", "bn")] - best_other_paper,
                         paired(ours, best), tie, f"{label}, TTA-bn, NIID", ours, *parts, cell=f"{label}, TTA-bn"))
        iid, fedavg = accuracies(results_dir, "bn", "iid", variant), accuracies(results_dir, "bn", "iid", ("fedavg", {}))
        rows.append(claim_row("FedCTTA not below FedAvg under TTA-bn, IID", "FedCTTA Table I",
                         paper[("FedCTTA", "iid", "bn")] - paper[("FedAvg", "iid", "bn")],
                         paired(iid, fedavg), tie, f"{label}, TTA-bn, IID", iid, fedavg, cell=f"{label}, TTA-bn"))
        for cell, setting, lr in FEDCTTA_GRAD_CELLS[label]:
            grad, local = (accuracies(results_dir, cell, setting, variant, lr=lr),
                           accuracies(results_dir, cell, setting, ("local", {}), lr=lr))
            rows.append(claim_row(f"FedCTTA above Local under TTA-grad, {setting.upper()}", "FedCTTA Table I",
                             _grad_difference(paper, "FedCTTA", "Local", setting),
                             paired(grad, local), tie, f"{label}, {_cell_label(cell, lr)}, {setting.upper()}", grad,
                             local, cell=f"{label}, {_cell_label(cell, lr)}",
                             cell_class=cell_class(cell, lr, SEEDS, results_dir)))
    return rows


def fedavgm_claims(results_dir: Path | str = RESULTS_DIR, tie: float = MARGIN) -> List[dict]:
    """FedAvgM equal to FedAvg under TTA-bn (both papers' tables), for momentum on every shared tensor and on
    parameters only (under TTA-bn the shared tensors are BN statistics, so the latter is FedAvg by construction)."""
    paper = _paper("fedctta_table1")
    rows = []
    for setting in ("niid", "iid"):
        fedavg = accuracies(results_dir, "bn", setting, ("fedavg", {}))
        for label, variant in FEDAVGM_VARIANTS.items():
            ours = accuracies(results_dir, "bn", setting, variant)
            rows.append(claim_row(f"FedAvgM equal to FedAvg under TTA-bn, {setting.upper()}", "FedCTTA Table I",
                             paper[("FedAvgM", setting, "bn")] - paper[("FedAvg", setting, "bn")],
                             paired(ours, fedavg), tie, f"{label}, TTA-bn, {setting.upper()}", ours, fedavg,
                             cell=f"{label}, TTA-bn"))
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


def claims_table(results_dir: Path | str = RESULTS_DIR, tie: float = MARGIN,
                 extra: Optional[Sequence[Mapping[str, Any]]] = None) -> pd.DataFrame:
    """All client-fidelity claims: the paper's difference, ours with its 95 % interval and seeds, the verdict
    (``stats.verdict``) and the former rule's, the cell and its class, whether the row holds by construction, and
    the runs. ``extra``: more rows of the same shape (e.g. ``temperature.pfedbbn_claims``)."""
    rows = (tta_grad_claims(results_dir, tie) + replication_claims(results_dir, tie)
            + fedctta_claims(results_dir, tie) + fedavgm_claims(results_dir, tie))
    return pd.DataFrame(rows + list(extra or []))


CLAIM_COLUMNS = ["paper", "ours", "low", "high", "seeds", "verdict", "former verdict", "not counted", "stale runs"]


def claims_counts(table: pd.DataFrame) -> pd.DataFrame:
    """Verdict counts per cell class under the rule (``stats.count_by_class``) beside the former rule's counts
    (rows not counted left out of both), with a total row."""
    new = stats.count_by_class(table)
    counted = table[table["not counted"].fillna("") == ""]
    former = pd.crosstab(counted["cell class"], counted["former verdict"]).add_prefix("former: ")
    out = new.join(former, how="left").fillna(0).astype(int)
    out.loc["all"] = out.sum()
    return out


def claims_reading(table: pd.DataFrame) -> str:
    """The verdict counts per cell class (computed from ``claims_table``): how many hold under the rule and under
    the former one, which rows changed verdict, which are not counted and why, and stale runs."""
    counted = table[table["not counted"].fillna("") == ""]
    parts = []
    for klass, g in counted.groupby("cell class", sort=False):
        n = g["verdict"].value_counts()
        f = g["former verdict"].value_counts()
        parts.append(f"{klass}: {n.get('holds', 0)} of {len(g)} hold ({n.get('direction only', 0)} in direction only, "
                     f"{n.get('does not hold', 0)} do not, {n.get('undetermined', 0)} undetermined, "
                     f"{n.get('no run', 0)} without a run; the former rule: {f.get('holds', 0)} hold)")
    text = "Under the pre-stated rule (docs/statistics.md), per cell class: " + "; ".join(parts) + "."
    changed = counted[(counted["verdict"] != counted["former verdict"]) & (counted["seeds"] > 0)]
    if len(changed):
        text += (f" {len(changed)} row(s) changed verdict: " + "; ".join(
            f"{r['claim']} [{r['cell'] or r['settled by']}] {r['former verdict']} -> {r['verdict']} "
            f"({_interval(r)} vs paper {r['paper']:+.2f})" for r in changed.to_dict("records")) + ".")
    apart = table[table["not counted"].fillna("") != ""]
    if len(apart):
        text += " Not counted: " + "; ".join(f"{r['claim']} [{r['cell'] or r['settled by']}] ({r['not counted']})"
                                             for r in apart.to_dict("records")) + "."
    stale = int((table.get("stale runs", pd.Series(dtype=int)).fillna(0) > 0).sum())
    if stale:
        text += (f" {stale} row(s) rest on runs made by code that has changed since (`python -m ftta_core runs "
                 f"figures --list stale` names them).")
    return text


__all__ = ["DRIFT_STEP", "TABLE1_STRATEGIES", "strategy_gains", "strategy_gains_reading", "difference_by_step",
           "difference_by_step_reading", "accuracies", "paired", "stale_used", "cell_class", "tta_grad_claims",
           "replication_claims", "fedctta_claims", "fedavgm_claims", "claims_table", "claims_counts", "CLAIM_COLUMNS",
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
        est = paired(after, before)
        rows.append({"factor": factor, "from": source, "to": target, "kept": kept, "quantity": what,
                     "change": est.mean, "low": est.low, "high": est.high, "seeds": est.n,
                     "comparison": stats.comparison(est), "setting": setting})
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
    with ``study fedtsa table --lr``) instead of its own."""
    from studies.fedtsa.table1 import stored_table1_runs

    rows = []
    for setting in settings:
        reference = accuracies(results_dir, tta, setting, (against, {}), seeds, lr=lr)
        for label in [k for k in FEDCTTA_VARIANTS if tta == "bn" or (tta, setting, lr) in FEDCTTA_GRAD_CELLS[k]]:
            strategy, params = FEDCTTA_VARIANTS[label]
            grid = stored_table1_runs(results_dir, [strategy], list(seeds), ttas=(tta,), settings=(setting,),
                                      strategy_params=params, extra_keys=("weight_shares",), lr=lr)
            ours = accuracies(results_dir, tta, setting, (strategy, params), seeds, lr=lr)
            est = paired(ours, reference)
            shares = pd.DataFrame(list(grid["weight_shares"].dropna())) if "weight_shares" in grid else pd.DataFrame()
            rows.append({"tta": tta, "setting": setting.upper(), "FedCTTA": label,
                         "against": METHOD_LABELS.get(against, against), "difference": est.mean, "low": est.low,
                         "high": est.high, "seeds": est.n, "comparison": stats.comparison(est),
                         "stale runs": stale_used(list(est.seeds), ours, reference),
                         **{f"W {k}": float(shares[k].mean()) if k in shares else float("nan")
                            for k in ("self", "same domain", "uniform same-domain")},
                         "runs with W's shares": len(shares)})
    return pd.DataFrame(rows)


def probe_contrast_reading(table: pd.DataFrame, n_clients: int = 20) -> str:
    """``fedctta_probe_contrast`` in sentences: each probe normalisation's gap to the reference strategy with its
    interval and ``stats.comparison`` and, where the runs kept W's shares, how far W is from uniform mixing
    (self-weight 1/N)."""
    lines = []
    for r in table.to_dict("records"):
        ref = r["against"]
        if not r["seeds"]:
            lines.append(f"- {r['FedCTTA']}, {r['setting']}: no run paired with {ref}.")
            continue
        said = {"ahead": "above", "behind": "below", "equal within the margin": f"equal within the {MARGIN:g}-point "
                "margin", "identical": "identical"}.get(r["comparison"], "undetermined")
        text = (f"- {r['FedCTTA']}, {r['setting']}: "
                + _interval({"ours": r["difference"], "low": r["low"], "high": r["high"], "seeds": r["seeds"]})
                + f" against {ref}, {said}"
                + (f" ({r['stale runs']} run(s) made by code that has changed since)" if r["stale runs"] else ""))
        with_shares = r["runs with W's shares"]
        if with_shares:
            text += (f"; W keeps {r['W self']:.3f} on each client (uniform mixing: {1 / n_clients:.3f}) and gives "
                     f"{r['W same domain']:.3f} to the clients on its corruption (uniform: "
                     f"{r['W uniform same-domain']:.3f}; {with_shares} run(s))")
        lines.append(text + ".")
    return "\n".join(lines)


def contrasts_reading(contrasts: pd.DataFrame) -> str:
    """The contrasts whose 95 % interval excludes 0 (``stats.comparison``: ahead / behind), largest first
    (computed)."""
    moved = contrasts[contrasts["comparison"].isin(["ahead", "behind"])].sort_values("change", key=abs,
                                                                                    ascending=False)
    if moved.empty:
        return ("No single factor moves Local or a strategy's gap over Local with a 95 % interval that excludes 0 "
                "in the cells with runs in both.")
    return "; ".join(f"{r['factor']} {r['from']} -> {r['to']} ({r['kept']} kept) moves {r['quantity']} by "
                     + _interval({"ours": r["change"], "low": r["low"], "high": r["high"], "seeds": r["seeds"]})
                     for r in moved.to_dict("records")) + "."


PROXIMAL_ANCHORS: Dict[str, str] = {"fedprox": "the model received at the last mix",
                                    "fedprox_source": "the source model, for the whole run"}


def proximal_anchor_table(results_dir: Path | str = RESULTS_DIR, step: Tuple[str, Optional[float]] = DRIFT_STEP,
                          settings: Sequence[str] = ("niid", "iid"), tie: float = MARGIN) -> pd.DataFrame:
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
        said = "; ".join(f"anchored at {r['anchor']} ({r['strategy']}) {_interval(r)}, {r['verdict']}"
                         for r in ran.to_dict("records"))
        text = f"{setting.upper()}: FedProx - FedAvg " + (said or "not run yet") + f"; the paper {theirs:+.2f}."
        if len(ran) > 1:
            nearest = ran.loc[(ran["ours"] - theirs).abs().idxmin()]
            text += (f" Nearer the paper: the anchor at {nearest['anchor']}, by "
                     f"{float((ran['ours'] - theirs).abs().max() - abs(nearest['ours'] - theirs)):.2f} points.")
        parts.append(text)
    return " ".join(parts)


def over_local_claims(values: pd.DataFrame, column: str, method: str, reading: str,
                      results_dir: Path | str = RESULTS_DIR, step: Tuple[str, Optional[float]] = DRIFT_STEP,
                      tie: float = MARGIN) -> List[dict]:
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
        rows.append({**claim_row(f"{method} above Local under TTA-grad, {setting.upper()} ({reading})", "FedTSA Table 1",
                            _grad_difference(paper, method, "Local", setting), paired(ours, local), tie,
                            f"{_cell_label(cell, lr)}, {setting.upper()}, {reading}", ours, local,
                            cell=_cell_label(cell, lr), cell_class=cell_class(cell, lr, SEEDS, results_dir)),
                     "method": method, "setting": setting})
    return rows


# the column of ``ft_forward.ft_forward_table`` that holds FedAvg+FT as the reference code reports it
FT_REFERENCE_READING = "FedAvg+FT (reference reading)"


def ft_reference_claims(ft_table: pd.DataFrame, results_dir: Path | str = RESULTS_DIR,
                        step: Tuple[str, Optional[float]] = DRIFT_STEP, tie: float = MARGIN) -> List[dict]:
    """FedAvg+FT above Local as the reference code reports it (``ft_forward.ft_forward_table``), as
    ``claims_table`` rows (``over_local_claims``)."""
    return over_local_claims(ft_table, FT_REFERENCE_READING, "FedAvg+FT", "as the reference code reports it",
                             results_dir, step, tie)


def over_local_table(values: pd.DataFrame, column: str, method: str, results_dir: Path | str = RESULTS_DIR,
                     step: Tuple[str, Optional[float]] = DRIFT_STEP, tie: float = MARGIN) -> pd.DataFrame:
    """``over_local_claims`` per setting, in the columns every difference table shares."""
    rows = over_local_claims(values, column, method, column, results_dir, step, tie)
    return pd.DataFrame(rows, columns=["setting", "ours", "low", "high", "seeds", "paper", "verdict", "cell class",
                                       "stale runs"])


def over_local_reading(table: pd.DataFrame, what: str) -> str:
    """One sentence from ``over_local_table``: ``what`` - Local per setting, its interval and seeds, beside the paper's
    and the verdict (computed)."""
    return f"{what} - Local: " + "; ".join(
        f"{r['setting'].upper()} {_interval(r)} against the paper's {r['paper']:+.2f} ({r['verdict']})"
        for r in table.to_dict("records")) + "."
