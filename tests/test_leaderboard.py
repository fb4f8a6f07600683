"""The leaderboard: every local method x strategy, stored runs, seed spread."""
import numpy as np
import pandas as pd

from ftta_core.experiment import ExperimentConfig
from ftta_core.leaderboard import leaderboard_table, local_settings, run_leaderboard


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
    # a leaderboard fills in over sessions: local methods with no stored run must not turn the columns into objects
    # (the heatmap of session 6's 28 stored CIFAR runs failed on exactly that)
    import matplotlib

    matplotlib.use("Agg")
    from ftta_core.leaderboard import leaderboard_heatmap

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
