"""pFedBBN's temperature / distance-scale study: the variants, the held-out selection rule and the claims rows."""
from __future__ import annotations

import pandas as pd
import pytest

from ftta_core.variants import Variant, with_factors
from studies.pfedbbn.temperature import (HELD_OUT_SEED, choice_check, choice_check_reading, choice_reading,
                                           checked_claims, flipped_choices, curve, pfedbbn_claims, reference_variants,
                                           select_setting, settings_of, source_gains, source_gains_reading,
                                           setting_name, temperature_variants)

VARIANTS = {**temperature_variants(), **reference_variants()}  # the study's grid: its settings' T and scale


def test_the_default_setting_is_stored_as_the_default():
    v = temperature_variants([1.0, 4.0], ["none", "row_median"])
    assert v[setting_name(1.0, "none")]["strategy_params"] == {}  # the Table 1 grid's pFedBBN run, found by hash
    assert v[setting_name(4.0, "row_median")]["strategy_params"] == {"temperature": 4.0, "scale": "row_median"}
    assert v[setting_name(1.0, "row_median")]["strategy_params"] == {"scale": "row_median"}
    assert dict(v[setting_name(1.0, "none")]) == {"strategy": "pfedbbn", "strategy_params": {}}
    assert v[setting_name(1.0, "none")].factors == {"T": 1.0, "scale": "none"}  # the defaults too, as factors
    assert settings_of({**v, **reference_variants()}) == list(v)  # the references have no T


def _rows(values, scale="none"):
    """Held-out rows (alpha, T, same-domain share, accuracy) of the settings at ``scale``, without their factors."""
    return pd.DataFrame([{"alpha": a, "variant": setting_name(t, scale), "seed": HELD_OUT_SEED, "accuracy": acc,
                          "self": 1 - s, "same domain": s, "other domains": 0.0, "uniform same-domain": 0.2}
                         for a, t, s, acc in values])


def _grid(rows, variants=VARIANTS):
    """``rows`` as ``temperature_grid`` has them: each variant's factors ("T", "scale") as columns."""
    return with_factors(pd.DataFrame(rows).reset_index(drop=True), variants)


def _held_out(values):
    return _grid(_rows(values))


def test_rule_takes_the_largest_same_domain_share_and_never_reads_accuracy():
    raw = _rows([(0.1, 1, 0.10, 99.0), (0.1, 4, 0.40, 10.0), (0.1, 8, 0.40, 50.0), (0.01, 2, 0.3, 70.0)])
    chosen = select_setting(_grid(pd.concat([raw, raw.assign(variant="BBN alone", **{"same domain": 0.9})])))
    assert chosen.set_index("alpha")["variant"].to_dict() == {0.1: setting_name(4, "none"),  # tie -> smaller T
                                                              0.01: setting_name(2, "none")}
    by = chosen.set_index("alpha")
    assert by.loc[0.1, "runner-up"] == setting_name(8, "none") and by.loc[0.1, "margin"] == 0.0
    assert pd.isna(by.loc[0.01, "runner-up"]) and pd.isna(by.loc[0.01, "margin"])  # one setting: no runner-up
    assert (by.loc[0.1, "T"], by.loc[0.1, "runner-up T"]) == (4.0, 8.0)  # carried from the rows, for the tie-break
    assert choice_reading(chosen).splitlines()[1] == (
        "- alpha 0.1: T=4, scale=none (same-domain share 0.400, uniform 0.200, self-weight 0.600; runner-up "
        "T=8, scale=none by 0.000).")


