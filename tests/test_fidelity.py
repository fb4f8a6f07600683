"""The client-fidelity claims are computed from stored runs: paired by seed, per strategy variant, with a verdict."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from studies.fidelity import accuracies, claims_counts, claims_reading, claims_table, fedavgm_claims, paired
from studies.fedtsa.table1 import table1_config
from studies.paper import METHOD_LABELS
from ftta_core.runstore import store_summary
from ftta_core.workbook import config_key


def _store(folder, tta, setting, strategy, seed, accuracy, params=None, local=None, code=None, lr=None):
    cfg = dataclasses.replace(table1_config("cifar10", setting, tta, lr=lr), strategy=strategy,
                              strategy_params=params or {}, seed=seed)
    store_summary(folder / f"{config_key(cfg)}.json",
                  {"accuracy": accuracy, "accuracy_local": accuracy if local is None else local, "config": cfg.to_dict(),
                   **({"code": code} if code else {})})


def test_claims_name_the_stale_runs_they_rest_on(tmp_path):
    from studies.fedtsa.table1 import tta_grad_cells, tta_grad_cells_reading
    from ftta_core.runstore import code_record_of

    changed = {"modules": {"ftta_core.rng": "a digest no code has"}}
    _store(tmp_path, "bn", "iid", "fedavg", 0, 70.0, code=code_record_of(["ftta_core.rng"]))  # current
    _store(tmp_path, "bn", "iid", "fedavgm", 0, 70.0, {"momentum_on": "params"}, code=changed)
    _store(tmp_path, "bn", "iid", "fedavgm", 1, 71.0, {"momentum_on": "params"}, code=changed)  # no FedAvg to pair
    rows = {r["settled by"].split(",")[0]: r for r in fedavgm_claims(tmp_path) if "IID" in r["claim"]}
    params = rows["FedAvgM (momentum on params)"]
    assert params["stale runs"] == 1 and "1 run(s) made by code that has changed since" in params["settled by"]
    assert rows["FedAvgM (momentum on all)"]["stale runs"] == 0
    assert "1 row(s) rest on runs made by code that has changed since" in claims_reading(claims_table(tmp_path))
    _store(tmp_path, "grad", "niid", "local", 0, 70.0, code=changed)
    _store(tmp_path, "grad", "niid", "fedavg", 0, 70.0)
    cells = tta_grad_cells(results_dir=tmp_path).set_index(["cell", "setting"])
    assert cells.loc[("grad", "niid"), "stale runs"] == 1 and cells.loc[("grad", "iid"), "stale runs"] == 0
    assert "grad (NIID), 1 seed(s): no Local(grad) run paired with Local(bn), FedAvg - Local +0.00 (1 seed: " \
        "undetermined)" in tta_grad_cells_reading(cells.reset_index())
    assert "(1 of its runs made by code that has changed since)" in tta_grad_cells_reading(cells.reset_index())


def test_paired_uses_common_seeds_only():
    est = paired(pd.Series({0: 3.0, 1: 5.0, 2: 9.0}), pd.Series({0: 1.0, 1: 2.0}))
    assert (est.mean, list(est.seeds)) == (2.5, [0, 1]) and est.sd == pytest.approx(0.7071, abs=1e-4)
    # a run stored without the measure (NaN) is not a seed of the comparison
    est = paired(pd.Series({0: float("nan"), 1: 5.0}), pd.Series({0: 1.0, 1: 2.0}))
    assert (est.mean, list(est.seeds)) == (3.0, [1]) and np.isnan(est.sd) and np.isnan(est.low)
    assert np.isnan(paired(pd.Series({0: float("nan")}), pd.Series({0: 1.0})).mean)


def test_strategy_variants_are_told_apart(tmp_path):
    for seed in (0, 1, 2):
        _store(tmp_path, "bn", "iid", "fedavg", seed, 70.0 + seed)
        _store(tmp_path, "bn", "iid", "fedavgm", seed, 65.0 + seed + 0.1 * seed ** 2)
        _store(tmp_path, "bn", "iid", "fedavgm", seed, 70.0 + seed, {"momentum_on": "params"})
    assert list(accuracies(tmp_path, "bn", "iid", ("fedavgm", {}))) == [65.0, 66.1, 67.4]
    rows = {r["settled by"].split(",")[0]: r for r in fedavgm_claims(tmp_path) if "IID" in r["claim"]}
    everything = rows["FedAvgM (momentum on all)"]
    assert everything["verdict"] == "does not hold" and everything["high"] < -0.5  # outside the margin: no tie
    assert everything["ours"] == pytest.approx(-5 + 0.5 / 3) and everything["not counted"] == ""
    params = rows["FedAvgM (momentum on params)"]
    assert params["verdict"] == "holds" and params["seeds"] == 3
    # equal at every seed: the same computation, holds by construction and is not counted as a reproduction
    assert params["identical"] and params["not counted"] == "by construction"
    assert {r["cell class"] for r in rows.values()} == {"paper protocol"}
    # two seeds are too few for any verdict but "undetermined"
    two = {r["settled by"].split(",")[0]: r for r in fedavgm_claims(tmp_path) if "NIID" in r["claim"]}
    assert {r["verdict"] for r in two.values()} == {"no run"}
    for seed in (0, 1):
        _store(tmp_path, "bn", "niid", "fedavg", seed, 70.0 + seed)
        _store(tmp_path, "bn", "niid", "fedavgm", seed, 60.0 + seed)
    niid = [r for r in fedavgm_claims(tmp_path) if "NIID" in r["claim"] and r["seeds"]]
    assert [(r["verdict"], r["former verdict"]) for r in niid] == [("undetermined", "does not hold")]


def test_claims_table_without_runs_says_so(tmp_path):
    table = claims_table(tmp_path)
    assert set(table["verdict"]) == {"no run"}
    assert "paper protocol: 0 of " in claims_reading(table) and " without a run; the former rule: 0 hold)" in \
        claims_reading(table)
    counts = claims_counts(table)
    assert counts.loc["all", "no run"] == len(table) and "holds" not in counts


def test_cell_contrasts_change_one_factor_and_pair_seeds(tmp_path):
    from studies.fidelity import cell_contrasts, contrasts_reading

    for seed in (0, 1, 2):
        for cell, local, fedavg in (("grad", 70.0, 70.0), ("grad-running", 72.0, 65.0 - 0.1 * seed),
                                    ("grad-adam", 71.0, 71.0)):
            _store(tmp_path, cell, "niid", "local", seed, local)
            _store(tmp_path, cell, "niid", "fedavg", seed, fedavg)
    c = cell_contrasts(tmp_path, strategies=("fedavg",)).set_index(["from", "to", "quantity"])
    assert len(c) == 8  # 4 one-factor pairs x (Local, FedAvg - Local); the diagonal pairs are not contrasts
    bn = c.loc[("batch (grad)", "running (grad-running)")]
    assert bn.loc["Local", "change"] == 2.0 and bn.loc["FedAvg - Local", "change"] == pytest.approx(-7.1)
    assert bn.loc["FedAvg - Local", "comparison"] == "behind" and bn.loc["FedAvg - Local", "high"] < 0
    assert bn.loc["Local", "factor"] == "BN statistics" and bn.loc["Local", "kept"] == "sgd"
    assert pd.isna(c.loc[("sgd (grad-running)", "adam (grad-running-adam)", "Local"), "change"])  # not run
    assert contrasts_reading(cell_contrasts(tmp_path, strategies=("fedavg",))).startswith(
        "BN statistics batch (grad) -> running (grad-running) (sgd kept) moves FedAvg - Local by -7.10 [")


def test_setting_contrasts_pair_niid_with_iid_per_cell(tmp_path):
    from studies.fidelity import contrasts_reading, setting_contrasts

    for seed in (0, 1, 2):
        for setting, local, fedavg in (("niid", 73.0, 65.0), ("iid", 73.0, 72.5 + 0.1 * seed)):
            _store(tmp_path, "grad-running-adam", setting, "local", seed, local)
            _store(tmp_path, "grad-running-adam", setting, "fedavg", seed, fedavg)
    c = setting_contrasts(tmp_path, strategies=("fedavg",)).set_index(["kept", "quantity"])
    cell = c.loc["grad-running-adam (BN running, adam)"]
    assert cell.loc["Local", "change"] == 0.0 and cell.loc["FedAvg - Local", "change"] == pytest.approx(7.6)
    assert cell.loc["Local", "comparison"] == "identical"
    assert pd.isna(c.loc[("grad (BN batch, sgd)", "Local"), "change"])  # no runs in that cell
    assert contrasts_reading(setting_contrasts(tmp_path, strategies=("fedavg",))).startswith(
        "clients' corruptions NIID -> IID (grad-running-adam (BN running, adam) kept) moves FedAvg - Local by +7.60 [")


def test_claim_grids_plan_every_run_the_fedctta_and_fedavgm_claims_read(tmp_path):
    from studies.fidelity import claim_grids, fedctta_claims

    for tta, setting, lr, variants in claim_grids():
        for i, variant in enumerate(variants.values()):
            for seed in (0, 1):
                _store(tmp_path, tta, setting, variant["strategy"], seed, 60.0 + i + seed, variant["strategy_params"],
                       lr=lr)
    rows = fedctta_claims(tmp_path) + fedavgm_claims(tmp_path)
    assert [r["settled by"] for r in rows if r["verdict"] == "no run" or r["seeds"] != 2] == []
    # Table I's TTA-grad IID column is read for the reference clients' probe handling only
    iid = [r["settled by"] for r in rows if r["claim"] == "FedCTTA above Local under TTA-grad, IID"]
    assert [s.split(",")[0] for s in iid] == ["FedCTTA (probe_bn=client)", "FedCTTA (probe_bn=eval)",
                                              "FedCTTA (reference code)", "FedCTTA (reference code)"]
    # at the drift step, our default and the reference code's handling only
    assert sorted(s.split(",")[0] for s in iid if "0.0003" in s) == ["FedCTTA (probe_bn=client)",
                                                                      "FedCTTA (reference code)"]
    # each TTA-grad cell plans FedAvg too: notebook 20 pairs FedCTTA with it there (uniform mixing of the whole state)
    assert all({"local", "fedavg"} <= {v["strategy"] for v in variants.values()}
               for tta, _, _, variants in claim_grids() if tta != "bn")


def test_tta_grad_claims_read_every_table1_strategy_at_the_drift_step_and_fedtsa_against_the_best(tmp_path):
    """At ``DRIFT_STEP`` every Table 1 strategy gets its "above Local" claim, read from runs at that step only;
    "FedTSA best" pairs FedTSA with the best other strategy at the seeds where every other one has a run."""
    from studies.fidelity import DRIFT_STEP, TABLE1_STRATEGIES, tta_grad_claims

    cell, lr = DRIFT_STEP
    for seed in (0, 1):
        _store(tmp_path, "bn", "niid", "local", seed, 70.0)
        _store(tmp_path, cell, "niid", "local", seed, 60.0, lr=lr)
        for i, s in enumerate(TABLE1_STRATEGIES):
            if seed == 1 and s == "moon":
                continue  # seed 1 lacks one rival: "FedTSA best" is read at seed 0 only
            _store(tmp_path, cell, "niid", s, seed, 62.0 + i * 0.1 + (5.0 if s == "fedtsa" else 0.0), lr=lr)
    _store(tmp_path, cell, "niid", "fedamp", 2, 99.0)  # the cell's own step: never read at the drift step
    rows = {r["claim"]: r for r in tta_grad_claims(tmp_path, settings=("niid",)) if "0.0003" in r["settled by"]}
    assert len(rows) == 1 + len(TABLE1_STRATEGIES) + 2  # Local's gap, each strategy, FedCTTA's FedAvg row, best
    assert rows["Local(grad) below Local(bn), NIID"]["ours"] == pytest.approx(-10.0)
    assert rows["Local(grad) below Local(bn), NIID"]["verdict"] == "undetermined"  # two seeds: too few
    assert rows["Local(grad) below Local(bn), NIID"]["former verdict"] == "holds"  # the paper: -7.56
    assert {r["cell class"] for r in rows.values()} == {"post hoc"}  # the drift step on the seeds it was chosen on
    amp = rows["FedAMP above Local under TTA-grad, NIID"]
    assert amp["seeds"] == 2 and amp["ours"] == pytest.approx(2.0 + 0.1 * TABLE1_STRATEGIES.index("fedamp"))
    best = rows["FedTSA best under TTA-grad, NIID (minus the best other strategy)"]
    rival = 62.0 + 0.1 * max(i for i, s in enumerate(TABLE1_STRATEGIES) if s != "fedtsa")
    fedtsa = 67.0 + 0.1 * TABLE1_STRATEGIES.index("fedtsa")
    assert best["seeds"] == 1 and best["ours"] == pytest.approx(fedtsa - rival)
    assert best["paper"] == pytest.approx(57.32 - 55.88)  # FedTSA - FedAMP, the paper's best other in NIID
    from studies.fidelity import strategy_gains, strategy_gains_reading

    gains = strategy_gains(tmp_path, settings=("niid",)).set_index("method")
    assert gains.loc["FedAMP", "ours"] == pytest.approx(amp["ours"]) and list(gains.index) == [
        METHOD_LABELS[s] for s in TABLE1_STRATEGIES]
    text = strategy_gains_reading(gains.reset_index())
    assert text.startswith(f"NIID ({len(TABLE1_STRATEGIES)} of {len(TABLE1_STRATEGIES)} strategies with runs, 1-2 "
                           f"seed(s) each): {len(TABLE1_STRATEGIES) - 1} gain over Local with a 95 % interval above 0")
    assert "best over Local: ours FedTSA" in text and "different numbers of seeds" in text
    # the 2x2 cells' rows stay Local, FedAvg and FedTSA only
    own = [r["claim"] for r in tta_grad_claims(tmp_path, settings=("niid",)) if "0.0003" not in r["settled by"]]
    assert not any("FedAMP" in c or "best" in c for c in own)


def test_difference_by_step_pairs_two_strategies_within_each_cell_and_step(tmp_path):
    from studies.fidelity import DRIFT_STEP, difference_by_step, difference_by_step_reading

    cell, lr = DRIFT_STEP
    for seed, (avg, ft) in enumerate([(70.0, 66.0), (71.0, 66.0), (72.0, 65.0)]):
        _store(tmp_path, cell, "iid", "fedavg", seed, avg, lr=lr)
        _store(tmp_path, cell, "iid", "fedavg_ft", seed, ft, lr=lr)
    _store(tmp_path, cell, "iid", "fedavg", 0, 60.0)  # the cell's own step: paired with nothing
    _store(tmp_path, cell, "iid", "fedavg_ft", 1, 60.0)
    t = difference_by_step(tmp_path, settings=("iid",)).set_index("cell")
    drift = t.loc["grad-running-adam (BN running, adam 0.0003)"]
    assert drift["ours"] == pytest.approx(-5.33333) and drift["seeds"] == 3
    # the interval, -5.33 +- 4.30 x 1.53 / sqrt(3), reaches within 0.5 of the paper's -7.44: the size holds
    assert drift["paper"] == pytest.approx(49.84 - 57.28) and drift["verdict"] == "holds"
    assert drift["low"] == pytest.approx(-5.33333 - 4.3027 * 1.52753 / 3 ** 0.5, abs=1e-3)
    assert t.loc["grad-running-adam (BN running, adam 1e-05)", "seeds"] == 0  # no seed has both there
    assert difference_by_step_reading(t.reset_index()) == (
        f"IID: FedAvg+FT - FedAvg -5.33 [{drift['low']:+.2f}, {drift['high']:+.2f}] (3 seeds) in grad-running-adam "
        "(BN running, adam 0.0003) (holds); the paper -7.44.")
    _store(tmp_path, cell, "iid", "fedavgm", 0, 69.0, {"momentum_on": "params"}, lr=lr)
    _store(tmp_path, cell, "iid", "fedavgm", 0, 30.0, lr=lr)  # the default: not read for the variant
    m = difference_by_step(tmp_path, "fedavgm", settings=("iid",), params={"momentum_on": "params"}).iloc[-1]
    assert m["difference"] == "FedAvgM (momentum_on=params) - FedAvg" and m["ours"] == pytest.approx(-1.0)


def test_proximal_anchor_table_pairs_each_anchor_with_fedavg_and_names_the_nearer(tmp_path):
    from studies.fidelity import DRIFT_STEP, proximal_anchor_reading, proximal_anchor_table

    cell, lr = DRIFT_STEP
    for seed, (avg, prox, source) in enumerate([(70.0, 70.0, 68.0), (72.0, 72.0, 69.0), (71.0, 71.0, 68.5)]):
        _store(tmp_path, cell, "iid", "fedavg", seed, avg, lr=lr)
        _store(tmp_path, cell, "iid", "fedprox", seed, prox, lr=lr)
        _store(tmp_path, cell, "iid", "fedprox_source", seed, source, lr=lr)
    _store(tmp_path, cell, "niid", "fedavg", 0, 70.0, lr=lr)
    _store(tmp_path, cell, "niid", "fedprox", 0, 70.0, lr=lr)
    _store(tmp_path, cell, "niid", "fedprox_source", 1, 60.0, lr=lr)  # no FedAvg at seed 1: paired with nothing
    t = proximal_anchor_table(tmp_path).set_index(["setting", "strategy"])
    assert t.loc[("iid", "fedprox"), "ours"] == 0.0 and t.loc[("iid", "fedprox_source"), "ours"] == pytest.approx(-2.5)
    assert t.loc[("iid", "fedprox_source"), "paper"] == pytest.approx(55.03 - 57.28)
    assert t.loc[("iid", "fedprox_source"), "verdict"] == "holds" and t.loc[("niid", "fedprox_source"), "seeds"] == 0
    text = proximal_anchor_reading(t.reset_index())
    assert ("IID: FedProx - FedAvg anchored at the model received at the last mix (fedprox) +0.00 [+0.00, +0.00] "
            "(3 seeds), does not hold") in text  # the paper's -0.54, outside an interval of width 0
    assert "Nearer the paper: the anchor at the source model, for the whole run, by 2.00 points." in text
    assert "NIID: FedProx - FedAvg anchored at the model received at the last mix (fedprox) +0.00 (1 seed)" in text
    assert text.count("Nearer the paper") == 1  # NIID has one anchor with runs


def test_statistics_contrast_is_fedavg_with_local_statistics_minus_fedavg_paired_by_seed(tmp_path):
    from studies.fidelity import statistics_contrasts

    for seed, (local, fedavg, kept) in enumerate([(60.0, 52.0, 61.0), (62.0, 55.0, 62.5)]):
        _store(tmp_path, "grad-running-adam", "niid", "local", seed, local)
        _store(tmp_path, "grad-running-adam", "niid", "fedavg", seed, fedavg)
        _store(tmp_path, "grad-running-adam", "niid", "fedavg_localstats", seed, kept)
    rows = statistics_contrasts(tmp_path).set_index(["kept", "setting"])
    row = rows.loc[("grad-running-adam (BN running, adam)", "niid")]
    assert row["change"] == pytest.approx(8.25) and row["seeds"] == 2  # (9 + 7.5) / 2
    assert rows.loc[("grad-running-adam (BN running, adam)", "iid"), "seeds"] == 0
    assert set(rows.index.get_level_values(0)) == {"grad-running (BN running, sgd)",
                                                    "grad-running-adam (BN running, adam)"}


def test_fedctta_probe_contrast_pairs_each_probe_normalisation_with_fedavg_and_reads_w_shares(tmp_path):
    from studies.fidelity import fedctta_probe_contrast, probe_contrast_reading
    from ftta_core.runstore import read_summary

    for seed in (0, 1):
        _store(tmp_path, "bn", "niid", "fedavg", seed, 66.0 + seed)
        _store(tmp_path, "bn", "niid", "fedctta", seed, 71.0 + seed)
        _store(tmp_path, "bn", "niid", "fedctta", seed, 66.0 + seed, {"probe_bn": "eval"})
    for path in tmp_path.glob("*.json"):  # the eval runs kept W's shares: uniform mixing
        summary = read_summary(path)
        if summary["config"]["strategy_params"]:
            store_summary(path, {**summary, "weight_shares": {"self": 0.05, "same domain": 0.2,
                                                              "uniform same-domain": 0.2}})
    table = fedctta_probe_contrast(tmp_path, settings=("niid",)).set_index("FedCTTA")
    assert table.loc["FedCTTA (probe_bn=client)", "difference"] == pytest.approx(5.0)
    assert table.loc["FedCTTA (probe_bn=eval)", "difference"] == pytest.approx(0.0)
    assert set(table["against"]) == {"FedAvg"} and set(table["tta"]) == {"bn"}
    assert table.loc["FedCTTA (probe_bn=eval)", "W self"] == pytest.approx(0.05)
    assert table.loc["FedCTTA (probe_bn=client)", "runs with W's shares"] == 0
    text = probe_contrast_reading(table.reset_index()).splitlines()
    assert text[0].endswith("+5.00 [+5.00, +5.00] (2 seeds) against FedAvg, undetermined.")  # two seeds: too few
    assert "W keeps" not in text[0]
    assert "against FedAvg, identical; W keeps" in text[1] and "uniform mixing: 0.050" in text[1]
    # a TTA-grad cell against Local: only the probe normalisations read in that cell
    for seed in (0, 1):
        _store(tmp_path, "grad-running-adam", "niid", "local", seed, 73.0 + seed)
        _store(tmp_path, "grad-running-adam", "niid", "fedctta", seed, 66.0 + seed, {"probe_bn": "eval"})
    grad = fedctta_probe_contrast(tmp_path, settings=("niid",), tta="grad-running-adam", against="local")
    assert grad["FedCTTA"].tolist() == ["FedCTTA (probe_bn=client)", "FedCTTA (probe_bn=eval)",
                                        "FedCTTA (reference code)"]
    assert grad.set_index("FedCTTA").loc["FedCTTA (probe_bn=eval)", "difference"] == pytest.approx(-7.0)
    lines = probe_contrast_reading(grad).splitlines()
    assert lines[0] == "- FedCTTA (probe_bn=client), NIID: no run paired with Local."
    iid = fedctta_probe_contrast(tmp_path, settings=("iid",), tta="grad-running-adam", against="local")
    assert iid["FedCTTA"].tolist() == ["FedCTTA (probe_bn=eval)", "FedCTTA (reference code)"]
    assert "-7.00 [-7.00, -7.00] (2 seeds) against Local, undetermined" in lines[1]
    # the same cell at another step size: its own runs only, and they do not enter the cell's own contrast
    reference = {"probe_bn": "eval", "probes": "per_client", "ema": 0.9}
    _store(tmp_path, "grad-running-adam", "niid", "local", 0, 60.0, lr=3e-4)
    _store(tmp_path, "grad-running-adam", "niid", "fedctta", 0, 64.0, reference, lr=3e-4)
    big = fedctta_probe_contrast(tmp_path, settings=("niid",), tta="grad-running-adam", against="local",
                                 lr=3e-4).set_index("FedCTTA")
    assert big.loc["FedCTTA (reference code)", "difference"] == pytest.approx(4.0)
    assert list(big.index) == ["FedCTTA (probe_bn=client)", "FedCTTA (reference code)"]  # read at the drift step
    again = fedctta_probe_contrast(tmp_path, settings=("niid",), tta="grad-running-adam", against="local")
    assert again.set_index("FedCTTA").loc["FedCTTA (reference code)", "seeds"] == 0


def test_tta_grad_cells_read_a_step_size_apart_from_the_cell_default(tmp_path):
    """Runs made with ``study fedtsa table --lr`` form their own row; they never enter the cell's default-step row."""
    from studies.fedtsa.table1 import degraded_local_reading, tta_grad_cells, tta_grad_cells_reading

    def store(strategy, accuracy, lr=None, tta="grad-running-adam", local=None):
        cfg = dataclasses.replace(table1_config("cifar10", "iid", tta, lr=lr), strategy=strategy, seed=0)
        store_summary(tmp_path / f"{config_key(cfg)}.json",
                      {"accuracy": accuracy, "accuracy_local": local if local is not None else accuracy,
                       "config": cfg.to_dict()})

    store("fedavg", 70.0, tta="bn", local=68.0)
    store("local", 71.0)
    store("fedavg", 70.5)
    store("local", 60.0, lr=1e-3)
    store("fedavg", 66.0, lr=1e-3)
    cells = tta_grad_cells(results_dir=tmp_path, cells=["grad-running-adam"], lrs=[None, 1e-3], settings=["iid"])
    own, big = cells.to_dict("records")
    assert own["optimizer"] == "adam 1e-05" and big["optimizer"] == "adam 0.001"
    assert own["local - local(bn)"] == pytest.approx(3.0) and own["FedAvg - local"] == pytest.approx(-0.5)
    assert big["local - local(bn)"] == pytest.approx(-8.0) and big["FedAvg - local"] == pytest.approx(6.0)
    reading = tta_grad_cells_reading(cells)
    # one seed settles nothing: Local collapsing by 8 points at 1e-3 is not "the paper's pattern holds" yet
    assert "grad-running-adam (IID), 1 seed(s)" in reading and "the paper's pattern does not hold" not in reading
    assert "grad-running-adam (IID, adam 0.001), 1 seed(s)" in reading
    assert reading.count("the paper's pattern undetermined") == 2
    assert "In none of the 2 row(s)" in degraded_local_reading(cells) and "(the paper: -7.56 IID)" in \
        degraded_local_reading(cells)
    for seed, (local, fedavg) in enumerate([(59.0, 66.5), (61.0, 66.0)], start=1):  # three seeds at 1e-3
        cfg = dataclasses.replace(table1_config("cifar10", "iid", "grad-running-adam", lr=1e-3), seed=seed)
        for strategy, acc in (("local", local), ("fedavg", fedavg)):
            c = dataclasses.replace(cfg, strategy=strategy)
            store_summary(tmp_path / f"{config_key(c)}.json", {"accuracy": acc, "accuracy_local": acc,
                                                               "config": c.to_dict()})
        bn = dataclasses.replace(table1_config("cifar10", "iid", "bn"), strategy="fedavg", seed=seed)
        store_summary(tmp_path / f"{config_key(bn)}.json", {"accuracy": 70.0, "accuracy_local": 68.0 + seed * 0.1,
                                                            "config": bn.to_dict()})
    cells = tta_grad_cells(results_dir=tmp_path, cells=["grad-running-adam"], lrs=[None, 1e-3], settings=["iid"])
    own, big = cells.to_dict("records")
    assert big["local - local(bn) below"] == "holds" and big["FedAvg - local above"] == "holds"
    assert "grad-running-adam (IID, adam 0.001), 3 seed(s): Local(grad) below Local(bn)" in \
        tta_grad_cells_reading(cells) and "the paper's pattern holds" in tta_grad_cells_reading(cells)
    degraded = degraded_local_reading(cells)
    assert "Local(grad) is below Local(bn) in 1 of 2 row(s)" in degraded
    assert "FedAvg is above Local there in 1 of them (the paper: +7.91 IID)" in degraded
    named = degraded_local_reading(cells.assign(model="resnet8_cifar10_e1_n10000"))
    assert "grad-running-adam (IID, adam 0.001, resnet8_cifar10_e1_n10000): " in named
    with pytest.raises(ValueError, match="TTA-bn takes no gradient step"):
        table1_config("cifar10", "iid", "bn", lr=1e-3)
    import matplotlib
    matplotlib.use("Agg")
    from studies.fedtsa.table1 import step_size_figure
    cells = tta_grad_cells(results_dir=tmp_path, cells=["grad-running-adam"], lrs=[None, 1e-3], settings=["iid"],
                           seeds=[0])  # seed 0 alone, as first stored
    ax = step_size_figure(cells).axes[0]
    ours = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert ax.get_xscale() == "log" and ax.get_ylabel() and [list(line.get_xdata()) for line in ours] == [[1e-5, 1e-3]] * 2
    assert sorted(list(line.get_ydata()) for line in ours) == [[-0.5, 6.0], [3.0, -8.0]]
    two = pd.concat([cells.assign(model="shipped"), cells.iloc[1:].assign(model="weak", **{"FedAvg - local": 1.0})])
    ax = step_size_figure(two).axes[0]
    weak = [line for line in ax.get_lines() if line.get_marker() == "s"]  # the second model: its own marker
    assert sorted(list(line.get_ydata()) for line in weak) == [[-8.0], [1.0]]
    assert any("(weak)" in t.get_text() for t in ax.figure.legends[0].get_texts())  # one key, below the panels


