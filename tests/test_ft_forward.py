"""FedAvg+FT's reference-code reading (``fedtsa.ft_forward``): the wrapped local method changes nothing, and the
reading is what the reference clients' second ``adapt`` call reports."""
import copy

import pandas as pd
import pytest
import torch

from ftta_core.experiment import ExperimentConfig, run_experiment
from ftta_core.fedtsa.ft_forward import MODULE, READING, AdaptOutputs, ft_forward_run
from studies.fedtsa.ft_forward import ft_forward_reading, ft_forward_summary
from ftta_core.loop import Engine
from ftta_core.runstore import run_status
from ftta_core.strategies import build_strategy
from ftta_core.tta import build_local

from conftest import shifted_batches
from test_running_bn import entropy_loss

pytestmark = pytest.mark.usefixtures("one_thread")


def reference_ft(model, batches, lr):
    """The reference code's FedAvg+FT with plain modules: adapt (train mode, Adam, entropy), average the whole
    state_dicts, adapt again; per step the second adapt's pre-step train-mode argmax (what it reports) and the
    eval-mode argmax after it (what our engine predicts)."""
    n = batches[0].images.shape[0]
    nets = [copy.deepcopy(model) for _ in range(n)]
    opts = [torch.optim.Adam(net.parameters(), lr=lr) for net in nets]

    def adapt(b):
        preds = []
        for i, (net, opt) in enumerate(zip(nets, opts)):
            logits = net.train()(b.images[i])
            opt.zero_grad()
            entropy_loss(logits).backward()
            opt.step()
            preds.append(logits.detach().argmax(-1))
        return torch.stack(preds)

    readings, after = [], []
    for b in batches:
        adapt(b)
        states = [net.state_dict() for net in nets]
        avg = {k: torch.stack([s[k].float() for s in states]).mean(0).to(states[0][k].dtype)
               for k in states[0] if not k.endswith("num_batches_tracked")}
        for net in nets:
            net.load_state_dict(avg, strict=False)
        readings.append(adapt(b))
        with torch.no_grad():
            after.append(torch.stack([net.eval()(b.images[i]).argmax(-1) for i, net in enumerate(nets)]))
    return readings, after


@pytest.mark.parametrize("backend", ["loop", "vectorized"])
def test_reading_is_the_reference_clients_second_adapt(digits_model, backend):
    batches = shifted_batches(n_clients=3, batch=8, steps=4)
    readings, after = reference_ft(digits_model, batches, 1e-3)
    torch.manual_seed(0)
    local = build_local("tent", params="all", optimizer="adam", lr=1e-3, bn="running")
    eng = Engine(digits_model, local, build_strategy("fedavg_ft"), n_clients=3, backend=backend)
    probe = AdaptOutputs(eng.local)
    eng.local = probe
    differ = 0
    for b, want, want_after in zip(batches, readings, after):
        probe.calls.clear()
        res = eng.step(b)
        assert len(probe.calls) == 2  # the local step, then the fine-tuning step after mixing
        assert torch.equal(probe.calls[1], want)
        assert (res.correct_mixed == (want_after == b.labels).sum(1).numpy()).all()
        differ += int((want != want_after).sum())
    assert differ > 0  # the two readings are not the same predictions


@pytest.mark.usefixtures("certified_as_is")
def test_rerun_equals_the_plain_run_and_keeps_both_readings(tmp_path, monkeypatch):
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    cfg = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", corruptions=["gaussian_noise", "contrast"],
                           clients=4, batch_size=8, images_per_client=40, sh=0.5, th=0.2, device="cpu", seed=2,
                           local="tent", local_params={"params": "all", "optimizer": "adam", "lr": 3e-3,
                                                       "bn": "running"}, strategy="fedavg_ft")
    plain = run_experiment(cfg)
    from ftta_core.units import NON_SEMANTIC, unit_members

    summary = ft_forward_run(cfg, tmp_path / "run")
    assert not {m.split(":")[1] for m in unit_members("fedtsa.ft_forward")} & NON_SEMANTIC["fedtsa.ft_forward"]
    assert summary["accuracy"] == plain.summary["accuracy"]
    assert run_status(summary) == "current" and "fedtsa.ft_forward" in summary["code"]["units"]
    steps = pd.read_csv(tmp_path / "run" / "steps.csv")
    pd.testing.assert_series_equal(steps["correct_mixed"], plain.steps["correct_mixed"], check_dtype=False)
    assert summary["accuracy_ft_forward"] == pytest.approx(100 * steps[READING].sum() / steps["n"].sum())
    assert summary["accuracy_ft_forward"] != summary["accuracy"]
    assert ft_forward_run(cfg, tmp_path / "run")["accuracy_ft_forward"] == summary["accuracy_ft_forward"]  # read back
    with pytest.raises(ValueError, match="fedavg_ft"):
        ft_forward_run(ExperimentConfig(**{**cfg.to_dict(), "strategy": "fedavg"}), tmp_path / "other")


