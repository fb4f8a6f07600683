"""The anchored-client study (``studies.anchored``, issue 56): its configs reuse the stored Table 1 runs for the
plain client, its plan holds exactly the missing runs, and its tables pair by seed through the statistics module."""
import json

import pandas as pd
import pytest

from ftta_core import stats
from studies import anchored
from ftta_core.workbook import config_key
from studies.fedtsa.table1 import table1_config


def test_the_plain_client_is_the_stored_table1_cell_and_anchors_only_add_their_parameters():
    plain = anchored.client_config("plain", "niid")
    assert config_key(plain) == config_key(table1_config("cifar10", "niid", anchored.CELL, lr=anchored.DRIFT_STEP))
    for client, (local, extra, _) in anchored.CLIENTS.items():
        if client == "plain":
            continue
        cfg = anchored.client_config(client, "iid", reset_every=150)
        assert cfg.local == local and cfg.scenario == "fedtsa_iid"
        assert {k: v for k, v in cfg.local_params.items() if k not in extra and k != "reset_every"} == \
            plain.local_params
        assert all(cfg.local_params[k] == v for k, v in extra.items())
    with pytest.raises(ValueError, match="reset_every"):
        anchored.client_config("reset", "niid")
    with pytest.raises(ValueError, match="client must be one of"):
        anchored.client_config("anchor", "niid")


def test_the_plan_holds_the_missing_runs_and_reads_the_stored_plain_ones(tmp_path, monkeypatch):
    plan = tmp_path / "plan.jsonl"
    monkeypatch.setenv("FTTA_PLAN", str(plan))
    monkeypatch.setattr(anchored, "RUNS_DIR", tmp_path / "runs")
    assert anchored.chosen_reset(anchored.reset_selection(only_cached=False)) is None
    runs = anchored.study_runs(only_cached=False)
    # every plain run is stored with the Table 1 runs: 5 strategies x (2 settings x 3 seeds + the check seed)
    assert set(runs.client) == {"plain"} and len(runs) == len(anchored.STRATEGIES) * 7
    jobs = [json.loads(line) for line in plan.read_text().splitlines()]
    anchors = [c for c in anchored.CLIENTS if c not in ("plain", "reset")]
    assert len(jobs) == len(anchored.RESET_GRID) + len(anchors) * len(anchored.STRATEGIES) * 7
    assert {j["config"]["local"] for j in jobs} == {"rdumb", *(anchored.CLIENTS[c][0] for c in anchors)}


def _fake_runs(plain: pd.DataFrame) -> pd.DataFrame:
    """The stored plain runs, and an anchored client 'prox' whose accuracy is each plain run's + 3 (Local) or + 1
    (every strategy): every strategy's gain over Local with the same client is 2 points less than the plain
    client's, its gain over Local with the plain client 1 point more."""
    prox = plain.assign(client="prox", accuracy=plain.accuracy + (plain.strategy == "local") * 2.0 + 1.0)
    return pd.concat([plain, prox], ignore_index=True)