def test_over_local_pairs_a_reading_with_the_cells_local_runs_by_seed(tmp_path):
    from studies.fidelity import DRIFT_STEP, over_local_reading, over_local_table

    cell, lr = DRIFT_STEP
    for seed, acc in enumerate([60.0, 62.0]):
        _store(tmp_path, cell, "iid", "local", seed, acc, lr=lr)
    _store(tmp_path, cell, "niid", "local", 0, 50.0, lr=lr)
    _store(tmp_path, cell, "niid", "local", 1, 50.0)  # the cell's own step, not drift_lr: not read
    values = pd.DataFrame({"setting": ["niid", "niid", "iid", "iid", "iid"], "seed": [0, 1, 0, 1, 2],
                           "reading": [55.0, 40.0, 61.0, 64.0, 90.0]})  # IID seed 2 has no Local: paired with nothing
    t = over_local_table(values, "reading", "FedAvg+FT", tmp_path).set_index("setting")
    assert t.loc["iid", "ours"] == pytest.approx(1.5) and t.loc["iid", "seeds"] == 2
    assert t.loc["iid", "paper"] == pytest.approx(49.84 - 49.37) and t.loc["iid", "verdict"] == "undetermined"
    assert t.loc["niid", "ours"] == pytest.approx(5.0) and t.loc["niid", "seeds"] == 1
    assert t.loc["niid", "verdict"] == "undetermined"  # one and two seeds: too few for a verdict
    text = over_local_reading(t.reset_index(), "R")
    assert text.startswith("R - Local: NIID +5.00 (1 seed) against the paper's +4.70 (undetermined); IID +1.50 [")


