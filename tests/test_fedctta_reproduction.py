"""FedCTTA reproduction: the transcribed paper tables, the Table I join, the server-cost helpers, the live study."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from ftta_core.experiment import ExperimentConfig, run_experiment
from ftta_core.grid import run_live
from studies.fedctta.study import (TABLE4_CELLS, Variant, batch_size_variants, cluster_groups, distance_contrast,
                                     fedctta_round, heterogeneity_reading, live_grid, reading, split_table4,
                                     table4_variants)
from studies.fedctta.tables import beside_fedctta_table1, beside_fedctta_table4
from studies.fedtsa.table1 import missing_table1_runs, stored_table1_runs, table1_config
from studies.paper import paper_table
from studies.fedctta.server_cost import (bn_state_shapes, extrapolate_linear, fill_indicator_memory, measure_rounds,
                                           model_dims, peak_allocation, probe_forward_cost, scaling_table, server_round,
                                           summarize_rounds, synthetic_inputs, tensor_bytes, upload_bytes,
                                           upload_shapes)
from ftta_core.strategies import build_strategy
from ftta_core.training import load_source_model
from ftta_core.workbook import config_key

pytestmark = pytest.mark.usefixtures("one_thread")

TABLE1_METHODS = ["local", "fedavg", "fedavg_ft", "fedprox", "fedavgm", "moon", "pfedsd", "pfedgraph", "ldawa",
                  "fedtsa", "fedctta"]


# ---------------------------------------------------------------- transcribed tables


def test_table1_is_complete_and_tidy():
    t = paper_table("fedctta_table1")
    assert list(t.columns) == ["method", "dataset", "setting", "tta", "mean", "std"]
    assert len(t) == 12 * 2 * 2 * 2 and not t.duplicated(["method", "dataset", "setting", "tta"]).any()
    assert set(t.method) >= {"No-Adapt", "FedTSA", "FedCTTA", "LDAWA"}
    assert t["mean"].between(0, 100).all() and (t["std"] >= 0).all()


def test_table2_and_3_rows_agree_with_their_printed_means():
    t2 = paper_table("fedctta_table2")
    for (method, dataset), g in t2.groupby(["method", "dataset"]):
        values, mean = g[g.corruption != "mean"].accuracy, g[g.corruption == "mean"].accuracy.item()
        assert len(values) == 15
        if (method, dataset) != ("Source", "cifar10"):  # the paper's own inconsistency, noted in the CSV
            assert values.mean() == pytest.approx(mean, abs=0.02)
    t3 = paper_table("fedctta_table3")
    for _, g in t3.groupby("method"):
        slots = g[g.slot != "mean"]
        assert len(slots) == 15 and slots.clients_1_4.nunique() == 15
        assert slots.accuracy.mean() == pytest.approx(g[g.slot == "mean"].accuracy.item(), abs=0.02)


def test_table4_cells_match_the_study_grid():
    t4 = paper_table("fedctta_table4")
    assert sorted(map(tuple, t4[["probes", "statistic", "distance"]].values)) == sorted(TABLE4_CELLS)


# ---------------------------------------------------------------- Table I join


def fake_grid() -> pd.DataFrame:
    rows = []
    for setting in ("niid", "iid"):
        for seed in (0, 1):
            for s in ("fedavg", "fedctta"):
                rows.append({"strategy": s, "setting": setting, "seed": seed, "accuracy": 60.0 + seed + len(s),
                             "accuracy_local": 55.0 + seed, "accuracy_source": 50.0 + seed})
    return pd.DataFrame(rows)


def test_beside_fedctta_table1_joins_both_papers():
    out = beside_fedctta_table1(fake_grid(), "cifar10", "bn", ["fedavg", "fedctta"])
    ctta = paper_table("fedctta_table1").set_index(["method", "dataset", "setting", "tta"])
    tsa = paper_table("fedtsa_table1").set_index(["method", "dataset", "setting", "tta"])
    assert set(out.method) == {"No-Adapt", "Local", "FedAvg", "FedCTTA"}
    for r in out.itertuples():
        key = (r.method, "cifar10", r.setting, "bn")
        assert r.paper_mean == ctta.loc[key, "mean"] and r.paper_std == ctta.loc[key, "std"]
        assert r.difference == pytest.approx(r.ours_mean - r.paper_mean)
        if key in tsa.index:
            assert r.fedtsa_paper_mean == tsa.loc[key, "mean"]
        else:  # FedCTTA is not in FedTSA's table
            assert np.isnan(r.fedtsa_paper_mean)
    row = out[(out.method == "FedCTTA") & (out.setting == "niid")].iloc[0]
    assert row.seeds == 2 and row.ours_mean == pytest.approx(60.0 + 0.5 + len("fedctta"))
    assert beside_fedctta_table1(fake_grid().iloc[:0], "cifar10", "bn", ["fedavg"]).empty


def write_summary(folder, cfg: ExperimentConfig, accuracy: float):
    summary = {"accuracy": accuracy, "accuracy_local": accuracy - 1, "accuracy_source": accuracy - 2,
               "config": cfg.to_dict()}
    path = folder / f"{config_key(cfg)}.json"
    path.write_text(json.dumps(summary))
    return path


def test_stored_table1_runs_match_configs_not_file_names(tmp_path):
    base = table1_config("cifar10", "niid", "bn")
    write_summary(tmp_path, dataclasses.replace(base, strategy="fedavg", seed=0), 65.0)
    write_summary(tmp_path, dataclasses.replace(base, strategy="fedavg", seed=1, th=1 / 15), 66.0)  # older default
    write_summary(tmp_path, dataclasses.replace(base, strategy="fedctta", seed=0, batch_size=20), 70.0)  # not Table I
    write_summary(tmp_path, dataclasses.replace(table1_config("cifar10", "iid", "grad"), strategy="fedtsa"), 61.0)
    grid = stored_table1_runs(tmp_path, TABLE1_METHODS, [0, 1, 2])
    got = {(r.tta, r.setting, r.strategy, r.seed): r.accuracy for r in grid.itertuples()}
    assert got == {("bn", "niid", "fedavg", 0): 65.0, ("bn", "niid", "fedavg", 1): 66.0,
                   ("grad", "iid", "fedtsa", 0): 61.0}
    missing = missing_table1_runs(grid, TABLE1_METHODS, [0, 1, 2]).set_index(["tta", "setting", "method"])
    assert missing.loc[("bn", "niid", "FedAvg"), "missing_seeds"] == "2"
    assert missing.loc[("bn", "niid", "FedCTTA"), "missing_seeds"] == "0 1 2"
    assert len(missing) == 4 * len(TABLE1_METHODS)
    assert stored_table1_runs(tmp_path / "none", TABLE1_METHODS, [0]).empty


def test_beside_fedctta_table4_ranks():
    cells = pd.DataFrame([{"probes": p, "statistic": s, "distance": d, "mean": float(i), "std": 0.0, "seeds": 1}
                          for i, (p, s, d) in enumerate(TABLE4_CELLS)])
    out = beside_fedctta_table4(cells)
    assert out.paper.notna().all() and len(out) == len(TABLE4_CELLS)
    assert out.loc[out["mean"].idxmax(), "rank_ours"] == 1
    assert out.loc[out.paper.idxmax(), "rank_paper"] == 1


# ---------------------------------------------------------------- server cost


@pytest.fixture(scope="module")
def digits():
    model = load_source_model("digits_cnn_embedded")
    return model, model_dims(model, (3, 16, 16))


def test_shapes_and_upload_bytes(digits):
    model, dims = digits
    assert dims["classes"] == model.fc.out_features and dims["feature_dim"] == model.fc.in_features
    assert upload_shapes(build_strategy("fedavg"), dims) == {}
    assert upload_shapes(build_strategy("fedtsa"), dims) == {"indicator": (dims["feature_dim"],)}
    assert upload_shapes(build_strategy("fedctta"), dims) == {"probe_mean": (dims["classes"],)}
    assert upload_shapes(build_strategy("fedctta", on="features"), dims) == {"probe_mean": (dims["feature_dim"],)}
    state = bn_state_shapes(model)
    assert upload_bytes(state) == 4 * 2 * dims["bn_channels"] and len(state) == dims["bn_layers"]


def test_synthetic_inputs_are_reproducible():
    a = synthetic_inputs(3, 4, {"bn": (2, 5)}, {"probe_mean": (10,)}, seed=1)
    b = synthetic_inputs(3, 4, {"bn": (2, 5)}, {"probe_mean": (10,)}, seed=1)
    c = synthetic_inputs(4, 4, {"bn": (2, 5)}, {"probe_mean": (10,)}, seed=1)
    assert torch.equal(a.state["bn"], b.state["bn"]) and torch.equal(a.uploads["probe_mean"], b.uploads["probe_mean"])
    assert not torch.equal(a.state["bn"], c.state["bn"]) and a.state["bn"].shape == (4, 2, 5)


def test_tensor_bytes_counts_each_storage_once():
    t = torch.zeros(10, 4)
    obj = {"a": t, "b": [t, t[2:]], "c": np.zeros(3), "d": None, "e": "text"}
    assert tensor_bytes(obj) == t.numel() * 4 + 3 * 8
    assert tensor_bytes(build_strategy("fedctta")) == 0


def test_server_memory_constant_over_rounds(digits):
    _, dims = digits
    n, rounds = 5, 14
    state = {"bn": (2, 3)}
    held = {}
    for name, params in (("fedavg", {}), ("fedctta", {}), ("fedctta", {"ema": 0.9}),
                         ("fedtsa", {"server_steps": 1, "window": 4})):
        s = build_strategy(name, **params)
        s.reset(n)
        costs = measure_rounds(s, n, rounds, state, upload_shapes(s, dims))
        held[(name, bool(params))] = [c.retained_bytes for c in costs]
        assert all(c.mix_s >= 0 and c.collaboration_s >= 0 for c in costs)
    assert set(held[("fedavg", False)]) == {0} and set(held[("fedctta", False)]) == {0}
    assert set(held[("fedctta", True)]) == {n * dims["classes"] * 8 + n}  # float64 EMA + seen flags
    tsa = held[("fedtsa", True)]
    assert len(set(tsa[4:])) == 1 and max(tsa) == tsa[-1]  # grows while the window fills, then constant
    assert tsa[-1] >= 4 * n * dims["feature_dim"] * 4


def test_fill_memory_and_summarize(digits):
    _, dims = digits
    s = build_strategy("fedtsa", server_steps=2, window=3)
    s.reset(4)
    assert fill_indicator_memory(s, 4, 2, dims["feature_dim"]) == 2 and len(s.memory) == 2
    assert fill_indicator_memory(build_strategy("fedavg"), 4, 2, dims["feature_dim"]) == 0
    costs = measure_rounds(s, 4, 2, {}, upload_shapes(s, dims), start=2)
    summary = summarize_rounds(costs)
    assert summary["rounds"] == 2 and summary["state_dict_bytes"] > 0 and len(s.memory) == 3
    assert summary["round_s"] == pytest.approx(summary["collaboration_s"] + summary["mix_s"], rel=0.5)


def test_filled_memory_lives_on_the_device_of_the_timed_rounds():
    # the bank keeps the device of its first upload and the TS-Block trains there: a bank filled on the CPU made
    # the `server_cost.py --device cuda` run on one H100 (2026-11-22) time FedTSA's server on the host CPU
    s = build_strategy("fedtsa", server_steps=2, window=3)
    s.reset(4)
    fill_indicator_memory(s, 4, 2, 256, device="meta")  # "meta": any device other than the CPU, without a GPU
    assert s.memory.buffer.device.type == "meta"


def test_peak_allocation_sees_a_known_allocation():
    size = 1 << 20

    def allocate():
        x = torch.ones(size)  # 4 MiB, freed on return
        return float(x[0])

    peak = peak_allocation(allocate)
    assert peak["torch_cpu_peak_bytes"] >= 4 * size and peak["python_peak_bytes"] >= 0


def test_server_round_and_probe_forward(digits):
    model, dims = digits
    s = build_strategy("fedctta")
    s.reset(3)
    cost = server_round(s, synthetic_inputs(0, 3, bn_state_shapes(model), upload_shapes(s, dims)))
    assert cost.round_s > 0 and cost.retained_bytes == 0
    probe = probe_forward_cost(model, 2, image_shape=(3, 16, 16), n_probes=4, repeats=1)
    assert probe["clients"] == 2 and probe["seconds"] > 0 and probe["torch_cpu_peak_bytes"] > 0


def test_extrapolate_linear_and_scaling_table():
    assert extrapolate_linear({10: 1.0, 20: 2.0, 50: 5.0}, 1000) == pytest.approx(100.0)
    assert extrapolate_linear({10: 1.0}, 100) == pytest.approx(10.0)
    result = {"scaling": [{"clients": 10, "strategy": "FedTSA", "round_s": 1.0, "round_s_at_default_steps": 5.0,
                           "per_server_step_s": 0.05, "retained_bytes": 7, "state_dict_bytes": 5,
                           "torch_cpu_peak_bytes": 9, "extrapolated": True, "rounds": 1},
                          {"clients": 10, "strategy": "FedAvg", "round_s": 0.1, "retained_bytes": 0,
                           "state_dict_bytes": 0, "torch_cpu_peak_bytes": 3, "rounds": 2}]}
    table = scaling_table(result).set_index("strategy")
    assert table.loc["FedTSA", "s_per_round"] == 5.0 and table.loc["FedAvg", "s_per_round"] == 0.1
    assert table.loc["FedTSA", "extrapolated"] and np.isnan(table.loc["FedAvg", "s_per_server_step"])


# ---------------------------------------------------------------- live study on the digits


@pytest.fixture(scope="module")
def tiny_cfg() -> ExperimentConfig:
    return ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=4, sh=0.5,
                            corruptions=["fog", "contrast"], images_per_client=20, slot_steps=2, batch_size=5,
                            local="bn", device="cpu", seed=0, max_steps=4)


def test_run_live_equals_run_experiment(tiny_cfg):
    for name in ("fedavg", "fedctta"):
        cfg = dataclasses.replace(tiny_cfg, strategy=name)
        live = run_live(cfg)  # its strategy built from the config, seeded from the run's seed
        ref = run_experiment(cfg)
        assert live.summary["accuracy"] == pytest.approx(ref.summary["accuracy"])
        np.testing.assert_allclose(live.collaboration, ref.collaboration, atol=1e-6)


def test_fedctta_round_recomputes_the_engine_w(tiny_cfg):
    from ftta_core.loop import Engine
    from ftta_core.experiment import build_stream
    from ftta_core.tta import build_local

    stream = build_stream(tiny_cfg)
    engine = Engine(load_source_model(tiny_cfg.model_name), build_local("bn"), build_strategy("fedctta", n_probes=8),
                    tiny_cfg.clients)
    engine.step(stream.batch(0))
    opened = fedctta_round(engine, stream.batch(1))
    np.testing.assert_allclose(opened.engine_weights, opened.weights.numpy(), atol=1e-6)
    assert opened.statistics.shape == (4, 10) and opened.probes.shape[:2] == (4, 8)
    assert torch.all(opened.distances.diagonal() == 0) and torch.all(opened.distances >= 0)


def test_live_grid_variants_and_groups(tiny_cfg):
    groups = cluster_groups(np.array([[0, 1], [2, 3], [0, 1], [2, 3]]))
    assert list(groups.values()) == [[0, 2], [1, 3]]
    d = np.array([[0, 1, 5, 5], [1, 0, 5, 5], [5, 5, 0, 3], [5, 5, 3, 0]], float)
    assert distance_contrast(d, {"a": [0, 1], "b": [2, 3]}) == {"within": 2.0, "across": 5.0}
    variants = table4_variants(torch.rand(3, 3, 16, 16))
    assert len(variants) == len(TABLE4_CELLS) + 2
    assert variants["clean_images/logits/kl"]["strategy_params"]["probe_images"].shape == (3, 3, 16, 16)
    assert batch_size_variants([5, 10], 20, ("fedctta",))["fedctta / batch 10"].overrides == \
        {"batch_size": 10, "slot_steps": 2, "strategy": "fedctta", "strategy_params": {}}
    keep = {k: variants[k] for k in ("random_noise/logits/euclidean", "clean_images/features/cosine", "local")}
    grid = live_grid(tiny_cfg, keep, [0])
    assert list(grid.variant) == list(keep) and grid.accuracy.between(0, 100).all()
    cells = split_table4(grid)  # the cells from the variants' factors, in the order run; the baseline left out
    assert list(zip(cells.probes, cells.statistic, cells.distance)) == [("random_noise", "logits", "euclidean"),
                                                                        ("clean_images", "features", "cosine")]
    assert list(cells.columns) == ["probes", "statistic", "distance", "mean", "std", "seeds"]
    assert (cells.seeds == 1).all()
    again = live_grid(tiny_cfg, {"local": Variant("local")}, [0])
    assert again.accuracy.item() == grid[grid.variant == "local"].accuracy.item()


def test_probe_temperature_grid_names_settings_and_reads_self_weight(tiny_cfg):
    """Every (probe setting, temperature) runs once; W's self-weight is read from the run (FedAvg's is 1/N), and the
    reading states the EMA's effect within each probe normalisation."""
    from studies.fedctta.study import PROBE_SETTINGS, probe_temperature_grid, probe_temperature_reading

    grid = probe_temperature_grid(tiny_cfg, [1, 10], [0])
    assert set(grid.setting) == set(PROBE_SETTINGS) and set(grid.temperature) == {1.0, 10.0} and len(grid) == 10
    assert grid["self weight"].between(0, 1).all()
    flat = grid[grid.setting == "client statistics"].set_index("temperature")["self weight"]
    assert flat[10.0] < flat[1.0]  # a higher temperature flattens W
    fedavg = live_grid(tiny_cfg, {"fedavg": Variant("fedavg")}, [0])
    assert fedavg["self weight"].item() == pytest.approx(1 / tiny_cfg.clients)
    text = probe_temperature_reading(grid, {"fedavg": fedavg.accuracy.item()}, tiny_cfg.clients)
    assert text.count("the best temperature here is") == 5 and text.count("the EMA moves accuracy") == 2
    # under TTA-bn, probes in eval mode see the last mix's statistics: shared probes give every client the same
    # output, so W stays uniform (FedAvg) from the first step on
    assert "eval mode**: T = 1 gives" in text and "W is uniform mixing" in text.split("eval mode**")[1].split("\n")[0]