def test_the_choice_is_checked_on_a_second_held_out_stream():
    chosen = select_setting(_held_out([(0.1, 1, 0.31, 0.0), (0.1, 2, 0.30, 0.0), (0.1, 4, 0.2, 0.0),
                                       (0.01, 2, 0.25, 0.0), (0.01, 4, 0.2, 0.0)]))
    second = _held_out([(0.1, 1, 0.28, 0.0), (0.1, 2, 0.29, 0.0), (0.01, 2, 0.2, 0.0)])  # alpha 0.01: T=4 not run
    check = choice_check(chosen, second).set_index("alpha")
    assert list(check.index) == [0.1] and not check.loc[0.1, "same choice"]
    assert check.loc[0.1, "margin (second stream)"] == pytest.approx(-0.01)
    assert choice_check_reading(check.reset_index(), seed=7) == (
        "- alpha 0.1, second held-out stream (seed 7): T=1, scale=none 0.280 against T=2, scale=none 0.290 (margin "
        "-0.010; on the rule's stream +0.010): the rule would choose T=2, scale=none there.")
    assert "No alpha" in choice_check_reading(choice_check(chosen, second.iloc[:0]))
    flipped = flipped_choices(chosen, check.reset_index())
    assert flipped[["alpha", "variant"]].values.tolist() == [[0.1, setting_name(2, "none")]]
    assert flipped_choices(chosen, choice_check(chosen, second.iloc[:0])).empty
    tied = _held_out([(0.1, 1, 0.30, 0.0), (0.1, 2, 0.30, 0.0)])  # equal shares: the rule's smaller T keeps it
    assert choice_check(chosen, tied)["same choice"].tolist() == [True]
    tied_up = select_setting(_held_out([(0.1, 4, 0.31, 0.0), (0.1, 2, 0.30, 0.0)]))  # chosen T=4, runner-up T=2
    assert choice_check(tied_up, _held_out([(0.1, 4, 0.3, 0.0), (0.1, 2, 0.3, 0.0)]))["same choice"].tolist() == [False]


def test_claims_pair_seeds_and_read_the_papers_table():
    from ftta_core import stats

    name = setting_name(4, "none")
    rows = []
    for seed in (0, 1, 2):
        rows += [{"alpha": 0.1, "variant": name, "seed": seed, "accuracy": 60.0 + seed + 0.1 * (seed == 1),
                  "same domain": 0.5 + 0.01 * seed, "uniform same-domain": 0.2},
                 {"alpha": 0.1, "variant": "BBN alone", "seed": seed, "accuracy": 58.0 + seed},
                 {"alpha": 0.1, "variant": "FedAvg + BBN", "seed": seed, "accuracy": 62.0 + seed}]
    claims = pfedbbn_claims(pd.DataFrame(rows), pd.DataFrame([{"alpha": 0.1, "variant": name}]))
    by = {c["claim"]: c for c in claims}
    bbn, fedavg = by["pFedBBN above BBN alone, alpha 0.1"], by["pFedBBN above FedAvg + BBN, alpha 0.1"]
    assert bbn["paper"] == pytest.approx(72.41 - 56.88)  # pFedBBN Table 1, CIFAR-10-C, first Non-IID column
    # about +2.03 [+1.89, +2.18]: above 0 on the paper's side, far under its +15.53 (stats.verdict)
    assert (bbn["seeds"], bbn["verdict"]) == (3, "direction only") and bbn["low"] > 0
    assert bbn["cell class"] == "rule-chosen (pre-registered)" and bbn["cell class"] in stats.CELL_CLASSES
    clusters = by["pFedBBN's W clusters by domain (same-domain share minus uniform, in points), alpha 0.1"]
    assert clusters["verdict"] == "holds"  # a direction claim: the interval above 0, however far above uniform
    assert clusters["ours"] == pytest.approx(31.0) and clusters["cell class"] == "post hoc"
    assert fedavg["verdict"] == "does not hold"  # below FedAvg + BBN at every seed, the paper above it
    assert "(chosen by the held-out rule)" in bbn["settled by"] and bbn["settled by"].endswith("seeds [0, 1, 2]")
    other = pfedbbn_claims(pd.DataFrame(rows), pd.DataFrame([{"alpha": 0.1, "variant": name}]), how="the runner-up")
    assert all("(the runner-up)" in c["settled by"] for c in other)
    chosen = select_setting(_held_out([(0.1, 4, 0.5, 0.0), (0.1, 8, 0.4, 0.0)]))  # runner-up: T=8
    assert chosen["runner-up"].tolist() == [setting_name(8, "none")]
    assert pd.DataFrame(checked_claims(pd.DataFrame(rows), chosen, pd.DataFrame())).equals(pd.DataFrame(claims))
    flipped = pd.DataFrame([{"alpha": 0.1, "same choice": False}])
    both = checked_claims(pd.DataFrame(rows), chosen, flipped)
    assert len(both) == 2 * len(claims) and {c["cell class"] for c in both[len(claims):]} == {"post hoc"}
    # under 3 paired seeds nothing holds or fails: undetermined
    two = pfedbbn_claims(pd.DataFrame(rows).query("seed < 2"), pd.DataFrame([{"alpha": 0.1, "variant": name}]))
    assert {c["verdict"] for c in two} == {"undetermined"}


