"""The one statistics module: paired differences by seed, their confidence interval, and the verdict rule.

Every verdict the workbook prints (claims tables, studies, the leaderboard, every notebook) is computed here. The
rule was written down before the runs it is applied to (docs/statistics.md gives the same text with its reasons):

1. **Unit.** A seed fixes the stream, the clients' corruptions and every random draw, so two methods are compared
   *paired by seed*, over the seeds both have a run for (a run stored without the measure does not count).
2. **Interval.** The mean paired difference with a two-sided 95 % Student-t confidence interval (n - 1 degrees of
   freedom). Not a bootstrap: with the 3-5 seeds a protocol run affords, a percentile bootstrap has at most 126
   distinct resamples and covers well under 95 % (0.84 at n = 5 and 0.75 at n = 3 for normal data, where t covers
   0.95: ``benchmarks/results/interval_coverage.md``), while the t interval is exact for normal differences; each
   difference is a mean over thousands of predictions, which makes normality a mild assumption. The interval says
   how far the mean could be from the value more seeds would give.
3. **Too few seeds.** Under ``MIN_SEEDS`` (3) paired seeds the verdict is "undetermined", never "holds".
4. **Margin.** ``MARGIN`` (0.5 points of accuracy) is stated once: the equivalence margin of a "tie" claim and the
   tolerance on a stated size. It is the tie band the workbook used before this rule; it was not chosen on any of
   the runs the rule now reads first.
5. **Verdicts** (``verdict``), with ``[lo, hi]`` the interval and ``p`` the paper's number for the same quantity:
   - a *tie* claim (``|p| <= MARGIN``, e.g. "FedAvgM equals FedAvg"): equivalence test (TOST with the 95 %
     interval): "holds" when ``[lo, hi]`` lies inside ``[-MARGIN, MARGIN]``; "does not hold" when it lies outside
     it; "undetermined" otherwise;
   - a *difference* claim (``|p| > MARGIN``; ``[lo, hi]`` read in the paper's direction): "holds" when the
     interval excludes 0 on the paper's side and is compatible with the paper's size (it reaches within
     ``MARGIN`` of ``|p|``); "direction only" when it excludes 0 on the paper's side but not the size; "does not
     hold" when it excludes 0 on the other side, or contains 0 and excludes the paper's size (less ``MARGIN``);
     "undetermined" otherwise (the interval contains both 0 and the paper's size);
   - a *direction* claim (no size, e.g. "W gives more weight to the same domain than uniform mixing"): "holds"
     when the interval excludes 0 on the claimed side, "does not hold" when it excludes 0 on the other, else
     "undetermined".
   - "no run" when no seed has both.
6. **What is counted.** A row whose two sides are the same computation (equal at every seed within
   ``IDENTICAL_TOLERANCE``, e.g. FedAvgM with momentum on parameters under TTA-bn, where the shared tensors are BN
   statistics) holds *by construction* and is not counted as a reproduction (``identical``). Rows are counted per
   cell class (``CELL_CLASSES``): a cell chosen after seeing results is "post hoc" and its verdicts are counted
   apart from the protocol cells. When two papers
   give different numbers for one quantity, one row per paper.
7. **Chance.** A comparison against a baseline within ``CHANCE_FACTOR`` (2) times chance accuracy carries a caveat
   (``near_chance``): a lead over a model that learned almost nothing is not a comparison of trained models.

The former rule (``former_verdict``: within 0.5 points, or the paper's side within 3x, ignoring spread and seeds) is
kept only to show which rows the new rule changes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

CONFIDENCE = 0.95
MIN_SEEDS = 3
MARGIN = 0.5
CHANCE_FACTOR = 2.0
# two sides whose paired differences all lie within this many points are the same computation up to float32
# rounding (a handful of the protocol's 150,000 predictions flip with the order of a reduction). Set from the one
# pair that is equal by construction, FedAvgM with momentum on parameters against FedAvg under TTA-bn (largest
# per-seed difference 0.006 points over 5 seeds x NIID/IID); a row within it holds by construction.
IDENTICAL_TOLERANCE = 0.01
VERDICTS = ("holds", "direction only", "does not hold", "undetermined", "no run")
# the cell classes a claim row is counted in (``count_by_class``), in the order tables show them
CELL_CLASSES = ("paper protocol", "reference code protocol", "factorial cell (set before results)",
                "rule-chosen (pre-registered)", "post hoc", "post hoc, unseen seeds")


def t_half_width(sd: Any, n: Any, confidence: float = CONFIDENCE) -> Any:
    """Student-t half-width of a mean over ``n`` values with standard deviation ``sd`` (NaN below 2 values);
    scalars or arrays/Series alike."""
    from scipy import stats as st

    n_arr = np.asarray(n, dtype=float)
    sd_arr = np.asarray(sd, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = st.t.ppf(0.5 + confidence / 2, np.clip(n_arr - 1, 1, None))
        out = np.where(n_arr > 1, q * sd_arr / np.sqrt(np.clip(n_arr, 1, None)), np.nan)
    return float(out) if np.ndim(out) == 0 else out


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds with its 95 % t interval: ``values`` by seed (a paired difference, or one quantity)."""

    seeds: Tuple[Any, ...]
    values: Tuple[float, ...]
    mean: float
    sd: float
    low: float
    high: float
    confidence: float = CONFIDENCE
    extra: Dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2 if self.n > 1 else float("nan")

    @property
    def identical(self) -> bool:
        """Both sides equal at every seed (within ``IDENTICAL_TOLERANCE``): the same computation."""
        return self.n > 0 and all(abs(v) <= IDENTICAL_TOLERANCE for v in self.values)

    def signs(self) -> Tuple[int, int]:
        """(seeds above 0, seeds below 0)."""
        return sum(v > 0 for v in self.values), sum(v < 0 for v in self.values)

    def text(self, digits: int = 2) -> str:
        """'+1.23 [+0.10, +2.36] (5 seeds)', or '+1.23 (1 seed)' without an interval."""
        if not self.n:
            return "no paired seed"
        if self.n < 2:
            return f"{self.mean:+.{digits}f} (1 seed)"
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}] ({self.n} seeds)"


