"""The one grid runner (``ftta_core.grid``): a tidy table with a column per factor, stored runs found and not run again,
a shared pass storing what separate runs store, planning one job per pass, compact folders and in-memory runs."""
import dataclasses
import json

import pandas as pd
import pytest
import torch

from ftta_core import grid
from ftta_core.experiment import ExperimentConfig
from ftta_core.grid import FolderStore, MemoryStore, SummaryStore, config_key, live_key
from ftta_core.plan import PLAN_ENV, read_plan
from ftta_core.variants import Variant, strategy_variant, strategy_variants
from ftta_core.workbook import RUN_METADATA, run_stored

BASE = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=4, batch_size=5,
                        images_per_client=10, corruptions=["fog", "contrast", "frost", "glass_blur"], sh=0.5, th=0.2,
                        local="bn", device="cpu", max_steps=3)


def _never(*args, **kwargs):
    raise AssertionError("a stored run was made again")


def test_the_table_has_a_row_per_run_and_a_column_per_factor(tmp_path, monkeypatch):
    """Factors become typed columns (NaN where a variant has none); labels are only shown; a second call reads every
    run back from the store (nothing runs) and gives the same table."""
    variants = {"window 5": Variant({"strategy": "fedtsa", "strategy_params": {"window": 5}},
                                    {"window": 5, "method": "FedTSA"}),
                "a label that lies": strategy_variant("fedtsa", {"window": 2}, factors={"window": 2}),
                "FedAvg": {"strategy": "fedavg"}}
    table = grid.run(BASE, variants, [0, 1], SummaryStore(tmp_path), progress=False)
    assert list(table.columns) == ["variant", "seed", *grid.SUMMARY_KEYS, "window", "method"]
    assert table[["variant", "seed"]].values.tolist() == [["window 5", 0], ["window 5", 1], ["a label that lies", 0],
                                                          ["a label that lies", 1], ["FedAvg", 0], ["FedAvg", 1]]
    assert table["window"].tolist()[:4] == [5, 5, 2, 2] and table["window"].iloc[4:].isna().all()
    assert table["method"].iloc[0] == "FedTSA" and pd.isna(table["method"].iloc[2])
    assert len(list(tmp_path.glob("*.json"))) == 6
    monkeypatch.setattr(grid, "run_experiment", _never)
    monkeypatch.setattr(grid, "resumable_run", _never)
    again = grid.run(BASE, variants, [0, 1], SummaryStore(tmp_path), only_cached=True, progress=False)
    pd.testing.assert_frame_equal(again.drop(columns="wall_time_s"), table.drop(columns="wall_time_s"))
    empty = grid.run(BASE, variants, [0], SummaryStore(tmp_path / "none"), only_cached=True, progress=False)
    assert empty.empty and {"variant", "seed", "accuracy", "window", "method"} <= set(empty.columns)


def _measured(path) -> dict:
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in (*RUN_METADATA, "integrity")}


def test_a_shared_pass_stores_what_separate_runs_store(tmp_path):
    """Strategies missing for a seed share one TTA-bn pass: the same files (every measured number) as runs made one
    by one, under the same names, and the same table, seed by seed; a pass of one is still a pass."""
    strategies = strategy_variants(["local", "fedavg", "fedamp"])
    shared = grid.run(BASE, strategies, [0, 1], SummaryStore(tmp_path / "shared"), shared_pass=1, progress=False)
    alone = grid.run(BASE, strategies, [0, 1], SummaryStore(tmp_path / "alone"), progress=False)
    assert shared[["variant", "seed"]].values.tolist() == [[s, seed] for seed in (0, 1) for s in strategies]
    pd.testing.assert_frame_equal(
        shared.drop(columns="wall_time_s").sort_values(["variant", "seed"]).reset_index(drop=True),
        alone.drop(columns="wall_time_s").sort_values(["variant", "seed"]).reset_index(drop=True))
    names = sorted(p.name for p in (tmp_path / "alone").glob("*.json"))
    assert names == sorted(p.name for p in (tmp_path / "shared").glob("*.json")) and len(names) == 6
    for name in names:
        assert _measured(tmp_path / "shared" / name) == _measured(tmp_path / "alone" / name), name
        assert json.loads((tmp_path / "shared" / name).read_text())["shared_pass"]
        assert "shared_pass" not in json.loads((tmp_path / "alone" / name).read_text())
    fedtsa = grid.run(BASE, strategy_variants(["fedtsa"]), [0], SummaryStore(tmp_path / "one"), shared_pass=1,
                      progress=False)
    (stored,) = (tmp_path / "one").glob("*.json")
    assert json.loads(stored.read_text())["shared_pass"] == ["fedtsa"] and len(fedtsa) == 1