def test_tables_pair_by_seed_through_the_statistics_module():
    runs = _fake_runs(anchored.study_runs(only_cached=True, clients=("plain",)))
    gains = anchored.gains_table(runs)
    alone = gains[gains.strategy == "local"]  # the anchor without collaboration: Local + prox over Local + plain
    assert set(alone.versus) == {"Local, plain client"} and set(alone.client) == {"prox"}
    assert alone.gain.to_numpy() == pytest.approx(3.0) and (alone.seeds == 3).all()
    for (setting, strategy), g in gains[gains.strategy != "local"].groupby(["setting", "strategy"]):
        plain = g[(g.client == "plain") & (g.versus == "Local, same client")].iloc[0]
        prox_same = g[(g.client == "prox") & (g.versus == "Local, same client")].iloc[0]
        prox_plain = g[(g.client == "prox") & (g.versus == "Local, plain client")].iloc[0]
        assert prox_same.gain == pytest.approx(plain.gain - 2.0) and prox_plain.gain == pytest.approx(plain.gain + 1)
        here = runs[(runs.cell == anchored.CELL) & (runs.setting == setting) & (runs.client == "plain")]
        est = stats.paired(here[here.strategy == strategy].set_index("seed").accuracy,
                           here[here.strategy == "local"].set_index("seed").accuracy)
        assert plain.seeds == est.n == 3 and plain.comparison == stats.comparison(est)
    best = anchored.best_table(runs)
    assert set(best.setting) == set(anchored.SETTINGS) and best["best local"].eq("local + prox").all()
    text = anchored.reading(gains, best)
    assert "NIID" in text and "IID" in text and "best local local + prox" in text
    assert "the anchor alone (Local with it minus Local with the plain client): prox +3.00" in text
    for setting, here in gains[(gains.client == "plain") & (gains.versus == "Local, same client")].groupby("setting"):
        ahead = sorted(here[here.comparison == "ahead"].strategy)  # the papers' gains, each read again with prox
        if ahead:
            assert f"{setting.upper()}, prox client: of the strategies ahead of Local with the plain client " \
                   f"({', '.join(ahead)})" in text
    cost = anchored.cost_table(runs, gains)
    assert (cost["MB uploaded per client step"] > 0).all() and set(cost.setting) == set(anchored.SETTINGS)
    same = gains[gains.versus == "Local, same client"]
    assert len(cost) == len(same) and set(cost.strategy) == set(same.strategy)  # one row per pair, per setting
    for r in cost.to_dict("records"):
        g = same[(same.setting == r["setting"]) & (same.strategy == r["strategy"]) & (same.client == r["client"])]
        assert r["gain over Local"] == pytest.approx(float(g.gain.iloc[0]))


def test_the_check_sets_each_tta_grad_gain_beside_the_drift_cells_at_its_seed():
    runs = _fake_runs(anchored.study_runs(only_cached=True, clients=("plain",)))
    check = anchored.check_table(runs)
    assert len(check) == len(anchored.gains_table(runs, anchored.CHECK_CELL)) > 0 and set(check.setting) == {"niid"}

    def accuracy(cell, client, strategy):
        here = runs[(runs.cell == cell) & (runs.setting == "niid") & (runs.seed == anchored.CHECK_SEED)]
        return float(here[(here.client == client) & (here.strategy == strategy)].accuracy.iloc[0])

    for r in check.to_dict("records"):
        base = "plain" if r["versus"] == "Local, plain client" else r["client"]
        for cell, column in ((anchored.CHECK_CELL, "check cell gain"), (anchored.CELL, "drift cell gain, same seed")):
            want = accuracy(cell, r["client"], r["strategy"]) - accuracy(cell, base, "local")
            assert r[column] == pytest.approx(want)
        assert r["check cell direction"] == stats.direction(r["check cell gain"])
        assert r["agree"] == (r["check cell direction"] == r["drift cell direction, same seed"])
    alone = check[check.strategy == "local"].iloc[0]  # prox's Local is 3 points above plain's in both cells
    assert alone["check cell direction"] == "ahead" and alone["agree"]
    text = anchored.reading(anchored.gains_table(runs), anchored.best_table(runs), check=check)
    assert f"of {len(check)} gains paired with the drift cell at that seed" in text
    assert f"{int(check.agree.sum())} point the same way as in the drift cell" in text
    empty = anchored.check_table(runs[runs.cell == anchored.CELL])
    assert empty.empty and "agree" in empty.columns and anchored._check_reading(empty) == []


def test_the_reading_says_when_nothing_is_stored():
    assert "No run" in anchored.reading(pd.DataFrame(), pd.DataFrame())


def test_reset_rule_picks_the_best_held_out_period_and_waits_for_every_run():
    table = pd.DataFrame({"reset_every": [50, 150, 375], "accuracy": [40.0, 45.0, 45.0]})
    assert anchored.chosen_reset(table) == 375
    assert anchored.chosen_reset(table.assign(accuracy=[40.0, float("nan"), 1.0])) is None