def test_curve_averages_seeds():
    g = pd.DataFrame([{"alpha": 0.1, "variant": "x", "seed": s, "accuracy": a, "self": 0.5, "same domain": 0.3,
                       "other domains": 0.2, "uniform same-domain": 0.1} for s, a in ((0, 60.0), (1, 62.0))])
    row = curve(g).iloc[0]
    assert (row["accuracy"], row["seeds"]) == (61.0, 2) and row["accuracy sd"] == pytest.approx(1.4142, abs=1e-4)


def test_rule_makes_no_choice_until_every_setting_has_its_held_out_run():
    held = _held_out([(0.1, 1, 0.10, 99.0), (0.1, 2, 0.40, 10.0), (0.01, 1, 0.3, 70.0), (0.01, 2, 0.2, 70.0),
                      (0.01, 4, 0.1, 70.0)])
    settings = [setting_name(t, "none") for t in (1, 2, 4)]
    chosen = select_setting(held, settings).set_index("alpha")
    assert pd.isna(chosen.loc[0.1, "variant"]) and chosen.loc[0.1, "held-out runs"] == "2 of 3"
    assert chosen.loc[0.01, "variant"] == setting_name(1, "none") and chosen.loc[0.01, "held-out runs"] == "3 of 3"
    rows = [{"alpha": 0.1, "variant": setting_name(2, "none"), "seed": 0, "accuracy": 60.0, "same domain": 0.5,
             "uniform same-domain": 0.2}, {"alpha": 0.1, "variant": "BBN alone", "seed": 0, "accuracy": 58.0},
            {"alpha": 0.1, "variant": "FedAvg + BBN", "seed": 0, "accuracy": 59.0}]
    claims = pfedbbn_claims(pd.DataFrame(rows), chosen.reset_index())
    assert claims and not [c for c in claims if c["claim"].endswith("alpha 0.1")]  # no choice at alpha 0.1: no claim


def _store(folder, base, alpha, variant, seed, accuracy, same, max_steps=None):
    """A stored summary of ``variant`` (a ``Variant``: its overrides) on the study's protocol at ``alpha``."""
    from ftta_core.runstore import store_summary
    from ftta_core.workbook import config_key
    from studies.pfedbbn.temperature import bbn_base

    cfg = variant.config(bbn_base(base, alpha, max_steps), seed=seed)
    store_summary(folder / f"{config_key(cfg)}.json",
                  {"accuracy": accuracy, "config": cfg.to_dict(),
                   "weight_shares": {"self": 0.3, "same domain": same, "other domains": 0.7 - same,
                                     "uniform same-domain": 0.16}})


def test_a_settings_t_and_scale_come_from_its_factors_not_its_name(tmp_path):
    """A grid's T and scale are its variants' factors: a name that says nothing (or says otherwise) changes nothing."""
    from studies.pfedbbn.imbalance import pfedbbn_config
    from studies.pfedbbn.temperature import temperature_grid

    base = pfedbbn_config(dataset="cifar10")
    favourite = temperature_variants([4.0], ["row_median"])[setting_name(4.0, "row_median")]
    variants = {"my favourite": favourite, "T=1, scale=none": Variant(favourite.overrides, {"T": 8.0, "scale": "x"}),
                **reference_variants()}
    for name in ("my favourite", "BBN alone"):
        _store(tmp_path, base, 0.1, variants[name], 0, 60.0, 0.3)
    grid = temperature_grid(base, [0], [0.1], variants, tmp_path, only_cached=True, also_read=())
    by = grid.set_index("variant")
    assert by.loc["my favourite", "T"] == 4.0 and by.loc["my favourite", "scale"] == "row_median"
    assert by.loc["T=1, scale=none", "T"] == 8.0  # the same stored run, read under a name that lies: its factors win
    assert pd.isna(by.loc["BBN alone", "T"]) and by.loc["BBN alone", "same domain"] == 0.3
    assert list(grid.columns[:4]) == ["alpha", "variant", "T", "scale"]
    # the rule's tie-break reads the factor: "zeta" (T = 2) beats the name "T=1, scale=none" (T = 8) at equal shares
    named = {"T=1, scale=none": Variant({}, {"T": 8.0, "scale": "none"}),  # first: row order does not decide
             "zeta": Variant({}, {"T": 2.0, "scale": "none"})}
    held = _grid([{"alpha": 0.1, "variant": v, "seed": HELD_OUT_SEED, "same domain": 0.3, "uniform same-domain": 0.2,
                   "self": 0.5} for v in named], named)
    chosen = select_setting(held, list(named)).iloc[0]
    assert (chosen["variant"], chosen["runner-up"], chosen["runner-up T"]) == ("zeta", "T=1, scale=none", 8.0)