def test_over_local_claims_join_the_claims_table_and_count_stale_readings(tmp_path):
    """A reading against Local becomes a claims-table row of its own (the notebooks' ``extra``), whose stale count
    comes from the reading's ``code`` status at the paired seeds."""
    from studies.fidelity import DRIFT_STEP, over_local_claims

    cell, lr = DRIFT_STEP
    for seed, acc in enumerate([60.0, 62.0, 61.0]):
        _store(tmp_path, cell, "iid", "local", seed, acc, lr=lr)
    values = pd.DataFrame({"setting": ["iid"] * 4, "seed": [0, 1, 2, 3], "reading": [55.0, 58.0, 57.0, 90.0],
                           "code": ["current", "stale", "current", "stale"]})  # seed 3: no Local, not counted
    table = claims_table(tmp_path, extra=over_local_claims(values, "reading", "FedAvg+FT", "as read", tmp_path))
    row = table.set_index("claim").loc["FedAvg+FT above Local under TTA-grad, IID (as read)"]
    assert row["ours"] == pytest.approx(-13 / 3) and row["seeds"] == 3 and row["stale runs"] == 1
    assert row["verdict"] == "does not hold" and row["paper"] == pytest.approx(49.84 - 49.37)
    assert row["settled by"].endswith("IID, as read, seeds [0, 1, 2] (1 run(s) made by code that has changed since)")
    assert row["source"] == "FedTSA Table 1"


