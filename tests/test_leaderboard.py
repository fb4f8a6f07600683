"""The leaderboard: every local method x strategy, stored runs, seed spread."""
import numpy as np
import pandas as pd

from ftta_core.experiment import ExperimentConfig
from studies.leaderboard import leaderboard_table, local_settings, run_leaderboard


def test_leaderboard_table_mean_std_and_ci():
    grid = pd.DataFrame({"local": ["bn"] * 3 + ["tent"] * 2, "strategy": ["fedavg"] * 5,
                         "seed": [0, 1, 2, 0, 1], "accuracy": [60.0, 62.0, 64.0, 70.0, 70.0]})
    table = leaderboard_table(grid)
    assert list(table.index.get_level_values("local")) == ["tent", "bn"]  # best first
    row = table.loc[("bn", "fedavg")]
    assert row["mean"] == 62.0 and row["std"] == 2.0 and row["seeds"] == 3
    assert np.isclose(row["ci95"], 4.302652729911275 * 2.0 / np.sqrt(3))


def test_eata_on_the_leaderboard_takes_its_fisher_from_the_source_data():
    cfg = ExperimentConfig(dataset="embedded_digits")
    assert local_settings("eata", cfg)["fisher_source"] == cfg.model_name
    assert local_settings("bn", cfg) == {}


def test_run_leaderboard_stores_and_reads_back(tmp_path, monkeypatch):
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    base = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=4, batch_size=10,
                            images_per_client=20, corruptions=["fog", "contrast"], sh=0.5, th=0.5, device="cpu",
                            max_steps=2)
    grid = run_leaderboard(base, ["bn", "tent"], ["local", "fedavg"], [0], results_dir=tmp_path / "runs")
    assert len(grid) == 4 and set(grid.local) == {"bn", "tent"}
    again = run_leaderboard(base, ["bn", "tent"], ["local", "fedavg"], [0], results_dir=tmp_path / "runs",
                            only_cached=True)
    pd.testing.assert_frame_equal(grid[["local", "strategy", "accuracy"]], again[["local", "strategy", "accuracy"]])


def test_a_partial_leaderboard_reads_and_draws(tmp_path, monkeypatch):
    # a leaderboard fills in as runs are added: local methods with no stored run must not turn the columns into objects
    # (the heatmap of the 28 CIFAR runs stored from one H100 on 2026-11-22 failed on exactly that)
    import matplotlib

    matplotlib.use("Agg")
    from studies.leaderboard import leaderboard_heatmap

    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    base = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=4, batch_size=10,
                            images_per_client=20, corruptions=["fog", "contrast"], sh=0.5, th=0.5, device="cpu",
                            max_steps=2)
    run_leaderboard(base, ["bn"], ["local"], [0], results_dir=tmp_path / "runs")
    grid = run_leaderboard(base, ["bn", "tent"], ["local", "fedavg"], [0], results_dir=tmp_path / "runs",
                           only_cached=True)
    assert len(grid) == 1 and grid["accuracy"].dtype.kind == "f"
    table = leaderboard_table(grid)
    assert leaderboard_heatmap(table).get_title() == ""
    empty = run_leaderboard(base, ["tent"], ["fedavg"], [0], results_dir=tmp_path / "runs", only_cached=True)
    assert empty.empty


def test_leaderboard_reads_runs_stored_by_another_grid_without_writing_there(tmp_path, monkeypatch):
    """The board's bn/tent rows are the FedTSA Table 1 configs: their stored runs count (read from ``also_read``,
    never written there), and what is missing runs into ``results_dir`` only."""
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    base = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=4, batch_size=10,
                            images_per_client=20, corruptions=["fog", "contrast"], sh=0.5, th=0.5, device="cpu",
                            max_steps=2)
    other = tmp_path / "table1"
    first = run_leaderboard(base, ["bn"], ["local", "fedavg"], [0], results_dir=other)
    stored = sorted(p.name for p in other.glob("*.json"))
    grid = run_leaderboard(base, ["bn"], ["local", "fedavg", "fedamp"], [0], results_dir=tmp_path / "board",
                           also_read=[other])
    assert sorted(p.name for p in other.glob("*.json")) == stored  # nothing written to the other folder
    assert len(list((tmp_path / "board").glob("*.json"))) == 1  # only FedAMP ran
    merged = grid.set_index("strategy").accuracy
    assert merged[["local", "fedavg"]].tolist() == first.set_index("strategy").accuracy[["local", "fedavg"]].tolist()
    # FedAMP ran in a shared pass (bn is stateless): the same number as a run of its own
    alone = run_leaderboard(base, ["bn"], ["fedamp"], [0], results_dir=tmp_path / "alone")
    assert alone.accuracy.iloc[0] == merged["fedamp"]


