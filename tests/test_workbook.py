"""Workbook helpers that turn stored runs into the papers' table shapes."""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from ftta_core.experiment import ExperimentConfig
from ftta_core.scenarios import CASE_STUDY_GROUPS
from studies.fedtsa.case_study import case_study_table
from ftta_core.workbook import (group_weight_shares, heterogeneity_sweep, markdown_table, over_seeds, run_grid,
                                StoredRun, strategy_comparison)


def test_group_weight_shares_split_each_row_of_w():
    w = np.zeros((2, 10, 10))
    w[:, :4, :4] = 0.25  # group 1 averages within itself
    w[:, 4:, 4:] = np.eye(6)  # the others keep their own model
    shares = group_weight_shares(w)
    assert np.allclose(shares.loc["clients 1-4", ["self", "own group (others)"]], [0.25, 0.75])
    assert np.allclose(shares.loc["clients 5-7", "self"], 1.0)
    assert np.allclose(shares.fillna(0).sum(axis=1), 1.0)


def test_case_study_table_weights_slots_by_predictions():
    rows = [{"slot": s, "client": c, "domain": "d", "n": 10, "accuracy_mixed": 100.0 * (c < 4)}
            for s in range(2) for c in range(10)]
    run = StoredRun({}, np.zeros((1, 10, 10)), pd.DataFrame(rows))
    table = case_study_table({"fedavg": run})
    assert table.loc[("clients 1-4", "fedavg"), "mean"] == 100.0
    assert table.loc[("clients 8-10", "fedavg"), 0] == 0.0
    assert table.loc[("all clients", "fedavg"), "mean"] == 40.0
    assert len(CASE_STUDY_GROUPS) == 3
    assert markdown_table(table).count("\n") == len(table) + 2


def test_per_domain_table_averages_seeds_and_keeps_one_source_row_per_seed():
    from ftta_core.workbook import per_domain_table

    def summary(acc, src):
        return {"accuracy": acc, "accuracy_local": acc, "accuracy_source": src,
                "accuracy_by_domain": {"mixed": {"fog": acc, "snow": acc}, "local": {"fog": acc, "snow": acc},
                                       "source": {"fog": src, "snow": src}}}

    summaries = {("fedavg", 0): summary(60.0, 30.0), ("fedavg", 1): summary(70.0, 40.0),
                 ("local", 0): summary(50.0, 30.0), ("old", 0): {"accuracy": 1.0}}
    table = per_domain_table(summaries)
    assert list(table.columns) == ["fog", "snow", "mean", "seeds"]
    assert table.loc["fedavg", "fog"] == 65.0 and table.loc["fedavg", "seeds"] == 2
    assert table.loc["No-Adapt", "mean"] == 35.0 and table.loc["No-Adapt", "seeds"] == 2
    assert "old" not in table.index


def test_cache_key_ignores_only_the_fields_a_scenario_does_not_read():
    import dataclasses

    from ftta_core.experiment import ExperimentConfig
    from ftta_core.workbook import config_key

    fixed = ExperimentConfig(scenario="fedtsa_niid")
    assert config_key(fixed) == config_key(dataclasses.replace(fixed, th=0.5, sh=0.9, n_steps=7))
    assert config_key(fixed) != config_key(dataclasses.replace(fixed, slot_steps=25))
    free = ExperimentConfig(scenario="heterogeneity")
    assert config_key(free) != config_key(dataclasses.replace(free, th=0.5))


def test_over_seeds_averages_clients_within_a_seed_then_seeds():
    table = pd.DataFrame({"k": [3, 3, 3, 3, 5, 5, 5, 5], "selection": ["random"] * 8, "seed": [0, 0, 1, 1] * 2,
                          "client": ["a", "b"] * 4, "accuracy": [10.0, 20.0, 30.0, 40.0, 50.0, 50.0, 60.0, 60.0]})
    cells, per_seed = over_seeds(table, ["k", "selection"])
    # k=3: seed means 15 and 35 -> mean 25, std (ddof 1) 14.14; k=5: 50 and 60 -> 55 +- 7.07
    assert cells.loc[3, "random"] == "25.00 ± 14.14" and cells.loc[5, "random"] == "55.00 ± 7.07"
    assert per_seed.accuracy.tolist() == [15.0, 35.0, 50.0, 60.0]


def test_format_mean_std_marks_missing_cells():
    from ftta_core.workbook import format_mean_std
    table = pd.DataFrame({"mean": [1.234, float("nan")], "std": [0.5, 0.0]}, index=["a", "b"])
    assert format_mean_std(table).tolist() == ["1.23 ± 0.50", "–"]