def test_ft_reference_claims_read_the_column_ft_forward_writes(tmp_path):
    """The notebooks' FedAvg+FT reference-reading rows read ``ft_forward_table``'s column by name."""
    from studies.fedtsa.ft_forward import ft_forward_table
    from studies.fidelity import DRIFT_STEP, FT_REFERENCE_READING, ft_reference_claims

    assert FT_REFERENCE_READING in ft_forward_table(tmp_path, tmp_path).columns
    _store(tmp_path, DRIFT_STEP[0], "niid", "local", 0, 50.0, lr=DRIFT_STEP[1])
    rows = ft_reference_claims(pd.DataFrame({"setting": ["niid"], "seed": [0], FT_REFERENCE_READING: [56.0]}),
                               tmp_path)
    assert [(r["claim"], r["ours"], r["verdict"]) for r in rows] == [
        ("FedAvg+FT above Local under TTA-grad, NIID (as the reference code reports it)", 6.0, "undetermined")]


def test_tta_grad_cells_command_names_the_step_size_once_in_markdown_and_keeps_it_in_csv(tmp_path):
    """The markdown names a row's step size in ``optimizer`` (a two-digit ``lr`` column printed 0.00 for every row);
    the CSV keeps ``lr`` as a number."""
    from ftta_core.cli import main

    _store(tmp_path, "grad-running-adam", "iid", "local", 0, 60.0, lr=3e-4)
    _store(tmp_path, "grad-running-adam", "iid", "fedavg", 0, 66.0, lr=3e-4)
    assert main(["study", "fedtsa", "grad-cells", "--results", str(tmp_path), "--settings", "iid", "--cells", "grad-running-adam",
                 "--lrs", "3e-4", "--table", str(tmp_path / "cells")]) == 0
    header = (tmp_path / "cells.md").read_text().splitlines()[2]
    assert "| optimizer |" in header and "| lr |" not in header
    assert "| adam 0.0003 |" in (tmp_path / "cells.md").read_text()
    assert pd.read_csv(tmp_path / "cells.csv")["lr"].tolist() == [3e-4]