def test_the_board_ranks_clients_by_strategy_per_setting_and_draws_both_settings_on_one_scale():
    import matplotlib

    matplotlib.use("Agg")
    rows = [{"cell": anchored.CELL, "setting": s, "client": c, "strategy": st, "seed": seed,
             "accuracy": base + seed * 0.1}
            for s, c, st, base in (("niid", "plain", "local", 56.0), ("niid", "prox", "local", 68.8),
                                   ("niid", "prox", "fedavg", 65.0), ("iid", "plain", "fedavg", 66.0))
            for seed in (0, 1, 2)]
    runs = pd.DataFrame(rows + [{**rows[0], "cell": "grad"}])  # another cell's run never enters the board
    table, grid = anchored.board(runs, "niid")
    assert list(table.index) == [("prox", "local"), ("prox", "fedavg"), ("plain", "local")]
    assert table.loc[("plain", "local"), "seeds"] == 3 and set(grid["local"]) == {"plain", "prox"}
    assert anchored.board(runs.iloc[:0], "iid")[0].empty
    fig = anchored.board_figure(runs)
    bars = [ax for ax in fig.axes if "mean accuracy" in ax.get_ylabel()]  # the two heatmaps' colour bars
    assert len(bars) == 2 and len({tuple(round(v, 6) for v in bar.get_ylim()) for bar in bars}) == 1


def test_the_drift_reading_sorts_the_papers_gains_by_their_verdict_with_an_anchored_client():
    """A strategy ahead with the plain client is read again with each anchored client: still ahead, behind,
    undetermined, or waiting (fewer than ``stats.MIN_SEEDS`` seeds); a strategy not ahead with the plain client is
    not among the papers' gains."""
    def row(client, strategy, comparison, seeds=3, versus="Local, same client"):
        return {"setting": "niid", "client": client, "strategy": strategy, "versus": versus, "gain": 1.0,
                "low": 0.5, "high": 1.5, "seeds": seeds, "comparison": comparison}

    gains = pd.DataFrame([row("plain", s, "ahead") for s in ("fedavg", "fedtsa", "fedctta", "pfedgraph")]
                         + [row("plain", "moon", "undetermined"),
                            row("prox", "fedavg", "behind"), row("prox", "fedtsa", "ahead"),
                            row("prox", "fedctta", "undetermined"), row("prox", "pfedgraph", "ahead", seeds=1),
                            row("prox", "moon", "ahead"),
                            row("prox", "local", "ahead", versus="Local, plain client")])
    text = "\n".join(anchored._drift_reading(gains))
    assert "the anchor alone (Local with it minus Local with the plain client): prox +1.00 [+0.50, +1.50] (ahead)" \
        in text
    assert ("NIID, prox client: of the strategies ahead of Local with the plain client (fedavg, fedctta, fedtsa, "
            "pfedgraph), still ahead of Local with it: fedtsa; behind it (the anchor alone does better): fedavg; no "
            "longer shown ahead (undetermined): fedctta; waiting for runs: pfedgraph.") in text
    assert "moon" not in text


def _complete_grid(setting: str = "niid") -> pd.DataFrame:
    """Every client x strategy x seed of one setting's drift-cell grid; 'prox' with FedCTTA the best federated mean,
    'restore' the best Local mean."""
    rows = [{"cell": anchored.CELL, "setting": setting, "client": c, "strategy": st, "seed": seed,
             "accuracy": 60.0 + 0.1 * seed + (5.0 if (c, st) == ("prox", "fedctta") else 0.0)
             + (3.0 if (c, st) == ("restore", "local") else 0.0)}
            for c in anchored.CLIENTS for st in anchored.STRATEGIES for seed in anchored.SEEDS]
    return pd.DataFrame(rows)