def test_over_seeds_with_one_grouping_column_keeps_a_column_of_cells():
    table = pd.DataFrame({"k": [3, 3, 5, 5], "seed": [0, 1, 0, 1], "accuracy": [10.0, 20.0, 30.0, 30.0]})
    cells, _ = over_seeds(table, ["k"])
    assert cells["accuracy"].tolist() == ["15.00 ± 7.07", "30.00 ± 0.00"]


SWEEP_BASE = ExperimentConfig(dataset="embedded_digits", scenario="fedtsa_niid", clients=4, batch_size=5,
                              images_per_client=10, corruptions=["fog", "contrast", "frost", "glass_blur"],
                              local="bn", device="cpu", max_steps=3)


def test_heterogeneity_sweep_gives_each_point_the_accuracies_of_separate_runs(tmp_path):
    """The sweep (one shared TTA-bn pass per point) stores and returns exactly what separate runs give, per point."""
    sweep = heterogeneity_sweep(SWEEP_BASE, "sh", [0.25, 0.5], {"th": 0.2}, ["local", "fedavg"], [0],
                                results_dir=tmp_path)
    assert sorted(zip(sweep["sh"], sweep["variant"])) == [(0.25, "fedavg"), (0.25, "local"), (0.5, "fedavg"),
                                                          (0.5, "local")]
    for sh in (0.25, 0.5):
        cfg = dataclasses.replace(SWEEP_BASE, scenario="heterogeneity", sh=sh, th=0.2)
        separate = run_grid(cfg, {s: {"strategy": s} for s in ("local", "fedavg")}, [0], progress=False)
        got = sweep[sweep.sh == sh].set_index("variant")["accuracy"]
        assert separate.set_index("variant")["accuracy"].to_dict() == got.to_dict()
    again = heterogeneity_sweep(SWEEP_BASE, "sh", [0.25, 0.5], {"th": 0.2}, ["local", "fedavg"], [0],
                                results_dir=tmp_path, only_cached=True)
    assert again["accuracy"].tolist() == sweep["accuracy"].tolist()


def test_heterogeneity_sweep_rejects_an_unknown_field():
    with pytest.raises(ValueError, match="field must be 'sh' or 'th'"):
        heterogeneity_sweep(SWEEP_BASE, "clusters", [1], {}, ["local"], [0])


def test_strategy_comparison_runs_a_stateful_local_method_one_run_per_strategy(tmp_path):
    cfg = dataclasses.replace(SWEEP_BASE, local="tent")
    table = strategy_comparison(cfg, ["local", "fedavg"], [0], results_dir=tmp_path)
    direct = run_grid(cfg, {s: {"strategy": s} for s in ("local", "fedavg")}, [0], progress=False)
    assert table["accuracy"].tolist() == direct["accuracy"].tolist()
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_stateless_tta_bn_strategies_cannot_see_temporal_heterogeneity():
    """Notebook 20's Fig. 2 finding: when a slot length divides the steps per corruption, a shorter slot only
    reorders the same per-step batches (and the corruptions clusters meet at a step), so Local, FedAvg and FedAMP,
    which carry nothing between steps under TTA-bn, give the same accuracy; pFedGraph, which keeps state, does not."""
    base = dataclasses.replace(SWEEP_BASE, images_per_client=20, max_steps=None)  # 4 steps per corruption
    sweep = heterogeneity_sweep(base, "th", [0.25, 0.5], {"sh": 0.5}, ["local", "fedavg", "fedamp", "pfedgraph"], [0])
    by_th = sweep.pivot(index="variant", columns="th", values="accuracy")
    for stateless in ("local", "fedavg", "fedamp"):
        assert by_th.loc[stateless, 0.25] == by_th.loc[stateless, 0.5]
    assert by_th.loc["pfedgraph", 0.25] != by_th.loc["pfedgraph", 0.5]


def test_cache_key_leaves_out_strategy_params_at_the_strategys_defaults():
    """A sweep naming FedTSA's default window (10) or lambda (1) finds the run stored with no parameters; any other
    value, and an explicit seed (the run's seed fills it otherwise), is a different run."""
    import dataclasses

    from ftta_core.experiment import ExperimentConfig, explicit_strategy_params
    from ftta_core.workbook import config_key

    base = ExperimentConfig(scenario="fedtsa_niid", strategy="fedtsa")
    for same in ({"window": 10}, {"lam": 1}, {"lam": 1.0, "window": 10, "augmentation": "bernoulli"}):
        assert config_key(dataclasses.replace(base, strategy_params=same)) == config_key(base)
    for other in ({"window": 5}, {"lam": 0.0}, {"seed": 0}, {"bias": 0}):
        assert config_key(dataclasses.replace(base, strategy_params=other)) != config_key(base)
    assert explicit_strategy_params("fedtsa", {"window": 10, "lam": 2.0}) == {"lam": 2.0}
    assert explicit_strategy_params("no-such-strategy", {"window": 10}) == {"window": 10}


