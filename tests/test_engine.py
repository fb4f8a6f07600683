"""The engine loop: W validity, upload rejection, mixing kernel, config validation, resume and the CLI."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from ftta_core.loop import Engine
from ftta_core.engine.mixing import mix_state, restrict_to_valid, validate_uploads
from ftta_core.experiment import ExperimentConfig, run_experiment
from ftta_core.strategies import build_strategy
from ftta_core.tta import build_local
from ftta_core.tta.base import LocalMethod

from conftest import shifted_batches


def test_mix_state_is_one_matmul_over_all_tensors():
    gen = torch.Generator().manual_seed(0)
    state = {"a": torch.randn(3, 4, generator=gen), "b": torch.randn(3, 2, 5, generator=gen)}
    w = torch.softmax(torch.randn(3, 3, generator=gen), 1)
    mixed = mix_state(state, w)
    for k, v in state.items():
        expected = torch.einsum("ij,j...->i...", w, v)
        assert torch.allclose(mixed[k], expected, atol=1e-6)


def test_restrict_to_valid_keeps_rejected_clients_on_their_own_model():
    w = torch.full((4, 4), 0.25)
    valid = torch.tensor([True, False, True, True])
    r = restrict_to_valid(w, valid)
    assert torch.allclose(r.sum(1), torch.ones(4))
    assert torch.equal(r[1], torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert (r[[0, 2, 3], 1] == 0).all()


def test_validate_uploads_rejects_nan_inf_shape_and_missing():
    good = {"m": torch.ones(3)}
    ups = [good, {"m": torch.tensor([1.0, float("nan"), 1.0])}, {"m": torch.ones(4)}, {},
           {"m": torch.tensor([float("inf"), 0, 0])}]
    stacked, valid, reasons = validate_uploads(ups, {"m": (3,)})
    assert valid.tolist() == [True, False, False, False, False]
    assert "NaN" in reasons[1] and "shape" in reasons[2] and "missing" in reasons[3] and "Inf" in reasons[4]
    assert torch.isfinite(stacked["m"]).all()


class PoisonedBN:
    """Wraps BN adaptation so that client 1's uploaded statistics are NaN (a faulty device)."""

    def __new__(cls):
        local = build_local("bn")
        original = local.shared_state

        def poisoned(bank):
            state = original(bank)
            return {k: torch.where(torch.arange(v.shape[0]).view(-1, 1, 1) == 1, torch.nan, v) for k, v in state.items()}

        local.shared_state = poisoned
        return local


def given_stats(bank):
    """The BN statistics [N, 2, C] installed in every client (both backends)."""
    if hasattr(bank, "models"):
        return [torch.stack(list(t)) for t in zip(*[[m.given for m in bank._bns(i).values()]
                                                     for i in range(bank.n_clients)])]
    return [m.given for m in bank._bns.values()]


@pytest.mark.parametrize("strategy", ["fedavg", "fedamp", "pfedgraph"])
@pytest.mark.parametrize("backend", ["loop", "vectorized"])
def test_nan_upload_is_rejected_without_corrupting_others(digits_model, backend, strategy):
    batches = shifted_batches(n_clients=4, batch=8, steps=2)
    bad = Engine(digits_model, PoisonedBN(), build_strategy(strategy), 4, backend)
    alone = Engine(digits_model, build_local("bn"), build_strategy(strategy), 3, backend)
    keep = [0, 2, 3]
    for b in batches:
        rb = bad.step(b)
        assert rb.rejected.tolist() == [False, True, False, False]
        assert np.allclose(rb.weights.sum(1), 1) and rb.weights[1, 1] == 1 and (rb.weights[keep, 1] == 0).all()
        assert all(torch.isfinite(g[keep]).all() for g in given_stats(bad.bank))
        if strategy == "fedavg":  # exactly as if client 1 did not exist
            sub = type(b)(b.step, b.images[keep], b.labels[keep], b.domains[keep], b.indices[keep])
            ra = alone.step(sub)
            assert (ra.correct_mixed == rb.correct_mixed[keep]).all()