def test_stored_claims_read_each_alpha_whose_held_out_runs_are_complete(tmp_path):
    """The claims of an alpha are read as soon as its ten held-out runs are stored, whatever the other alpha lacks."""
    from studies.pfedbbn.imbalance import pfedbbn_config
    from studies.pfedbbn.temperature import HELD_OUT_STEPS, stored_claims

    base = pfedbbn_config(dataset="cifar10")
    study, grid = tmp_path / "temperature", tmp_path / "grid"

    def store(folder, alpha, variant, seed, accuracy, same, max_steps=None):
        _store(folder, base, alpha, variant, seed, accuracy, same, max_steps)

    variants = temperature_variants()
    for k, (name, variant) in enumerate(variants.items()):
        store(study, 0.01, variant, HELD_OUT_SEED, 50.0, 0.30 if name == setting_name(2, "none") else 0.1 + k / 100,
              HELD_OUT_STEPS)
    store(study, 0.1, variants[setting_name(1, "none")], HELD_OUT_SEED, 50.0, 0.2, HELD_OUT_STEPS)  # 1 of 10
    store(study, 0.01, variants[setting_name(2, "none")], 0, 68.0, 0.26)
    refs = reference_variants()
    store(grid, 0.01, refs["BBN alone"], 0, 64.0, 0.0)
    store(grid, 0.01, refs["FedAvg + BBN"], 0, 67.0, 0.0)
    rows = {r["claim"]: r for r in stored_claims(study, grid)}
    assert set(rows) == {"pFedBBN above BBN alone, alpha 0.01", "pFedBBN above FedAvg + BBN, alpha 0.01",
                         "pFedBBN's W clusters by domain (same-domain share minus uniform, in points), alpha 0.01"}
    assert rows["pFedBBN above BBN alone, alpha 0.01"]["ours"] == pytest.approx(4.0)
    assert stored_claims(tmp_path / "empty", grid) == []


def test_source_gains_split_the_margin_between_pfedbbn_and_its_reference():
    name = setting_name(2, "none")
    rows = []
    for seed in (0, 1):
        rows += [{"alpha": 0.01, "variant": name, "seed": seed, "accuracy": 66.0, "accuracy_source": 62.0},
                 {"alpha": 0.01, "variant": "BBN alone", "seed": seed, "accuracy": 64.0, "accuracy_source": 62.0},
                 {"alpha": 0.01, "variant": "FedAvg + BBN", "seed": seed, "accuracy": 65.0, "accuracy_source": 62.0}]
    rows.append({"alpha": 0.01, "variant": name, "seed": 2, "accuracy": 99.0, "accuracy_source": 1.0})  # unpaired
    gains = source_gains(pd.DataFrame(rows), pd.DataFrame([{"alpha": 0.01, "variant": name}]))
    by = gains.set_index("row")
    assert by.loc["source model", "ours"] == 62.0 and by.loc["source model", "paper"] == 58.58
    assert by.loc["BBN alone - source", "ours"] == 2.0
    assert by.loc["BBN alone - source", "paper"] == pytest.approx(52.33 - 58.58)  # paper Table 1, third column
    assert by.loc[f"pFedBBN {name} - source", "ours"] == 4.0 and (gains["seeds"] == 2).all()
    reading = source_gains_reading(gains)
    paper_margin = 71.96 - 52.33
    assert f"margin is {2.0 - paper_margin:+.2f} from the paper's" in reading
    assert source_gains(pd.DataFrame(rows), pd.DataFrame([{"alpha": 0.01, "variant": None}])).empty