def test_run_grid_reads_runs_stored_in_also_read_folders_and_never_writes_there(tmp_path):
    import json

    from ftta_core.experiment import ExperimentConfig
    from ftta_core.workbook import config_key, run_grid

    base = ExperimentConfig(scenario="fedtsa_niid", strategy="fedavg")
    elsewhere, here = tmp_path / "table1", tmp_path / "ablations"
    elsewhere.mkdir()
    here.mkdir()
    stored = dict(accuracy=61.5, config=base.to_dict())
    (elsewhere / f"{config_key(base)}.json").write_text(json.dumps(stored))
    variants = {"FedAvg": {"strategy": "fedavg"}, "Local": {"strategy": "local"}}
    table = run_grid(base, variants, [0], results_dir=here, only_cached=True, progress=False,
                     also_read=[elsewhere])
    assert table.variant.tolist() == ["FedAvg"] and table.accuracy.tolist() == [61.5]
    assert not any(here.iterdir())
    assert run_grid(base, variants, [0], results_dir=here, only_cached=True, progress=False).empty


def test_sweep_reading_counts_wins_margins_and_gaps():
    from studies.readings import sweep_reading

    rows = [("fedtsa", 0.05, 70.0), ("fedavg", 0.05, 72.0), ("fedtsa", 0.2, 71.0), ("fedavg", 0.2, 69.5),
            ("fedtsa", 0.5, 68.0), ("fedavg", 0.5, 66.0), ("fedtsa", 0.75, 66.0)]
    table = pd.DataFrame([{"variant": v, "sh": x, "seed": 0, "accuracy": a} for v, x, a in rows])
    text = sweep_reading(table, "sh", "fedtsa", {"fedtsa": "FedTSA", "fedavg": "FedAvg"})
    assert "FedTSA is best at 2 of 3 points" in text
    assert "from -2.00 to +2.00 points" in text
    assert "0.05 (FedAvg, 2.00 ahead)" in text
    assert "FedTSA 3.00, FedAvg 6.00" in text
    assert "stored at SH = 0.75" in text
    assert "No stored runs" in sweep_reading(table.iloc[:0], "sh", "fedtsa")


def test_same_domain_weight_reads_only_the_chosen_steps_with_their_domains():
    import numpy as np

    from ftta_core.experiment import build_scenario
    from ftta_core.workbook import same_domain_weight

    cfg = ExperimentConfig(dataset="embedded_digits", scenario="case_study", clients=10, batch_size=10,
                           images_per_client=20, corruptions=["fog", "contrast", "frost", "glass_blur"])
    scenario = build_scenario(cfg)
    w = np.full((scenario.n_steps, 10, 10), 0.1)
    w[2:4] = np.eye(10)  # the chosen steps: every client keeps its own model
    kept = same_domain_weight(w, cfg, steps=slice(2, 4))
    assert np.allclose(kept["self"], 1.0) and np.allclose(kept["same domain"], 0.0)
    spread = same_domain_weight(w, cfg, steps=slice(0, 2))
    assert np.allclose(spread["same domain"], spread["uniform same-domain"])
    dom = scenario.domains_at(0)
    assert np.isclose(spread.loc[0, "uniform same-domain"], ((dom == dom[0]).sum() - 1) / 10)


def test_per_domain_table_seeds_column_counts_distinct_seeds_as_integers():
    from studies.paper import beside_per_corruption
    from ftta_core.workbook import per_domain_table

    def summary(acc, src):
        return {"accuracy": acc, "accuracy_local": acc, "accuracy_source": src,
                "accuracy_by_domain": {"mixed": {"fog": acc}, "local": {"fog": acc}, "source": {"fog": src}}}

    # runs of one seed made on different devices: source numbers that differ in the last digits
    summaries = {("fedavg", 0): summary(60.0, 30.0), ("fedtsa", 0): summary(61.0, 30.2),
                 ("fedavg", 1): summary(70.0, 40.0), ("fedtsa", 1): summary(71.0, 40.0),
                 ("local", 1): summary(50.0, 40.1)}
    table = per_domain_table(summaries)
    assert pd.api.types.is_integer_dtype(table["seeds"])
    assert table["seeds"].to_dict() == {"No-Adapt": 2, "fedavg": 2, "fedtsa": 2, "local": 1}
    # every seed weighs the same: seed 0's two source numbers are averaged before the mean over seeds
    assert np.isclose(table.loc["No-Adapt", "fog"], (30.1 + (40.0 + 40.0 + 40.1) / 3) / 2)
    side = beside_per_corruption(table, "fedtsa_table2")  # paper rows we lack keep the column integer
    assert pd.api.types.is_integer_dtype(side["seeds"]) and side.loc["FedAvg", "seeds"] == 2