def test_local_strategy_equals_local_method_and_fedavg_shares(digits_model):
    batches = shifted_batches(n_clients=4, batch=8, steps=2)
    eng = Engine(digits_model, build_local("bn"), build_strategy("local"), 4, "vectorized")
    for b in batches:
        r = eng.step(b)
        assert np.allclose(r.weights, np.eye(4))
        assert (r.correct_mixed == r.correct_local).all()


def test_config_errors_name_the_field():
    for field, value in [("local", "nope"), ("strategy", "nope"), ("dataset", "mnist3"), ("clients", 0),
                         ("sh", 1.5), ("severity", 9), ("backend", "gpu"), ("corruptions", ["fog", "smog"]),
                         ("label_alpha", -1.0), ("device", "tpu")]:
        with pytest.raises(ValueError, match=repr(field)):
            ExperimentConfig(**{field: value})
    with pytest.raises(ValueError, match="unknown config field"):
        ExperimentConfig.from_dict({"cleints": 3})
    with pytest.raises(ValueError, match="local_params.*'lr'"):
        ExperimentConfig(local="bn", local_params={"lr": 0.1})
    with pytest.raises(ValueError, match="local_params.*optimizer"):
        ExperimentConfig(local="tent", local_params={"optimizer": "rmsprop"})
    with pytest.raises(ValueError, match="strategy_params.*'beta'"):
        ExperimentConfig(strategy="fedavg", strategy_params={"beta": 0.9})


SMALL = dict(dataset="embedded_digits", scenario="heterogeneity", corruptions=["gaussian_noise", "contrast"],
             clients=4, batch_size=8, images_per_client=40, sh=0.5, th=0.2, device="cpu")  # 5-step slots


def test_same_seed_same_table_and_resume_without_loss_or_duplicates(tmp_path, monkeypatch):
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    cfg = ExperimentConfig(**SMALL, local="tent", local_params={"params": "bn_affine", "lr": 1e-3},
                           strategy="fedavg", seed=1)
    full = run_experiment(cfg, out=tmp_path / "full")
    again = run_experiment(cfg)
    pd.testing.assert_frame_equal(full.steps, again.steps)
    assert len(full.steps) == 4 * 10 and full.collaboration.shape == (10, 4, 4)

    class Interrupt(Exception):
        pass

    import ftta_core.loop as loop_mod

    calls = {"n": 0}
    original = loop_mod.Engine.step

    def flaky(self, batch):
        calls["n"] += 1
        if calls["n"] == 8:  # die inside the second slot (slots are 5 steps)
            raise Interrupt
        return original(self, batch)

    monkeypatch.setattr(loop_mod.Engine, "step", flaky)
    with pytest.raises(Interrupt):
        run_experiment(cfg, out=tmp_path / "resumed")
    partial = pd.read_csv(tmp_path / "resumed" / "steps.csv")
    assert partial["step"].max() == 4  # the first slot was committed
    monkeypatch.setattr(loop_mod.Engine, "step", original)
    resumed = run_experiment(cfg, out=tmp_path / "resumed")
    pd.testing.assert_frame_equal(resumed.steps.reset_index(drop=True), full.steps.reset_index(drop=True),
                                  check_dtype=False)
    assert np.allclose(resumed.collaboration, full.collaboration)
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert summary["accuracy"] == pytest.approx(full.summary["accuracy"])
    for key in ("accuracy", "accuracy_local", "accuracy_source", "config", "versions", "device", "wall_time_s"):
        assert key in summary
    w = np.load(tmp_path / "resumed" / "collaboration.npz")["W"]
    assert w.shape == (10, 4, 4)