def test_reading_states_the_computed_numbers():
    shares = pd.DataFrame({"self": [0.9, 0.8], "own group (others)": [0.05, 0.1]})
    t4 = beside_fedctta_table4(pd.DataFrame([{"probes": p, "statistic": s, "distance": d, "mean": 70.0 + i,
                                               "std": 0.0, "seeds": 1} for i, (p, s, d) in enumerate(TABLE4_CELLS)]))
    interval = pd.DataFrame({"interval": [1, 10], "accuracy": [75.0, 72.0]})
    temperature = pd.DataFrame({"temperature": [1.0, 10.0], "accuracy": [75.0, 78.0]})
    batch = pd.DataFrame({"strategy": ["fedavg", "fedctta"] * 2, "batch": [10, 10, 20, 20],
                          "accuracy": [60.0, 75.0, 61.0, 76.0]})
    cost = pd.DataFrame({"clients": [100] * 3, "strategy": ["FedAvg", "FedCTTA", "FedTSA"],
                         "s_per_round": [0.01, 0.02, 10.0], "held_bytes": [0, 0, 2 ** 20],
                         "extrapolated": [False, False, True]})
    rounds = pd.DataFrame({"strategy": ["FedTSA"] * 3, "round": [9, 10, 11], "retained_bytes": [5, 7, 7]})
    text = reading({"Local": 74.0, "FedAvg": 60.0, "FedCTTA": 75.0}, shares, {"within": 2.0, "across": 5.0}, t4,
                   {"Local": 74.0, "FedAvg": 73.5}, interval, temperature, batch, cost, pd.DataFrame(), rounds)
    assert "75.00% against 60.00% for FedAvg (+15.00 points)" in text and "stays constant" in text
    assert "best at 10 (78.00%" in text and "500x FedCTTA" in text and "still open" in text
    assert "Table III" not in text
    table3 = pd.DataFrame({"mean (slots run)": [60.0, 58.0, 67.0, 65.5, 68.0, 62.0, 69.0],
                           "gain over No-Adapt": [0.0, 0.0, 7.0, 7.5, 8.0, 4.0, 9.0]},
                          index=pd.MultiIndex.from_tuples([("No-Adapt", "ours"), ("No-Adapt", "paper"),
                                                           ("FedCTTA", "ours"), ("FedCTTA", "paper"),
                                                           ("pFedGraph", "ours"), ("pFedGraph", "paper"),
                                                           ("FedTSA", "ours")],
                                                          names=["method", "who"]))
    text = reading({"Local": 74.0, "FedAvg": 60.0, "FedCTTA": 75.0}, shares, {"within": 2.0, "across": 5.0}, t4,
                   {"Local": 74.0, "FedAvg": 73.5}, interval, temperature, batch, cost, pd.DataFrame(), rounds, table3)
    assert "FedCTTA gains 7.00 points here and 7.50 in the paper; the best of ours is FedTSA (9.00)" in text
    assert "pFedGraph gains 8.00 here against 4.00 in the paper" in text
    # FedTSA has no paper row here, so the orders compare the three methods both have
    assert ("ours pFedGraph 68.00 > FedCTTA 67.00 > No-Adapt 60.00; the paper's FedCTTA 65.50 > pFedGraph 62.00 > "
            "No-Adapt 58.00 (a different order)") in text