def test_the_post_hoc_best_pair_waits_for_the_complete_grid_then_is_read_on_unseen_seeds():
    """The best pair is picked only once every client x strategy x seed of a setting is stored (a pick on part of
    the grid could change), and is compared again on ``REPLICATION_SEEDS``, which the study's seeds do not
    include; the reading labels the first pick post hoc and says what the replication gives or waits for."""
    assert not set(anchored.REPLICATION_SEEDS) & set(anchored.SEEDS)
    full = _complete_grid()
    partial = full.iloc[1:]
    assert anchored.grid_count(partial, "niid") == (len(full) - 1, len(full))
    assert anchored.best_pairs(partial) == {}
    waiting = anchored.replication_table(partial, pd.DataFrame())
    assert waiting.set_index("setting").loc["niid", "status"] == \
        f"waits for the complete grid ({len(full) - 1} of {len(full)} runs stored)"
    assert anchored.best_pairs(full) == {"niid": (("prox", "fedctta"), "restore")}
    iid = _complete_grid("iid")  # the fisher client's Local and FedAvg cells at one seed only, far ahead there
    lone = (iid.client == "fisher") & iid.strategy.isin(["local", "fedavg"])
    iid = pd.concat([iid[~lone], iid[lone & (iid.seed == 0)].assign(accuracy=99.0)])
    best = anchored.best_table(iid).set_index("setting").loc["iid"]  # a mean of one seed is not compared
    assert (best["best federated"], best["best local"], best["seeds"]) == ("fedctta + prox", "local + restore", 3)
    unseen = pd.DataFrame([{"cell": anchored.CELL, "setting": "niid", "client": c, "strategy": st, "seed": seed,
                            "accuracy": acc + 0.3 * seed}
                           for seed in anchored.REPLICATION_SEEDS
                           for c, st, acc in (("prox", "fedctta", 64.0), ("restore", "local", 63.0))])
    table = anchored.replication_table(full, unseen.iloc[:-1]).set_index("setting")
    assert table.loc["niid", "status"] == f"waits for runs (2 of {len(anchored.REPLICATION_SEEDS)} seeds paired)"
    table = anchored.replication_table(full, unseen).set_index("setting")
    row = table.loc["niid"]
    assert row["status"] == "replicated" and row["difference"] == pytest.approx(1.0)
    assert row["comparison"] == stats.comparison(stats.paired(
        unseen[unseen.client == "prox"].set_index("seed").accuracy,
        unseen[unseen.client == "restore"].set_index("seed").accuracy))
    gains, best = anchored.gains_table(full), anchored.best_table(full)
    text = anchored.reading(gains, best, table.reset_index())
    seeds = ", ".join(map(str, anchored.REPLICATION_SEEDS))
    assert "(both picked on these runs' means: post hoc)" in text
    assert f"NIID: replicated on unseen seeds {seeds}: fedctta + prox minus local + restore = +1.00" in text
    assert f"({len(anchored.REPLICATION_SEEDS)} seeds): {row['comparison']}." in text  # a count, never 3.0
    assert table["seeds"].dtype == "Int64" and pd.isna(table.loc["iid", "seeds"])
    assert "IID: the replication on unseen seeds" in text and "waits for the complete grid" in text


