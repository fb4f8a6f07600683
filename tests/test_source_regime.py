"""Our source models' per-corruption profile beside FedTSA's No-Adapt row: ratios, rank correlation, nearest model."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from studies.fedtsa.source_regime import (PAPER_LABEL, paper_profile, regime_reading, regime_summary,
                                            regime_table)


def _card(folder, name, clean, per_corruption, epochs):
    (folder / f"{name}.json").write_text(json.dumps({
        "clean_test_accuracy": clean, "corrupted_accuracy_severity5": per_corruption, "epochs": epochs}))


def test_a_scaled_profile_and_a_reshuffled_one_are_told_apart(tmp_path):
    paper = paper_profile()
    assert len(paper) == 15 and paper["gaussian_noise"] == pytest.approx(37.30)
    _card(tmp_path, "twice", 90.0, (2 * paper).to_dict(), 15)  # the paper's profile at twice the level
    reversed_ = dict(zip(paper.index, sorted(paper.values)))  # the same values in another order
    _card(tmp_path, "shuffled", 50.0, reversed_, 1)
    s = regime_summary(["twice", "shuffled"], tmp_path)
    assert s.loc["twice", "paper / model median"] == pytest.approx(0.5)
    assert s.loc["twice", "paper / model sd"] == pytest.approx(0.0, abs=1e-12)
    assert s.loc["twice", "spearman"] == pytest.approx(1.0)
    assert s.loc["shuffled", "spearman"] < 0.9
    assert s.loc["twice", "mean |difference|"] == pytest.approx(paper.mean())
    reading = regime_reading(s)
    assert "`twice` (clean 90.00%" in reading and "the same ranking of corruptions" in reading
    assert "`shuffled`" in reading and "a different ranking" in reading
    assert reading.endswith(f"Nearest to the paper in level: `shuffled` "
                            f"({s.loc['shuffled', 'mean |difference|']:.2f} points per corruption).")
    t = regime_table(["twice"], tmp_path)
    assert list(t.columns) == ["twice", PAPER_LABEL]
    assert t.loc["clean", "twice"] == 90.0 and t.loc["mean", "twice"] == pytest.approx(2 * paper.mean())


def test_no_card_no_reading():
    assert regime_reading(pd.DataFrame()) == "No source model card to compare."


def test_three_models_say_whether_weaker_is_nearer(tmp_path):
    paper = paper_profile()
    shuffled = pd.Series(np.roll(paper.values, 1), index=paper.index)  # the paper's level, another ranking
    for name, clean, profile in (("full", 85.0, 2.0 * paper), ("short", 60.0, 1.3 * paper),
                                 ("shortest", 45.0, shuffled)):
        _card(tmp_path, name, clean, profile.to_dict(), 1)
    summary = regime_summary(["full", "short", "shortest"], tmp_path)
    assert list(summary["mean |difference|"].rank()) == [3.0, 2.0, 1.0] and summary["spearman"].iloc[2] < 0.5
    reading = regime_reading(summary)
    assert ("the lower a model's clean accuracy, the nearer it is to the paper's level (Spearman of clean accuracy "
            "and distance +1.00) and the less its corruptions rank like the paper's") in reading
    assert "Nearest to the paper in level: `shortest`" in reading


def test_conclusions_by_model_pairs_seeds_and_flags_a_changed_sign():
    import pandas as pd

    from studies.fedtsa.source_regime import conclusions_by_model, conclusions_reading

    def grid(values):
        return pd.DataFrame([{"tta": "bn", "setting": "niid", "strategy": s, "seed": seed, "accuracy": acc,
                              "accuracy_local": acc} for (s, seed), acc in values.items()])

    shipped = grid({("local", 0): 60, ("local", 1): 61, ("fedavg", 0): 62, ("fedavg", 1): 64,
                    ("fedtsa", 0): 60.2, ("fedtsa", 1): 61.1, ("fedamp", 1): 70, ("fedprox", 1): 66})
    weak = grid({("local", 0): 40, ("fedavg", 0): 38, ("fedtsa", 0): 40.1, ("fedprox", 0): 41})
    table = conclusions_by_model({"shipped": shipped, "weak": weak}, "shipped")
    row = table.set_index(["method", "model"])
    assert row.loc[("FedAvg", "shipped"), "gain over Local"] == 2.5 and row.loc[("FedAvg", "shipped"), "seeds"] == 2
    assert ("FedAMP", "shipped") not in row.index  # on one model only: nothing to compare
    assert row.loc[("FedProx", "shipped"), "gain over Local"] == 5 and row.loc[("FedProx", "shipped"), "seeds"] == 1
    assert row.loc[("FedAvg", "shipped"), "sd"] == pytest.approx(0.5 ** 0.5)  # paired gains 2 and 3
    assert np.isnan(row.loc[("FedProx", "shipped"), "sd"]) and np.isnan(row.loc[("FedAvg", "FedTSA (Table 1)"), "sd"])
    assert not row.loc[("FedAvg", "weak"), "same sign"] and row.loc[("FedTSA", "weak"), "same sign"]  # a tie both
    reading = conclusions_reading(table, "shipped")
    assert reading.startswith("1 of 3 gains over Local change sign") and "FedAvg − Local: +2.50" in reading
    assert reading.endswith("3 of them rest on a single seed on one model.")
    assert "+5.00 (1 seed) on `shipped`" in reading and "+2.50 (2 seeds) on `shipped`" in reading
    # the paper's Table 1 gains in the same cells (FedAvg and FedProx -0.41: a tie; FedTSA +3.34) join the table
    paper = table[table.model == "FedTSA (Table 1)"].set_index("method")["gain over Local"]
    assert paper["FedTSA"] == pytest.approx(60.27 - 56.93) and paper["FedAvg"] == pytest.approx(56.52 - 56.93)
    assert "FedAMP" not in paper  # only cells ours compare
    assert ("Signs that agree with the paper's Table 1 gain over Local in the same cell: `shipped` 0 of 3, `weak` 0 "
            "of 3.") in reading
    assert ("TTA-bn NIID: best over Local on `shipped` FedProx (by 2.50), on the paper FedTSA (by 3.75; a different "
            "method), `weak` FedProx (by 0.90).") in reading
    weak_tsa = grid({("local", 0): 40, ("fedavg", 0): 38, ("fedtsa", 0): 47, ("fedprox", 0): 41})
    flipped = conclusions_reading(conclusions_by_model({"shipped": shipped, "weak": weak_tsa}, "shipped"), "shipped")
    assert "`weak` FedTSA (by 6.00; a different method)" in flipped
    assert conclusions_reading(conclusions_by_model({"shipped": shipped}, "shipped"), "shipped").startswith("No ")


def test_adaptation_profiles_read_no_adaptation_and_local_from_any_tta_bn_run(tmp_path):
    import dataclasses

    from studies.fedtsa.source_regime import (PAPER_ADAPT_LABEL, adaptation_profiles, adaptation_reading,
                                                adaptation_summary, paper_profile)
    from studies.fedtsa.table1 import table1_config
    from ftta_core.runstore import store_summary
    from ftta_core.workbook import config_key

    corruptions = list(paper_profile().index)

    def store(model, strategy, seed, source, local):
        cfg = dataclasses.replace(table1_config("cifar10", "iid", "bn", model=model), strategy=strategy, seed=seed)
        store_summary(tmp_path / f"{config_key(cfg)}.json", {
            "accuracy": 0.0, "accuracy_local": 0.0, "config": cfg.to_dict(),
            "accuracy_by_domain": {"source": {c: source + i for i, c in enumerate(corruptions)},
                                   "local": {c: local + i for i, c in enumerate(corruptions)},
                                   "mixed": {c: 0.0 for c in corruptions}}})

    store(None, "local", 0, 60.0, 64.0)
    store(None, "fedavg", 0, 60.0, 64.0)  # the same seed through another strategy: counted once
    store(None, "local", 1, 62.0, 66.0)
    store("resnet8_cifar10_e1_n10000", "fedtsa", 0, 30.0, 50.0)
    profiles = adaptation_profiles(tmp_path, ["resnet8_cifar10", "resnet8_cifar10_e1_n10000", "resnet8_cifar10_e1"])
    assert set(profiles.model) == {"resnet8_cifar10", "resnet8_cifar10_e1_n10000", PAPER_ADAPT_LABEL}
    summary = adaptation_summary(profiles)
    shipped = summary.loc["resnet8_cifar10"]
    assert shipped["seeds"] == 2 and shipped["no adaptation"] == 61 + 7 and shipped["Local gain"] == 4
    assert shipped["Local spearman"] == pytest.approx(profiles[profiles.model == PAPER_ADAPT_LABEL].pipe(
        lambda p: p[p.quantity == "TTA-bn Local"].set_index("corruption")["accuracy"]).reindex(corruptions).corr(
        pd.Series(range(15), index=corruptions, dtype=float), method="spearman"))
    assert summary.loc["resnet8_cifar10_e1_n10000", "Local gain"] == 20
    paper = summary.loc[PAPER_ADAPT_LABEL]
    assert paper["no adaptation"] == pytest.approx(paper_profile().mean())
    reading = adaptation_reading(summary)
    assert f"the paper {paper['no adaptation']:.2f} -> {paper['TTA-bn Local']:.2f}" in reading
    assert "`resnet8_cifar10` 68.00 -> 72.00 (+4.00, 2 seeds)" in reading
    assert reading.count("gains as much from TTA-bn") == 1
    assert adaptation_reading(adaptation_summary(adaptation_profiles(tmp_path / "none", ["resnet8_cifar10_e1"]))).startswith("No ")


def test_a_gradient_cell_carries_local_minus_tta_bn_local_and_never_takes_a_mixed_run_for_local():
    from studies.fedtsa.source_regime import LOCAL_VS_BN, PAPER_T1_LABEL, conclusions_by_model, conclusions_reading

    def runs(model_local_bn, local_grad, fedavg_grad, fedavg_local):
        rows = [{"tta": "bn", "setting": "niid", "strategy": "fedavg", "seed": 0, "accuracy": 0.0,
                 "accuracy_local": model_local_bn},
                {"tta": "grad-running-adam", "setting": "niid", "strategy": "fedavg", "seed": 0,
                 "accuracy": fedavg_grad, "accuracy_local": fedavg_local}]
        if local_grad is not None:
            rows.append({"tta": "grad-running-adam", "setting": "niid", "strategy": "local", "seed": 0,
                         "accuracy": local_grad, "accuracy_local": local_grad})
        return pd.DataFrame(rows)

    table = conclusions_by_model({"shipped": runs(69.0, 72.0, 64.0, 71.0), "weak": runs(40.0, 35.0, 38.0, 36.0)},
                                 "shipped")
    row = table.set_index(["tta", "method", "model"])["gain over Local"]
    assert row[("grad-running-adam", LOCAL_VS_BN, "shipped")] == 3.0
    assert row[("grad-running-adam", LOCAL_VS_BN, "weak")] == -5.0
    assert row[("grad-running-adam", "FedAvg", "weak")] == 3.0
    assert row[("grad-running-adam", LOCAL_VS_BN, PAPER_T1_LABEL)] == pytest.approx(49.37 - 56.93)
    reading = conclusions_reading(table, "shipped")
    assert "TTA-grad-running-adam NIID Local − TTA-bn Local: +3.00" in reading
    assert "Best method per cell" not in reading  # one method against Local is no race; the Local row is none
    # without a Local run in a gradient cell, a mixed run's accuracy before mixing is not Local's: no gain
    no_local = conclusions_by_model({"shipped": runs(69.0, None, 64.0, 71.0), "weak": runs(40.0, None, 38.0, 36.0)},
                                    "shipped")
    assert no_local[no_local.tta == "grad-running-adam"].empty


def test_a_cell_at_another_step_size_is_its_own_column_compared_with_the_papers_tta_grad(tmp_path):
    from studies.fedtsa.source_regime import (PAPER_T1_LABEL, cell_of, conclusions_by_model, step_label,
                                                 stored_by_step)
    from studies.fedtsa.table1 import table1_config
    from ftta_core.runstore import store_summary
    from ftta_core.workbook import config_key

    assert step_label("grad-running-adam") == "grad-running-adam"
    assert cell_of(step_label("grad-running-adam", 3e-4)) == "grad-running-adam"
    accuracy = {(None, "local"): 60.0, (None, "fedavg"): 58.0, (3e-4, "local"): 50.0, (3e-4, "fedavg"): 55.0}
    for (lr, strategy), acc in accuracy.items():
        cfg = dataclasses.replace(table1_config("cifar10", "niid", "grad-running-adam", lr=lr), strategy=strategy,
                                  seed=0)
        store_summary(tmp_path / f"{config_key(cfg)}.json", {"config": cfg.to_dict(), "accuracy": acc,
                                                             "accuracy_local": acc, "accuracy_source": 40.0})
    grid = stored_by_step(tmp_path, ["local", "fedavg"], [0], [("grad-running-adam", None),
                                                             ("grad-running-adam", 3e-4)])
    assert sorted(grid.tta.unique()) == ["grad-running-adam", "grad-running-adam @ 0.0003"]
    table = conclusions_by_model({"shipped": grid, "other": grid}, "shipped")
    gain = table.set_index(["tta", "method", "model"])["gain over Local"]
    assert gain[("grad-running-adam", "FedAvg", "shipped")] == -2.0
    assert gain[("grad-running-adam @ 0.0003", "FedAvg", "shipped")] == 5.0
    # both step sizes stand beside the paper's TTA-grad gain (FedAvg 56.52 vs Local ... in its NIID column)
    paper = gain.xs(PAPER_T1_LABEL, level="model")
    assert paper[("grad-running-adam @ 0.0003", "FedAvg")] == paper[("grad-running-adam", "FedAvg")]
