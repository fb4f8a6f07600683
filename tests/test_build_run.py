"""``build_run``: every runner (run_experiment, run_strategies, fedctta.study.run_live, leakage.collect_uploads, the
Flower server) builds through it and gives the same result on the same config, participation included; a run gives
torch its thread count back, also when a step fails."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ftta_core.build import Recorder, build_run, build_strategy_for, run_length
from ftta_core.loop import run_steps
from ftta_core.experiment import ExperimentConfig, run_experiment, run_strategies
from studies.fedctta.study import run_live
from ftta_core.leakage import collect_uploads

BASE = dict(dataset="embedded_digits", scenario="heterogeneity", corruptions=["gaussian_noise", "fog"], clients=4,
            images_per_client=40, batch_size=8, sh=0.5, th=0.2, device="cpu")


def config(**kw) -> ExperimentConfig:
    return ExperimentConfig(**{**BASE, **kw})


@pytest.fixture(scope="module")
def partial() -> ExperimentConfig:
    return config(local="bn", strategy="fedamp", participation=0.6)


@pytest.fixture(scope="module")
def reference(partial):
    return run_experiment(partial, server_threads=0)


def test_run_live_equals_run_experiment_and_honours_participation(partial, reference):
    live = run_live(partial, build_strategy_for(partial))
    assert reference.summary["absent_uploads"] > 0  # participation 0.6: some uploads are absent
    assert live.summary["absent_uploads"] == reference.summary["absent_uploads"]
    cols = ["step", "client", "domain", "correct_source", "correct_local", "correct_mixed", "absent", "rejected"]
    assert live.steps[cols].equals(reference.steps[cols])
    np.testing.assert_array_equal(live.collaboration, reference.collaboration)


def test_shared_pass_equals_run_experiment_with_participation(partial, reference):
    shared = run_strategies(dataclasses.replace(partial, strategy="fedavg"), ["fedamp", "fedavg"], server_threads=0)
    np.testing.assert_array_equal(shared["fedamp"].collaboration, reference.collaboration)
    assert shared["fedamp"].steps["correct_mixed"].tolist() == reference.steps["correct_mixed"].tolist()
    assert shared["fedamp"].summary["absent_uploads"] == reference.summary["absent_uploads"]


def test_leakage_collects_only_the_uploads_that_reach_the_server(partial, reference):
    collected = collect_uploads(partial)
    present = reference.steps[~reference.steps["absent"]]
    assert len(collected.steps) == len(present)
    assert collected.steps.tolist() == present["step"].tolist()
    assert collected.clients.tolist() == present["client"].tolist()
    assert all(len(v) == len(present) for v in collected.uploads.values())


def test_flower_server_draws_the_engines_participation():
    pytest.importorskip("flwr")
    from ftta_core.flower import run_engine_on_flower

    cfg = config(local="bn", strategy="fedavg", backend="loop", participation=0.6, max_steps=3)
    ref = run_experiment(cfg, server_threads=0)
    run = run_engine_on_flower(cfg)
    absent = ref.steps.pivot(index="step", columns="client", values="absent").to_numpy()
    assert absent.any()
    np.testing.assert_array_equal(np.asarray(run.record["absent"]), absent)
    np.testing.assert_allclose(np.stack(run.weights), ref.collaboration, atol=1e-6, rtol=0)
    correct = (torch.stack(run.logits).argmax(-1) == torch.stack(run.labels)).sum(-1).numpy()
    np.testing.assert_array_equal(correct, ref.steps.pivot(index="step", columns="client",
                                                           values="correct_mixed").to_numpy())


def test_build_run_applies_the_configs_length_and_smoke_cap():
    cfg = config(smoke=True, images_per_client=200, th=0.1)
    with build_run(cfg, server_threads=0) as run:
        assert run.n_steps == run_length(cfg, run.stream) == min(2 * run.stream.scenario.slot_steps, 20)
        assert run.n_steps < len(run.stream)
        assert run.engine.participation == cfg.participation and run.engine.seed == cfg.seed
        assert isinstance(run.recorder(), Recorder)


def _lookahead_config() -> ExperimentConfig:
    return config(local="bn", strategy="fedtsa", strategy_params={"server_steps": 2}, max_steps=4)


def test_a_run_restores_torchs_thread_count():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # rounds ahead on CPU halve the clients' threads while the run lasts
        res = run_experiment(_lookahead_config(), server_threads=None)
        assert res.summary["server_threads"] >= 1
        assert torch.get_num_threads() == 2
        with build_run(_lookahead_config()) as run:
            run_steps(run.engine, run.stream, stop=run.n_steps)
            assert torch.get_num_threads() == 2  # run_steps closes the engine itself
    finally:
        torch.set_num_threads(before)


def test_a_failing_step_still_restores_the_thread_count(monkeypatch):
    import ftta_core.loop as loop_mod

    before = torch.get_num_threads()
    calls = {"n": 0}
    original = loop_mod.Engine.step

    def flaky(self, batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return original(self, batch)

    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(loop_mod.Engine, "step", flaky)
        with build_run(_lookahead_config()) as run, pytest.raises(RuntimeError, match="boom"):
            run_steps(run.engine, run.stream, stop=run.n_steps)
        assert calls["n"] == 2 and torch.get_num_threads() == 2
        calls["n"] = 0
        with pytest.raises(RuntimeError, match="boom"):
            run_experiment(_lookahead_config())
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