def test_ordering_per_seed_values_and_common_seeds():
    from ftta_core.workbook import common_seeds, per_domain_table, per_seed_values
    from studies.readings import ordering_phrase

    assert ordering_phrase({"a": 1.0, "b": 3.0, "c": float("nan")}) == "b 3.00 > a 1.00"
    table = per_seed_values({("x", 0): {"accuracy": 1.0}, ("x", 1): {"accuracy": 2.0}, ("y", 1): {"accuracy": 5.0}})
    assert table.loc[1, "y"] == 5.0 and np.isnan(table.loc[0, "y"]) and list(table.index) == [0, 1]

    def summary(acc):
        return {"accuracy": acc, "accuracy_source": 30.0,
                "accuracy_by_domain": {"mixed": {"fog": acc}, "source": {"fog": 30.0}}}

    # seed 2's FedTSA run and a run without per-domain numbers are left out: both rows are over seeds 0 and 1
    summaries = {("fedavg", 0): summary(60.0), ("fedavg", 1): summary(70.0), ("fedavg", 3): {"accuracy": 1.0},
                 ("fedtsa", 0): summary(61.0), ("fedtsa", 1): summary(72.0), ("fedtsa", 2): summary(99.0)}
    kept = common_seeds(summaries)
    assert sorted(kept) == [("fedavg", 0), ("fedavg", 1), ("fedtsa", 0), ("fedtsa", 1)]
    rows = per_domain_table(kept)
    assert rows.loc["fedtsa", "mean"] - rows.loc["fedavg", "mean"] == 1.5  # the mean of the paired differences
    assert common_seeds({}) == {}


def test_case_study_reading_orders_methods_and_reads_the_slot_from_its_tables():
    from ftta_core.scenarios import CASE_STUDY_ALL
    from studies.fedtsa.case_study import case_study_reading

    table = pd.DataFrame({"mean": [70.0, 72.0, 71.0]},
                         index=pd.MultiIndex.from_tuples([(CASE_STUDY_ALL, "fedavg"), (CASE_STUDY_ALL, "fedtsa"),
                                                          (CASE_STUDY_ALL, "fedamp")], names=["group", "strategy"]))
    labels = {"fedavg": "FedAvg", "fedtsa": "FedTSA", "fedamp": "FedAMP"}
    groups = ["clients 1-4", "clients 5-7", "clients 8-10"]
    domains = pd.DataFrame({0: ["fog", "snow", "frost"], 1: ["snow", "frost", "snow"]}, index=groups)
    shares = pd.concat({"FedTSA": pd.DataFrame({"self": [0.2, 0.3, 0.2], "own group (others)": [0.3, 0.3, 0.2],
                                                "clients 1-4": [np.nan, 0.2, 0.4], "clients 5-7": [0.1, np.nan, 0.2],
                                                "clients 8-10": [0.4, 0.2, np.nan]}, index=groups)})
    same = pd.concat({"FedTSA": pd.DataFrame({"self": [0.5] * 10, "same domain": [0.25] * 10,
                                              "uniform same-domain": [0.5] * 10})})
    text = case_study_reading(table, shares, same, domains, {"FedTSA": 58.0, "FedAMP": 59.0}, 1, 10, [0], labels)
    assert "FedTSA 72.00 > FedAMP 71.00 > FedAvg 70.00" in text
    assert "our order is FedTSA > FedAMP and the paper's FedAMP > FedTSA (different)" in text
    assert "One seed" in text
    assert "FedTSA 0.50 (0.56), keeping 0.50 on itself" in text  # 0.25 / (1 - 0.5); 0.5 * 10 / 9
    assert "the same corruption (snow)" in text and "after seeing snow in slot 0" in text
    assert "clients 1-4 → clients 8-10 0.40" in text


def test_stored_grid_runs_record_how_w_splits(tmp_path):
    """Every stored grid run carries ``weight_shares``: Local keeps all weight on itself, FedAvg gives every peer 1/N
    (so its same-domain share is the uniform one)."""
    import json

    from ftta_core.workbook import config_key

    cfg = dataclasses.replace(SWEEP_BASE, scenario="heterogeneity", sh=0.5, th=0.2)
    run_grid(cfg, {s: {"strategy": s} for s in ("local", "fedavg")}, [0], results_dir=tmp_path, progress=False)
    shares = {s: json.loads((tmp_path / f"{config_key(dataclasses.replace(cfg, strategy=s))}.json").read_text())
              ["weight_shares"] for s in ("local", "fedavg")}
    assert shares["local"]["self"] == 1.0 and shares["local"]["same domain"] == 0.0
    n = cfg.clients
    assert shares["fedavg"]["self"] == pytest.approx(1 / n, abs=1e-5)
    assert shares["fedavg"]["same domain"] == pytest.approx(shares["fedavg"]["uniform same-domain"], abs=1e-5)