def test_cli_run_writes_outputs(tmp_path, monkeypatch, capsys):
    from ftta_core.cli import main

    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    rc = main(["run", "--dataset", "embedded_digits", "--scenario", "heterogeneity", "--clients", "4",
               "--corruptions", "gaussian_noise,contrast", "--local", "bn", "--strategy", "fedavg", "--seed", "0",
               "--device", "cpu", "--images-per-client", "40", "--batch-size", "8", "--sh", "0.5", "--th", "0.5",
               "--out", str(tmp_path / "run"), "--smoke"])
    assert rc == 0
    assert {"summary.json", "steps.csv", "collaboration.npz"} <= {p.name for p in (tmp_path / "run").iterdir()}
    assert "mixed" in capsys.readouterr().out
    assert main(["run", "--local", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "'local'" in capsys.readouterr().err


def test_mix_state_ignores_nan_rows_nobody_uses():
    state = {"a": torch.tensor([[1.0, 2.0], [float("nan"), 0.0], [3.0, 4.0]])}
    w = restrict_to_valid(torch.full((3, 3), 1 / 3), torch.tensor([True, False, True]))
    mixed = mix_state(state, w)["a"]
    assert torch.allclose(mixed[0], torch.tensor([2.0, 3.0])) and torch.allclose(mixed[2], torch.tensor([2.0, 3.0]))


def test_strategies_sharing_the_local_phase_equal_separate_runs(tmp_path, monkeypatch):
    from ftta_core.experiment import run_strategies

    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    cfg = ExperimentConfig(**SMALL, local="bn", seed=2, max_steps=6)
    names = ["local", "fedavg", "fedprox", "fedamp", "pfedgraph", "fedavgm", "fedctta", "moon"]
    predictions = []
    original = LocalMethod.predict
    monkeypatch.setattr(LocalMethod, "predict", lambda self, *a: predictions.append(1) or original(self, *a))
    shared = run_strategies(cfg, names)
    # FedProx and MOON mix BN statistics exactly like FedAvg: their prediction is reused, not recomputed
    assert len(predictions) == 6 * (len(names) - 2)
    monkeypatch.setattr(LocalMethod, "predict", original)
    for name in names:
        alone = run_experiment(ExperimentConfig(**SMALL, local="bn", seed=2, max_steps=6, strategy=name))
        pd.testing.assert_frame_equal(shared[name].steps, alone.steps)
        assert np.allclose(shared[name].collaboration, alone.collaboration, atol=1e-6)
        assert shared[name].summary["accuracy"] == alone.summary["accuracy"]
    with pytest.raises(ValueError, match="trains or carries state"):
        run_strategies(ExperimentConfig(**SMALL, local="tent", max_steps=2), ["fedavg"])


def test_the_run_seed_reaches_local_methods_that_draw_random_numbers():
    from ftta_core.experiment import local_params

    assert local_params(ExperimentConfig(**SMALL, local="rotta", seed=3))["seed"] == 3
    assert local_params(ExperimentConfig(**SMALL, local="rotta", local_params={"seed": 5}, seed=3))["seed"] == 5
    assert "seed" not in local_params(ExperimentConfig(**SMALL, local="tent", seed=3))


def test_absent_clients_are_left_out_of_w_and_keep_their_own_model(tmp_path, monkeypatch):
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    cfg = ExperimentConfig(**{**SMALL, "clients": 6, "sh": 1 / 3}, local="bn", strategy="fedavg", seed=4,
                           participation=0.5)
    res = run_experiment(cfg)
    absent = res.steps.pivot(index="step", columns="client", values="absent").to_numpy()
    assert 0.2 < absent.mean() < 0.8  # each client reports with probability 0.5
    for t, w in enumerate(res.collaboration):
        gone = absent[t]
        assert np.allclose(w[gone], np.eye(6)[gone])  # an absent client keeps its own model
        assert np.allclose(w[~gone][:, gone], 0)  # nobody mixes it in
        if (~gone).sum():
            assert np.allclose(w[~gone][:, ~gone], 1 / (~gone).sum())  # FedAvg over the clients that reported
    again = run_experiment(cfg)
    pd.testing.assert_frame_equal(res.steps, again.steps)  # the draws come from the seed
    assert res.summary["absent_uploads"] == int(absent.sum())


def test_participation_is_validated_and_its_default_keeps_stored_keys():
    from ftta_core.workbook import config_key

    with pytest.raises(ValueError, match="'participation'"):
        ExperimentConfig(**SMALL, participation=0.0)
    cfg = ExperimentConfig(**SMALL)
    stored = {k: v for k, v in cfg.to_dict().items() if k != "participation"}  # a run stored before the field
    assert config_key(ExperimentConfig.from_dict(stored)) == config_key(cfg)
    assert "participation" not in cfg.identity()