def estimate(values: pd.Series | Mapping[Any, float] | Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """The mean of ``values`` (by seed; NaN dropped) with its t interval."""
    s = pd.Series(values, dtype=float).dropna()
    n = len(s)
    mean = float(s.mean()) if n else float("nan")
    sd = float(s.std(ddof=1)) if n > 1 else float("nan")
    hw = t_half_width(sd, n, confidence) if n > 1 else float("nan")
    return Estimate(tuple(s.index), tuple(float(v) for v in s), mean, sd, mean - hw, mean + hw, confidence)


def paired(a: pd.Series, b: pd.Series, confidence: float = CONFIDENCE) -> Estimate:
    """``a - b`` paired by seed (both indexed by seed) over the seeds both have a value for, with its interval."""
    a, b = pd.Series(a, dtype=float).dropna(), pd.Series(b, dtype=float).dropna()
    both = sorted(a.index.intersection(b.index))
    return estimate((a[both] - b[both]) if both else pd.Series(dtype=float), confidence)


def claim_kind(paper: Optional[float], margin: float = MARGIN) -> str:
    """'tie' when the paper's number is within ``margin`` of 0, 'difference' otherwise, 'direction' when None."""
    if paper is None or (isinstance(paper, float) and np.isnan(paper)):
        return "direction"
    return "tie" if abs(paper) <= margin else "difference"


def verdict(est: Estimate, paper: Optional[float], margin: float = MARGIN, kind: Optional[str] = None,
            side: int = 1, min_seeds: int = MIN_SEEDS) -> str:
    """The pre-stated verdict of ``est`` against the paper's ``paper`` (module docstring, point 5). ``kind``:
    'tie' | 'difference' | 'direction' (default from ``paper``: ``claim_kind``); ``side``: the claimed sign of a
    'direction' claim (+1: above 0)."""
    if not est.n:
        return "no run"
    if est.n < min_seeds or np.isnan(est.low):
        return "undetermined"
    kind = kind or claim_kind(paper, margin)
    lo, hi = est.low, est.high
    if kind == "tie":
        if -margin <= lo and hi <= margin:
            return "holds"
        if hi < -margin or lo > margin:
            return "does not hold"
        return "undetermined"
    s = side if kind == "direction" else (1 if paper > 0 else -1)
    lo, hi = (lo, hi) if s > 0 else (-hi, -lo)  # in the claimed direction
    if kind == "direction":
        return "holds" if lo > 0 else "does not hold" if hi < 0 else "undetermined"
    size = abs(paper)
    if lo > 0:
        return "holds" if lo <= size + margin and hi >= size - margin else "direction only"
    if hi < 0 or hi < size - margin:
        return "does not hold"
    return "undetermined"


def compare(a: pd.Series, b: pd.Series, paper: Optional[float], margin: float = MARGIN,
            kind: Optional[str] = None, side: int = 1) -> Dict[str, Any]:
    """``paired(a, b)`` and its ``verdict`` as the columns every claim/difference table shares: ``ours`` (mean),
    ``low``, ``high`` (95 % interval), ``seeds``, ``paper``, ``verdict``, ``identical``."""
    est = paired(a, b)
    return {"ours": est.mean, "low": est.low, "high": est.high, "seeds": est.n,
            "paper": float("nan") if paper is None else paper,
            "verdict": verdict(est, paper, margin, kind, side), "identical": est.identical}


def comparison(est: Estimate, margin: float = MARGIN) -> str:
    """A comparison without a paper's number (A against B): 'ahead' / 'behind' when the interval excludes 0,
    'equal within the margin' when it lies inside ``[-margin, margin]``, 'undetermined' otherwise or under
    ``MIN_SEEDS``, 'identical' when equal at every seed, 'no paired seed'."""
    if not est.n:
        return "no paired seed"
    if est.identical:
        return "identical"
    if est.n < MIN_SEEDS or np.isnan(est.low):
        return "undetermined"
    if est.low > 0:
        return "ahead"
    if est.high < 0:
        return "behind"
    if -margin <= est.low and est.high <= margin:
        return "equal within the margin"
    return "undetermined"


def direction(difference: float, margin: float = MARGIN) -> str:
    """Which way one seed's difference points, where no interval exists (a check run at a single seed): 'ahead'
    above ``margin``, 'behind' below ``-margin``, 'within the margin' otherwise, 'no run' for NaN. A description,
    never a verdict: ``comparison`` of the same single seed is 'undetermined'."""
    if np.isnan(difference):
        return "no run"
    return "ahead" if difference > margin else "behind" if difference < -margin else "within the margin"


def comparison_phrase(a: pd.Series, b: pd.Series, name_a: str, name_b: str) -> str:
    """'A - B = +0.12 [-0.50, +0.74] (3 seeds): undetermined', from ``paired`` and ``comparison``."""
    est = paired(a, b)
    if not est.n:
        return f"{name_a} - {name_b}: no seed has both"
    why = "" if est.n >= MIN_SEEDS else f", fewer than {MIN_SEEDS} seeds"
    return f"{name_a} - {name_b} = {est.text()}: {comparison(est)}{why}"


def former_verdict(ours: float, paper: float, tie: float = MARGIN, factor: Optional[float] = 3.0) -> str:
    """The rule the claims tables used before this module (kept only to show which rows the rule changes): 'holds'
    within ``tie`` of the paper's number, or on its side of 0 within a factor ``factor``; 'direction only' on its
    side at another size; else 'does not hold'; spread and seeds ignored."""
    if np.isnan(ours):
        return "no run"
    if factor is not None and abs(ours - paper) <= tie:
        return "holds"

    def sign(x: float) -> int:
        return 0 if abs(x) <= tie else (1 if x > 0 else -1)

    if sign(ours) != sign(paper):
        return "does not hold"
    if factor is None or sign(paper) == 0 or 1 / factor <= ours / paper <= factor:
        return "holds"
    return "direction only"


def near_chance(accuracy: float, chance: float, factor: float = CHANCE_FACTOR) -> bool:
    """Whether a baseline's accuracy is within ``factor`` times chance (point 7)."""
    return bool(accuracy <= factor * chance)


def chance_caveat(name: str, accuracy: float, chance: float, factor: float = CHANCE_FACTOR) -> str:
    """The caveat sentence for a baseline within ``factor`` x chance, '' otherwise."""
    if not near_chance(accuracy, chance, factor):
        return ""
    return (f"Caveat: {name} ({accuracy:.1f}%) is within {factor:g}x chance ({chance:g}%), so a lead over it is over "
            "a model that learned almost nothing, not a comparison of trained models.")


def mean_table(values: pd.DataFrame, by: Sequence[str], column: str) -> pd.DataFrame:
    """Mean, sd, seeds and the 95 % interval of ``column`` per group ``by`` (rows of ``values``: one per seed)."""
    g = values.groupby(list(by))[column]
    out = pd.DataFrame({"mean": g.mean(), "sd": g.std(ddof=1), "seeds": g.count()})
    hw = t_half_width(out["sd"], out["seeds"])
    out["low"], out["high"] = out["mean"] - hw, out["mean"] + hw
    return out


def paired_table(wide: pd.DataFrame, new: str, others: Iterable[str], by: Optional[str] = None) -> pd.DataFrame:
    """``new`` minus each of ``others`` (columns of ``wide``, rows seeds or (``by``, seed)), paired by seed within
    each ``by`` group: mean, interval, seeds and ``comparison``; one row per (group, other)."""
    rows: List[Dict[str, Any]] = []
    groups = wide.groupby(level=by) if by else [(None, wide)]
    for key, g in groups:
        g = g.droplevel(by) if by else g
        for other in others:
            if new not in g or other not in g:
                continue
            est = paired(g[new], g[other])
            rows.append({**({by: key} if by else {}), "versus": other, "gain": est.mean, "low": est.low,
                         "high": est.high, "seeds": est.n, "comparison": comparison(est)})
    return pd.DataFrame(rows)


def count_by_class(table: pd.DataFrame) -> pd.DataFrame:
    """Verdict counts per cell class (``cell class`` column), rows holding by construction (``identical``) apart:
    columns the verdicts plus 'by construction'."""
    t = table.copy()
    t["counted"] = np.where(t.get("identical", False).fillna(False).astype(bool), "by construction", t["verdict"])
    out = pd.crosstab(t["cell class"], t["counted"])
    cols = [c for c in (*VERDICTS, "by construction") if c in out]
    classes = [c for c in CELL_CLASSES if c in out.index] + [c for c in out.index if c not in CELL_CLASSES]
    return out.reindex(index=classes, columns=cols).fillna(0).astype(int)


__all__ = ["CONFIDENCE", "MIN_SEEDS", "MARGIN", "CHANCE_FACTOR", "IDENTICAL_TOLERANCE", "VERDICTS", "CELL_CLASSES",
           "Estimate", "estimate", "paired", "verdict", "compare", "comparison", "comparison_phrase", "former_verdict",
           "claim_kind",
           "t_half_width", "near_chance", "chance_caveat", "mean_table", "paired_table", "count_by_class"]