def test_migration_turns_a_current_reading_into_the_unit_record_a_reading_writes_now(tmp_path, monkeypatch):
    """``record_scope`` is the record ``ft_forward_run`` writes: the run's units and this module's computing
    definitions, not the modules it imports to find and tabulate readings (``fidelity``, the workbook); ``runs
    --migrate`` turns a current definition record of a reading into it, and leaves a stale one stale."""
    import json

    from ftta_core.fedtsa.ft_forward import RECORDED, is_record, record_scope
    from ftta_core.record_migration import migrate
    from ftta_core.runstore import definition_record_of, stale_modules

    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    cfg = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", corruptions=["gaussian_noise"],
                           clients=2, batch_size=8, images_per_client=16, device="cpu", seed=0, local="tent",
                           local_params={"params": "all", "optimizer": "adam", "lr": 1e-3, "bn": "running"},
                           strategy="fedavg_ft")
    summary = ft_forward_run(cfg, tmp_path / "run")
    assert summary["code"]["units"] == record_scope(cfg)["units"]
    assert "fedtsa.ft_forward" in summary["code"]["units"]
    assert not {"fidelity", "workbook", "fedtsa.table1", "paper"} & summary["code"]["units"].keys()
    assert is_record(summary) and not is_record({k: v for k, v in summary.items() if k != "accuracy_ft_forward"})

    former = definition_record_of(["ftta_core.build", "ftta_core.tta", "ftta_core.strategies.basic"],
                                  [f"{MODULE}:{name}" for name in RECORDED])
    stale = {**former, "definitions": {**former["definitions"], MODULE: {"ft_forward_run": "an older version"}}}
    for name, record in (("current.json", former), ("stale.json", stale)):
        (tmp_path / name).write_text(json.dumps({**summary, "code": record}, indent=1))
    assert migrate([tmp_path / "current.json", tmp_path / "stale.json"])["migrated"] == 1
    migrated = json.loads((tmp_path / "current.json").read_text())["code"]
    assert set(migrated["units"]) <= set(record_scope(cfg)["units"]) and "fedtsa.ft_forward" in migrated["units"]
    assert stale_modules(migrated) == []
    assert stale_modules(json.loads((tmp_path / "stale.json").read_text())["code"]) == [f"{MODULE}:ft_forward_run"]


def test_reading_compares_both_readings_with_the_paper():
    table = pd.DataFrame({"setting": ["niid", "niid"], "seed": [0, 1], "FedAvg": [60.0, 61.0],
                          "FedAvg+FT (stored)": [55.0, 56.0], "FedAvg+FT (re-run)": [55.0, 56.0],
                          "FedAvg+FT (reference reading)": [59.5, 60.9], "code": ["current", "current"]})
    table["ours - FedAvg"] = table["FedAvg+FT (re-run)"] - table["FedAvg"]
    table["reference reading - FedAvg"] = table["FedAvg+FT (reference reading)"] - table["FedAvg"]
    summary = ft_forward_summary(table)
    assert list(summary["FedAvg+FT - FedAvg"]) == ["ours", "reference reading"]
    assert summary["mean"].tolist() == pytest.approx([-5.0, -0.3]) and summary["paper"].iloc[0] == pytest.approx(-0.33)
    text = ft_forward_reading(table, summary)
    assert text.startswith("2 of 2 re-runs give exactly the stored")
    assert "-5.00 as we predict and -0.30 as the reference code reports it, the paper -0.33" in text
    assert "the reference reading is nearer the paper's" in text
    table.loc[1, "FedAvg+FT (re-run)"] = 56.5
    assert ft_forward_reading(table, summary).startswith("1 of 2 re-runs")
