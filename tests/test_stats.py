"""The one statistics module (``ftta_core.stats``): the verdict rule branch by branch, the t interval, pairing."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ftta_core import stats
from ftta_core.stats import Estimate


def interval(low: float, high: float, n: int = 3) -> Estimate:
    """A hand-made estimate with the interval [low, high] over ``n`` seeds (values never all 0)."""
    mean = (low + high) / 2
    return Estimate(tuple(range(n)), tuple(mean + 0.1 * (k + 1) for k in range(n)), mean, 1.0, low, high)


NO_RUN = Estimate((), (), float("nan"), float("nan"), float("nan"), float("nan"))

# (interval, the paper's number, kind, side, verdict): every branch of ``stats.verdict`` (docs/statistics.md, point 5)
VERDICT_TABLE = [
    # a tie claim (|paper| <= 0.5): equivalence with the 95 % interval
    ((-0.3, 0.4), 0.2, None, 1, "holds"),
    ((-0.5, 0.5), 0.0, None, 1, "holds"),  # the margin's ends are inside
    ((0.6, 1.0), 0.2, None, 1, "does not hold"),
    ((-1.2, -0.8), 0.2, None, 1, "does not hold"),
    ((0.2, 0.8), 0.2, None, 1, "undetermined"),
    ((-0.9, 0.1), -0.4, None, 1, "undetermined"),
    # a difference claim (|paper| > 0.5), read in the paper's direction
    ((1.8, 2.5), 2.0, None, 1, "holds"),
    ((2.4, 3.1), 2.0, None, 1, "holds"),  # reaches within the margin of the size from above
    ((0.1, 1.0), 2.0, None, 1, "direction only"),  # excludes 0, misses the size from below
    ((3.0, 4.0), 2.0, None, 1, "direction only"),  # excludes 0, misses the size from above
    ((-1.0, -0.2), 2.0, None, 1, "does not hold"),  # excludes 0 on the other side
    ((-0.5, 1.2), 2.0, None, 1, "does not hold"),  # contains 0, excludes the size less the margin
    ((-0.5, 2.0), 2.0, None, 1, "undetermined"),  # contains both 0 and the size
    ((-2.4, -1.7), -2.0, None, 1, "holds"),  # a negative claim, mirrored
    ((-5.0, -3.0), -2.0, None, 1, "direction only"),
    ((0.3, 0.9), -2.0, None, 1, "does not hold"),
    ((-1.0, 0.1), -2.0, None, 1, "does not hold"),
    ((-3.0, 0.1), -2.0, None, 1, "undetermined"),
    # a direction claim (no size)
    ((0.1, 0.5), None, None, 1, "holds"),
    ((0.1, 50.0), float("nan"), None, 1, "holds"),  # NaN paper number: a direction claim, however far
    ((-0.5, -0.1), None, "direction", 1, "does not hold"),
    ((-0.1, 0.5), None, "direction", 1, "undetermined"),
    ((-0.5, -0.1), None, "direction", -1, "holds"),  # the claimed side is below 0
    ((0.1, 0.5), 3.0, "direction", 1, "holds"),  # kind overrides the paper's number
    # the kind forced to a tie whatever the number
    ((2.8, 3.2), 3.0, "tie", 1, "does not hold"),
]


@pytest.mark.parametrize("bounds, paper, kind, side, expected", VERDICT_TABLE)
def test_verdict_table(bounds, paper, kind, side, expected):
    assert stats.verdict(interval(*bounds), paper, kind=kind, side=side) == expected


@pytest.mark.parametrize("paper, kind", [(0.2, None), (2.0, None), (None, "direction"), (-2.0, None)])
def test_too_few_seeds_is_undetermined_and_no_seed_is_no_run(paper, kind):
    for n in (1, 2):  # even an interval that would hold
        assert stats.verdict(interval(1.9, 2.1, n=n), paper, kind=kind) == "undetermined"
    assert stats.verdict(interval(1.9, 2.1, n=3), paper, kind=kind, min_seeds=4) == "undetermined"
    assert stats.verdict(NO_RUN, paper, kind=kind) == "no run"
    one = stats.estimate({0: 2.0})  # one seed: no interval (NaN bounds)
    assert np.isnan(one.low) and stats.verdict(one, paper, kind=kind) == "undetermined"


def test_claim_kind_from_the_papers_number():
    assert [stats.claim_kind(p) for p in (0.0, 0.5, -0.5, 0.51, -3.0, None, float("nan"))] == \
        ["tie", "tie", "tie", "difference", "difference", "direction", "direction"]


# (interval, comparison): ``stats.comparison`` (A against B without a paper's number)
COMPARISON_TABLE = [((0.1, 0.9), "ahead"), ((-0.9, -0.1), "behind"), ((-0.4, 0.3), "equal within the margin"),
                    ((-0.5, 0.5), "equal within the margin"), ((-0.2, 0.9), "undetermined"),
                    ((-3.0, 3.0), "undetermined"), ((0.01, 0.3), "ahead")]  # ahead before equal within the margin


@pytest.mark.parametrize("bounds, expected", COMPARISON_TABLE)
def test_comparison_table(bounds, expected):
    assert stats.comparison(interval(*bounds)) == expected


def test_comparison_identical_few_seeds_and_no_seed():
    a = pd.Series({0: 70.0, 1: 71.0, 2: 72.0})
    assert stats.comparison(stats.paired(a, a.copy())) == "identical"
    assert stats.comparison(stats.paired(a, a - 3.0)) == "ahead"
    assert stats.comparison(stats.paired(a[:2], a[:2] - 3.0)) == "undetermined"  # 2 seeds, however clear
    assert stats.comparison(stats.paired(a[:1], a[:1] - 3.0)) == "undetermined"
    assert stats.comparison(stats.paired(a, pd.Series({5: 1.0}))) == "no paired seed"
    phrase = stats.comparison_phrase(a, a - 1.0, "A", "B")
    assert phrase == "A - B = +1.00 [+1.00, +1.00] (3 seeds): ahead"
    assert stats.comparison_phrase(a[:2], a[:2] - 1.0, "A", "B").endswith(": undetermined, fewer than 3 seeds")
    assert stats.comparison_phrase(a, pd.Series({5: 1.0}), "A", "B") == "A - B: no seed has both"


def test_direction_of_one_seed_is_a_description_beyond_or_within_the_margin():
    assert [stats.direction(d) for d in (0.6, -0.6, 0.5, -0.5, 0.0, float("nan"))] == \
        ["ahead", "behind", "within the margin", "within the margin", "within the margin", "no run"]
    assert stats.direction(0.6, margin=1.0) == "within the margin"
    one = stats.paired(pd.Series({0: 73.0}), pd.Series({0: 70.0}))  # 3 points at one seed: a direction, no verdict
    assert stats.direction(one.mean) == "ahead" and stats.comparison(one) == "undetermined"


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 10, 30])
def test_t_interval_equals_scipys(n):
    from scipy import stats as st

    values = np.random.default_rng(n).normal(1.0, 2.0, n)
    est = stats.estimate(values)
    low, high = st.t.interval(0.95, n - 1, loc=values.mean(), scale=st.sem(values))
    assert (est.low, est.high) == pytest.approx((low, high), rel=1e-12)
    assert est.half_width == pytest.approx((high - low) / 2)
    assert stats.t_half_width(values.std(ddof=1), n) == pytest.approx((high - low) / 2)
    low90, high90 = st.t.interval(0.9, n - 1, loc=values.mean(), scale=st.sem(values))
    assert (stats.estimate(values, confidence=0.9).low, stats.estimate(values, confidence=0.9).high) == \
        pytest.approx((low90, high90))


def test_t_half_width_on_arrays_is_nan_below_two_values():
    hw = stats.t_half_width(pd.Series([1.0, 1.0, 2.0]), pd.Series([1, 2, 5]))
    assert np.isnan(hw[0]) and hw[1] == pytest.approx(12.706204736 / np.sqrt(2), rel=1e-8) and \
        hw[2] == pytest.approx(2.776445105 * 2.0 / np.sqrt(5), rel=1e-8)
    assert np.isnan(stats.t_half_width(1.0, 1))


def test_paired_pairs_only_the_common_seeds_with_a_value():
    a = pd.Series({0: 3.0, 1: 5.0, 2: 9.0, 3: float("nan"), 4: 1.0})
    b = pd.Series({0: 1.0, 1: 2.0, 3: 0.0, 4: float("nan"), 7: 4.0})
    est = stats.paired(a, b)
    assert list(est.seeds) == [0, 1] and est.values == (2.0, 3.0) and est.mean == 2.5
    assert est.sd == pytest.approx(np.sqrt(0.5)) and est.n == 2
    assert est.text() == f"+2.50 [{est.low:+.2f}, {est.high:+.2f}] (2 seeds)"
    assert stats.paired(a, pd.Series({9: 1.0})).n == 0 and stats.paired(a, pd.Series({9: 1.0})).text() == \
        "no paired seed"
    assert stats.paired(a, b).signs() == (2, 0)


def test_identical_only_when_equal_at_every_seed():
    a = pd.Series({0: 70.0, 1: 71.0, 2: 72.0})
    assert stats.paired(a, a.copy()).identical
    assert not stats.paired(a, a + pd.Series({0: 0.0, 1: 0.0, 2: 0.3})).identical
    assert not stats.paired(a, a - 1.0).identical and not NO_RUN.identical
    row = stats.compare(a, a.copy(), 0.0)
    assert row["identical"] and row["verdict"] == "holds" and row["seeds"] == 3


# the former rule's verdicts, computed with ``fidelity.verdict`` as committed before the statistics rule replaced
# it (git show adb0f12:studies/fidelity.py): (ours, paper, factor, verdict)
FORMER = [(2.0, 2.3, 3.0, "holds"), (0.3, 0.1, 3.0, "holds"), (5.0, 2.0, 3.0, "holds"),
          (7.0, 2.0, 3.0, "direction only"), (0.2, 2.0, 3.0, "does not hold"), (-1.0, 2.0, 3.0, "does not hold"),
          (-0.6, 0.2, 3.0, "does not hold"), (0.7, 0.0, 3.0, "does not hold"), (float("nan"), 1.0, 3.0, "no run"),
          (10.0, 1.0, None, "holds"), (-3.0, -1.0, 3.0, "holds"), (1.4, 0.3, 3.0, "does not hold"),
          (0.53, 0.47, 3.0, "holds"), (30.0, 1.5, None, "holds")]


@pytest.mark.parametrize("ours, paper, factor, expected", FORMER)
def test_former_verdict_reproduces_the_old_rule(ours, paper, factor, expected):
    assert stats.former_verdict(ours, paper, factor=factor) == expected


def test_chance_caveat_within_twice_chance():
    assert stats.near_chance(20.0, 10.0) and not stats.near_chance(20.1, 10.0)
    assert stats.chance_caveat("FedAvg", 30.0, 10.0) == ""
    caveat = stats.chance_caveat("FedAvg", 18.0, 10.0)
    assert caveat.startswith("Caveat: FedAvg (18.0%) is within 2x chance (10%)") and caveat.endswith(".")


def test_mean_table_and_paired_table():
    rows = pd.DataFrame({"method": ["a"] * 3 + ["b"] * 3, "seed": [0, 1, 2] * 2,
                         "accuracy": [60.0, 62.0, 64.0, 59.0, 61.5, 63.0]})
    table = stats.mean_table(rows, ["method"], "accuracy")
    assert table.loc["a", "mean"] == 62.0 and table.loc["a", "seeds"] == 3
    assert table.loc["a", "high"] - table.loc["a", "mean"] == pytest.approx(stats.t_half_width(2.0, 3))
    wide = rows.pivot_table(index="seed", columns="method", values="accuracy")
    out = stats.paired_table(wide, "a", ["b", "missing"]).iloc[0]
    est = stats.paired(wide["a"], wide["b"])
    assert (out["versus"], out["gain"], out["low"], out["seeds"]) == ("b", est.mean, est.low, 3)
    assert out["comparison"] == stats.comparison(est) == "ahead"
    grouped = stats.paired_table(pd.concat({"x": wide, "y": wide.assign(b=wide["a"])}, names=["cell"]), "a", ["b"],
                                 by="cell").set_index("cell")
    assert grouped.loc["x", "comparison"] == "ahead" and grouped.loc["y", "comparison"] == "identical"


def test_count_by_class_sets_identical_rows_apart():
    table = pd.DataFrame({"cell class": ["paper protocol", "paper protocol", "post hoc", "paper protocol"],
                          "verdict": ["holds", "holds", "holds", "undetermined"],
                          "identical": [True, False, False, False]})
    counts = stats.count_by_class(table)
    assert list(counts.index) == ["paper protocol", "post hoc"]
    assert counts.loc["paper protocol", "holds"] == 1 and counts.loc["paper protocol", "by construction"] == 1
    assert counts.loc["post hoc", "holds"] == 1 and counts.loc["paper protocol", "undetermined"] == 1