def test_a_pass_the_local_method_cannot_share_runs_each_strategy_alone(tmp_path):
    """Tent trains: asked for a shared pass, the runner makes one run per strategy (``SharedPassError`` caught), the
    same numbers as the plain grid."""
    tent = dataclasses.replace(BASE, local="tent")
    strategies = strategy_variants(["local", "fedavg"])
    tried = grid.run(tent, strategies, [0], SummaryStore(tmp_path / "a"), shared_pass=1, progress=False)
    plain = grid.run(tent, strategies, [0], SummaryStore(tmp_path / "b"), progress=False)
    assert tried["accuracy"].tolist() == plain["accuracy"].tolist()
    assert not any("shared_pass" in json.loads(p.read_text()) for p in (tmp_path / "a").glob("*.json"))


def test_planning_writes_one_job_per_pass_and_one_per_run_alone(tmp_path, monkeypatch):
    plan = tmp_path / "plan.jsonl"
    monkeypatch.setenv(PLAN_ENV, str(plan))
    variants = {**strategy_variants(["local", "fedavg"]), "T": strategy_variant("fedtsa", {"window": 5})}
    table = grid.run(BASE, variants, [0, 1], SummaryStore(tmp_path / "runs"), shared_pass=2, progress=False)
    assert table.empty and not (tmp_path / "runs").exists()
    jobs = read_plan(plan)
    assert [(j.strategies, j.config["strategy"], j.config["seed"]) for j in jobs] == [
        (("local", "fedavg"), "local", 0), ((), "fedtsa", 0), (("local", "fedavg"), "local", 1), ((), "fedtsa", 1)]
    assert jobs[1].config["strategy_params"] == {"window": 5}
    grid.run(BASE, variants, [0], SummaryStore(), progress=False)  # nothing kept: nothing to plan, it runs
    assert len(read_plan(plan)) == 4


def test_compact_folders_are_read_back_by_config(tmp_path, monkeypatch):
    """``FolderStore`` (``run_stored``): one folder per spec; two plain strategies share a pass, a strategy with
    parameters runs alone; a folder whose config is another's is run again, one that fits is read back."""
    specs = ["local", "fedavg", "fedctta@probe_bn=eval"]
    runs = run_stored(BASE, specs, tmp_path)
    assert sorted(runs) == sorted(specs) and runs["fedavg"].collaboration.shape[1:] == (4, 4)
    assert runs["local"].summary["shared_pass"] == ["local", "fedavg"]
    assert "shared_pass" not in runs["fedctta@probe_bn=eval"].summary
    assert runs["fedctta@probe_bn=eval"].summary["config"]["strategy_params"] == {"probe_bn": "eval"}
    table = grid.run(BASE, {s: strategy_variant(*grid.strategy_spec(s)) for s in specs}, [BASE.seed],
                     FolderStore(tmp_path), only_cached=True, progress=False)
    assert table.variant.tolist() == specs
    other = dataclasses.replace(BASE, max_steps=2)
    assert grid.run(other, strategy_variants(["local"]), [0], FolderStore(tmp_path), only_cached=True,
                    progress=False).empty


def test_live_runs_are_kept_in_memory_keyed_by_their_parameters_and_live_objects():
    """A tensor parameter is keyed by identity, the others by value (defaults left out, as in ``config_key``); a run
    in the cache is read back in a later grid, nothing runs."""
    probes = torch.rand(2, 3, 16, 16)
    same_values = probes.clone()
    with_probes = strategy_variant("fedctta", {"probe_images": probes}).config(BASE)
    assert live_key(with_probes) == live_key(strategy_variant("fedctta", {"probe_images": probes}).config(BASE))
    assert live_key(with_probes) != live_key(strategy_variant("fedctta", {"probe_images": same_values}).config(BASE))
    at_default = strategy_variant("fedctta", {"interval": 1}).config(BASE)
    assert live_key(at_default) == live_key(strategy_variant("fedctta").config(BASE))
    assert live_key(at_default)[0] == config_key(strategy_variant("fedctta").config(BASE))
    cfg = dataclasses.replace(BASE, max_steps=2)
    cache = {}
    variants = {"probes": strategy_variant("fedctta", {"probe_images": probes}, factors={"probes": "images"}),
                "noise": strategy_variant("fedctta")}
    table = grid.run(cfg, variants, [0, 1], MemoryStore(cache), progress=False)
    assert list(table.columns) == ["variant", "seed", *grid.LIVE_KEYS, "probes"] and len(cache) == 4
    assert table[["variant", "seed"]].values.tolist() == [["probes", 0], ["noise", 0], ["probes", 1], ["noise", 1]]
    assert table["self weight"].between(0, 1).all() and table["probes"].tolist()[::2] == ["images"] * 2

    class Cached(MemoryStore):
        def run(self, cell, progress):
            raise AssertionError("a run in the cache was made again")

    again = grid.run(cfg, {"again": strategy_variant("fedctta", {"interval": 1})}, [0, 1], Cached(cache),
                     progress=False)
    assert again["accuracy"].tolist() == table[table.variant == "noise"]["accuracy"].tolist()