def test_case_study_order_says_when_the_orders_agree():
    from studies.fedctta.study import case_study_order

    index = pd.MultiIndex.from_product([["No-Adapt", "FedCTTA", "FedTSA"], ["ours", "paper"]], names=["method", "who"])
    table3 = pd.DataFrame({"mean (slots run)": [60.0, 58.0, 70.0, 65.7, 69.0, 64.0]}, index=index)
    assert case_study_order(table3).endswith("(the same order).")
    assert "Too few methods" in case_study_order(table3.iloc[:2])


def test_heterogeneity_reading_states_drops_and_where_fedctta_is_best():
    sh = pd.DataFrame({"variant": ["fedavg", "fedctta"] * 2 + ["fedavg"], "sh": [0.05, 0.05, 0.5, 0.5, 0.5],
                       "seed": [0, 0, 0, 0, 1], "accuracy": [75.0, 74.0, 60.0, 70.0, 62.0]})
    text = heterogeneity_reading({"sh": sh, "th": pd.DataFrame()})
    assert text.startswith("**Fig. 2") and "SH from 0.05 to 0.5: FedAvg -14.00, FedCTTA -4.00 points" in text
    assert "largest drop: FedAvg" in text and "best of the 2 strategies stored at 1 of 2 points" in text
    assert "FedAvg at 0.05" in text and "TH" not in text
    text = heterogeneity_reading({"sh": sh, "th": sh[sh.sh == 0.5].rename(columns={"sh": "th"})})
    assert "TH: only 0.5 stored so far" in text
    flat = sh.assign(accuracy=[70.0, 71.0, 70.0, 71.5, 70.0])
    text = heterogeneity_reading({"sh": flat})
    assert "(no strategy loses accuracy; unchanged: FedAvg)" in text