def test_gains_over_local_are_paired_by_seed_and_read_out():
    from studies.leaderboard import gains_over_local, leaderboard_reading

    rows = []
    for seed, shift in enumerate([0.0, 5.0, -5.0]):  # the seed moves every strategy alike: pairing removes it
        for strategy, acc in (("local", 60.0), ("fedavg", 62.0 + 0.1 * seed), ("fedamp", 59.0), ("pfedgraph", 60.0)):
            rows.append({"local": "bn", "strategy": strategy, "seed": seed, "accuracy": acc + shift})
        rows.append({"local": "tent", "strategy": "fedavg", "seed": seed, "accuracy": 61.0 + shift})
    rows.append({"local": "tent", "strategy": "local", "seed": 0, "accuracy": 60.5})
    grid = pd.DataFrame(rows)
    gains = gains_over_local(grid)
    bn = gains.loc["bn"]
    assert np.isclose(bn.loc["fedavg", "gain"], 2.1) and bn.loc["fedavg", "comparison"] == "ahead"
    assert bn.loc["fedamp", "gain"] == -1.0 and bn.loc["fedamp", "comparison"] == "behind"  # constant -1: ci 0
    assert bn.loc["pfedgraph", "comparison"] == "identical" and gains.loc[("tent", "fedavg"), "seeds"] == 1
    assert gains.loc[("tent", "fedavg"), "comparison"] == "undetermined"  # one seed: never above or below
    text = leaderboard_reading(leaderboard_table(grid), gains, n_locals=2, n_strategies=4, n_seeds=3)
    assert "16 of 24 runs are stored: 6 of 8 cells, 5 of them with all 3 seeds" in text
    assert ("**bn** (gain over local in points [95% CI], paired by seed): above local: fedavg +2.10 [+1.85, +2.35]; "
            "below local: fedamp -1.00 [-1.00, -1.00]; identical to local at every seed: pfedgraph +0.00.") in text
    assert "above local: none; fewer than 3 paired seeds (undetermined): fedavg +0.50 (1 seed)." in text
    named = leaderboard_reading(leaderboard_table(grid), gains, 3, 4, 3, locals_=["bn", "tent", "cotta"])
    assert "No run stored yet for: cotta." in named and "No run stored" not in text


def test_gains_over_local_with_two_seeds_are_undetermined_and_within_the_margin_is_equal():
    from studies.leaderboard import gains_over_local, leaderboard_reading

    rows = [{"local": "bn", "strategy": s, "seed": seed, "accuracy": acc}
            for seed in range(3) for s, acc in (("local", 60.0 + seed), ("fedavg", 60.0 + seed + (0.0, 0.2, 0.1)[seed]),
                                                ("fedamp", 63.0 + seed if seed < 2 else None))]
    grid = pd.DataFrame(rows).dropna()
    gains = gains_over_local(grid).loc["bn"]
    assert gains.loc["fedavg", "comparison"] == "equal within the margin"
    assert gains.loc["fedamp", "seeds"] == 2 and gains.loc["fedamp", "comparison"] == "undetermined"
    text = leaderboard_reading(leaderboard_table(grid), gains_over_local(grid), 1, 3, 3)
    assert "equal to local within 0.5 points: fedavg +0.10 [-0.15, +0.35]" in text
    assert "fewer than 3 paired seeds (undetermined): fedamp +3.00 [+3.00, +3.00] (2 seeds)" in text
    assert gains_over_local(grid[grid.strategy != "local"]).empty