def test_pooled_rule_averages_the_held_out_alphas_and_waits_for_every_run():
    from studies.pfedbbn.temperature import pooled_shares

    settings = [setting_name(t, "none") for t in (1, 2, 4)]
    held = _held_out([(0.1, 1, 0.31, 0.0), (0.1, 2, 0.30, 0.0), (0.1, 4, 0.2, 0.0),
                      (0.01, 1, 0.10, 0.0), (0.01, 2, 0.26, 0.0), (0.01, 4, 0.2, 0.0)])
    pooled = pooled_shares(held, settings)
    assert list(pooled.index) == [setting_name(2, "none"), setting_name(1, "none"), setting_name(4, "none")]
    assert pooled.loc[setting_name(2, "none"), "mean"] == pytest.approx(0.28)
    assert list(pooled.columns) == ["alpha 0.1", "alpha 0.01", "mean"]
    tied = _held_out([(0.1, 4, 0.3, 0.0), (0.1, 2, 0.3, 0.0), (0.01, 4, 0.2, 0.0), (0.01, 2, 0.2, 0.0)])
    assert pooled_shares(tied, [setting_name(t, "none") for t in (2, 4)]).index[0] == setting_name(2, "none")
    assert pooled_shares(held[held["variant"] != setting_name(4, "none")], settings).empty  # T=4 could have won
    assert pooled_shares(held[held["alpha"] == 0.1], settings).empty  # alpha 0.01 not run


def test_whole_grid_claims_read_every_column_against_the_best_other_cell():
    from studies.pfedbbn.temperature import whole_grid_claims

    name = setting_name(2, "none")
    reported, grid = [], []
    for alpha in (None, 0.1):
        for seed in (0, 1):
            reported += [{"alpha": alpha, "variant": name, "seed": seed, "accuracy": 70.0 + seed,
                          "same domain": 0.3, "uniform same-domain": 0.16},
                         {"alpha": alpha, "variant": "BBN alone", "seed": seed, "accuracy": 69.0},
                         {"alpha": alpha, "variant": "FedAvg + BBN", "seed": seed, "accuracy": 68.0}]
        grid += [{"alpha": alpha, "seed": 0, "method": "tent", "strategy": "fedavg", "accuracy": 71.0},
                 {"alpha": alpha, "seed": 0, "method": "bbn", "strategy": "local", "accuracy": 69.0},
                 {"alpha": alpha, "seed": 0, "method": "bbn", "strategy": "pfedbbn", "accuracy": 99.0}]  # not "other"
    rows = {r["claim"]: r for r in whole_grid_claims(pd.DataFrame(reported), pd.DataFrame(grid), name,
                                                     read_alphas=(None, 0.1), skip=(0.1,))}
    best = "pFedBBN minus the best other method x server of Table 1 (best or near-best under skew), "
    assert rows[best + "IID"]["ours"] == pytest.approx(-1.0) and rows[best + "IID"]["seeds"] == 1  # seed 0 only
    assert rows[best + "IID"]["paper"] == pytest.approx(70.11 - 81.95)  # the paper's IID column: FedAvgM + CoTTA
    assert "Tent + FedAvg on average" in rows[best + "alpha 0.1"]["settled by"]
    assert rows["pFedBBN above BBN alone, IID"]["ours"] == pytest.approx(1.5)
    assert "pFedBBN above BBN alone, alpha 0.1" not in rows  # that alpha's own choice is read elsewhere


def test_curve_figure_also_reads_the_curve_on_the_seeds_every_t_has():
    """T = 1 at seeds 0-1 and T = 2 at seed 0 only: besides the means, a line over seed 0 alone."""
    import matplotlib
    matplotlib.use("Agg")
    from studies.pfedbbn.temperature import curve_figure

    rows = [(1, 0, 60.0), (1, 1, 70.0), (2, 0, 62.0)]
    grid = _grid([{"alpha": 0.1, "variant": setting_name(t, "none"), "seed": s, "accuracy": a, "self": 0.5,
                   "same domain": 0.3, "uniform same-domain": 0.2} for t, s, a in rows])
    top = curve_figure(grid).axes[0]
    common = [line for line in top.get_lines() if line.get_marker() == "x"]
    assert len(common) == 1 and list(common[0].get_ydata()) == [60.0, 62.0]
    assert "mean over seed 0, which every T has" in common[0].get_label()
    full = grid[grid["variant"] == setting_name(1, "none")]
    assert not [line for line in curve_figure(full).axes[0].get_lines() if line.get_marker() == "x"]