def test_the_family_reading_widens_every_grid_interval_to_one_five_percent_budget():
    """Read as one family, the m gains over Local with the same client get intervals at 1 - 0.05 / m: a gain with
    no spread across seeds stays ahead, one whose sd is 13 % of its size does not (it would need under about
    sqrt(3) / t, 9 % at m = 20); the rule's verdicts are left as they are."""
    grid = _complete_grid()
    noisy = (grid.client == "fisher") & (grid.strategy == "fedavg")  # +2.3 on average, sd 0.3 across seeds
    grid.loc[noisy, "accuracy"] += grid.loc[noisy, "seed"].map({0: 2.0, 1: 2.3, 2: 2.6})
    family = anchored.family_table(grid).set_index(["client", "strategy"])
    m = (len(anchored.CLIENTS)) * (len(anchored.STRATEGIES) - 1)
    assert len(family) == m
    assert (family["family confidence"] - (1 - (1 - stats.CONFIDENCE) / m)).abs().max() < 1e-12
    assert family.loc[("prox", "fedctta"), "comparison"] == "ahead"  # +5, equal at every seed
    assert family.loc[("prox", "fedctta"), "family comparison"] == "ahead"
    assert family.loc[("fisher", "fedavg"), "comparison"] == "ahead"
    assert family.loc[("fisher", "fedavg"), "family comparison"] == "undetermined"
    assert ((family["family low"] <= family["low"]) & (family["family high"] >= family["high"])).all()
    text = anchored.reading(anchored.gains_table(grid), anchored.best_table(grid), family=family.reset_index())
    assert (f"the {m} gains over Local with the same client, each interval at {100 - 5 / m:.3f} % (Bonferroni): "
            "1 of the 2 'ahead' stay ahead (NIID fedctta + prox)") in text
    assert anchored.family_table(grid.iloc[:0]).empty


def test_the_replication_is_planned_once_the_grid_is_complete(tmp_path, monkeypatch):
    plan = tmp_path / "plan.jsonl"
    monkeypatch.setenv("FTTA_PLAN", str(plan))
    monkeypatch.setattr(anchored, "RUNS_DIR", tmp_path / "runs")
    monkeypatch.setattr(anchored, "reset_selection", lambda only_cached=True: None)  # its runs are not this test's
    monkeypatch.setattr(anchored, "chosen_reset", lambda table: 50)
    assert anchored.replication_runs(_complete_grid().iloc[1:], only_cached=False).empty and not plan.exists()
    anchored.replication_runs(_complete_grid(), only_cached=False)
    jobs = [json.loads(line)["config"] for line in plan.read_text().splitlines()]
    assert sorted((j["local"], j["strategy"], j["seed"]) for j in jobs) == sorted(
        [("tentprox", "fedctta", s) for s in anchored.REPLICATION_SEEDS]
        + [("tentrestore", "local", s) for s in anchored.REPLICATION_SEEDS])
    assert all(j["scenario"] == "fedtsa_niid" and j["local_params"]["lr"] == anchored.DRIFT_STEP for j in jobs)


def test_one_call_runs_the_grid_then_its_replication_then_the_check_and_stops_when_nothing_is_planned(
        tmp_path, monkeypatch):
    # the grid (seeds 0, 1), its replication (5, plannable once the grid is stored) and the check (100); a fake
    # run-plan stores the jobs of the file it is given that are not stored yet, in order
    import subprocess

    from ftta_core.plan import add_to_plan, read_plan

    plan = tmp_path / "plan.jsonl"
    stored, ran = set(), []

    def plan_in_order(check=True):
        wanted = [0, 1] + ([100] if check else []) + ([5] if {0, 1} <= stored else [])
        for seed in wanted:
            if seed not in stored:
                add_to_plan({"seed": seed}, tmp_path)

    def run_plan(cmd):
        for job in read_plan(cmd[cmd.index("run-plan") + 1]):
            if job.config["seed"] not in stored:
                ran.append(job.config["seed"])
                stored.add(job.config["seed"])
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(anchored, "plan_in_order", plan_in_order)
    monkeypatch.setattr(subprocess, "run", run_plan)
    assert anchored.plan_and_run(2, plan) == 0
    assert ran == [0, 1, 5, 100]  # the replication ran before the check, though the check was planned first
    assert sorted(j.config["seed"] for j in read_plan(plan)) == [0, 1, 5, 100]  # the committed plan holds all
    # a failing run-plan ends the call with its status
    stored.clear()
    monkeypatch.setattr(subprocess, "run", lambda cmd: subprocess.CompletedProcess(cmd, 75))
    assert anchored.plan_and_run(2, tmp_path / "other.jsonl") == 75