def test_beside_per_corruption_puts_row_means_beside_the_papers_and_gaps_to_fedavg():
    from studies.paper import beside_per_corruption

    ours = pd.DataFrame({"fog": [60.0, 50.0], "mean": [70.0, 66.0], "seeds": [2, 1]}, index=["fedavg", "fedctta"])
    side = beside_per_corruption(ours, "fedctta_table2", dataset="cifar10")
    paper = paper_table("fedctta_table2")
    paper_avg = paper.query("dataset == 'cifar10' and method == 'FedAvg' and corruption == 'mean'").accuracy.item()
    assert side.loc["FedAvg", "paper"] == paper_avg
    assert side.loc["FedCTTA", "ours - FedAvg"] == -4.0
    assert side.loc["FedAvg", "ours - paper"] == pytest.approx(70.0 - paper_avg)
    assert "No-Adapt" in side.index and np.isnan(side.loc["No-Adapt", "ours"])  # the paper's Source row, renamed
    assert side.loc["FedCTTA", "seeds"] == 1


def test_stored_table1_runs_count_summaries_written_before_a_config_field_existed(tmp_path):
    base = table1_config("cifar10", "iid", "bn")
    path = write_summary(tmp_path, dataclasses.replace(base, strategy="local", seed=0), 69.0)
    summary = json.loads(path.read_text())
    del summary["config"]["participation"]  # stored before partial participation was added (default 1.0)
    path.write_text(json.dumps(summary))
    write_summary(tmp_path, dataclasses.replace(base, strategy="local", seed=1, participation=0.5), 60.0)  # not Table I
    grid = stored_table1_runs(tmp_path, ["local"], [0, 1])
    assert grid[["setting", "seed", "accuracy"]].values.tolist() == [["iid", 0, 69.0]]


def test_beside_fedctta_table3_lines_up_slots_and_gains_over_no_adapt():
    from studies.fedctta.tables import beside_fedctta_table3
    from ftta_core.workbook import StoredRun

    slots = pd.DataFrame([{"slot": s, "client": c, "domain": "d", "n": 10, "accuracy_source": 50.0,
                           "accuracy_local": 60.0, "accuracy_mixed": 60.0 + s} for s in range(2) for c in range(10)])
    side = beside_fedctta_table3({"fedctta": StoredRun({}, np.zeros((1, 10, 10)), slots)})
    paper = paper_table("fedctta_table3")
    paper_first = paper.query("method == 'FedCTTA' and slot == '1'").accuracy.item()
    assert side.loc[("FedCTTA", "ours"), 0] == 60.0 and side.loc[("FedCTTA", "paper"), 0] == paper_first
    assert side.loc[("FedCTTA", "ours"), "mean (slots run)"] == 60.5  # slots 0-1 only: the ones we ran
    assert side.loc[("FedCTTA", "ours"), "gain over No-Adapt"] == 10.5
    assert side.loc[("No-Adapt", "ours"), "gain over No-Adapt"] == 0.0
