"""The split Strategy contract (W only; opt-in ClientHooks and Scheduled), pFedBBN's declared interface to the local
method, and the one rule for integer tensors when models are mixed (engine, FedICON, FedAcross+)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ftta_core import register_strategy
from ftta_core.engine.average import average_models, mix_counters, mix_models
from ftta_core.experiment import ExperimentConfig, run_experiment
from ftta_core.strategies import STRATEGIES, build_strategy
from ftta_core.strategies.base import (ClientHooks, Scheduled, ServerInputs, Strategy, client_regularizer,
                                       lookahead_of, probe_uploads)
from ftta_core.tta.base import BNStatisticsSource


class WOnly(Strategy):
    """A strategy with nothing but ``collaboration``: half its own model, half the mean of the others."""

    def collaboration(self, inputs: ServerInputs) -> torch.Tensor:
        n = inputs.valid.shape[0]
        return 0.5 * torch.eye(n) + 0.5 * torch.ones(n, n) / n


@pytest.mark.parametrize("local", ["bn", "tent"])
def test_a_w_only_strategy_runs_on_both_backends(monkeypatch, local):
    monkeypatch.setitem(STRATEGIES, "w_only", WOnly)  # removed again after the test
    register_strategy("w_only", WOnly, replace=True)
    cfg = dict(dataset="embedded_digits", clients=4, images_per_client=40, batch_size=8, device="cpu",
               corruptions=["gaussian_noise", "fog"], local=local, strategy="w_only", max_steps=4)
    runs = {b: run_experiment(ExperimentConfig(**cfg, backend=b), server_threads=0) for b in ("loop", "vectorized")}
    np.testing.assert_array_equal(runs["loop"].collaboration, runs["vectorized"].collaboration)
    np.testing.assert_allclose(runs["loop"].collaboration[0], WOnly().collaboration(
        ServerInputs(0, {}, {}, torch.ones(4, dtype=torch.bool))).numpy())
    assert runs["loop"].steps["correct_mixed"].tolist() == runs["vectorized"].steps["correct_mixed"].tolist()
    s = WOnly()
    assert client_regularizer(s, None, torch.zeros(1)) is None and probe_uploads(s, None, None, None, 0) == {}
    assert lookahead_of(s) == () and not isinstance(s, (ClientHooks, Scheduled))


def test_hooks_are_declared_contracts():
    assert isinstance(build_strategy("fedprox"), ClientHooks) and isinstance(build_strategy("fedctta"), ClientHooks)
    assert isinstance(build_strategy("pfedbbn"), ClientHooks) and isinstance(build_strategy("fedtsa"), Scheduled)
    assert not isinstance(build_strategy("fedavg"), (ClientHooks, Scheduled))
    assert lookahead_of(build_strategy("fedtsa")) == ("indicator",)
    with pytest.raises(TypeError, match="ClientHooks"):  # a hook the engine would never call is refused
        type("Undeclared", (Strategy,), {"collaboration": WOnly.collaboration, "regularizer": lambda s, b, x: None})
    with pytest.raises(TypeError, match="Scheduled"):
        type("Undeclared", (Strategy,), {"collaboration": WOnly.collaboration, "plan_rounds": lambda *a: None})
    with pytest.raises(TypeError, match="abstract"):  # Scheduled without plan_rounds
        type("NoPlan", (Scheduled, Strategy), {"collaboration": WOnly.collaboration})()


def test_pfedbbn_reads_the_declared_bn_statistics():
    from ftta_core.tta import build_local

    assert isinstance(build_local("bbn"), BNStatisticsSource) and isinstance(build_local("rotta"), BNStatisticsSource)
    assert not isinstance(build_local("bn"), BNStatisticsSource)

    class Declares:
        def bn_statistics(self, bank):
            return {"layer": torch.arange(12.0).view(2, 2, 3)}

    ups = build_strategy("pfedbbn").probe_uploads(None, Declares(), torch.zeros(2, 1), 0)
    assert list(ups) == ["bbn_stats.layer"] and torch.equal(ups["bbn_stats.layer"], torch.arange(12.0).view(2, 2, 3))


def test_integer_tensors_are_counters_taking_the_largest_count():
    w = torch.tensor([[0.3, 0.7, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    counts = torch.tensor([10, 10, 99])
    # a weighted mean truncated to an integer would give 9 (0.3 * 10 + 0.7 * 10 = 9.999...)
    assert mix_counters(counts, w).tolist() == [10, 10, 99]
    assert mix_counters(torch.tensor([4, 7, 99]), w).tolist() == [7, 7, 99]
    mixed = mix_models({"w": torch.tensor([[1.0], [3.0], [5.0]]), "n": torch.tensor([4, 7, 99])}, w)
    torch.testing.assert_close(mixed["w"], torch.tensor([[2.4], [3.0], [5.0]]))
    assert mixed["n"].dtype == torch.int64 and mixed["n"].tolist() == [7, 7, 99]
    # the engine's mix follows the same rule (Strategy.mix)
    assert build_strategy("fedavg").mix({"n": torch.tensor([4, 7, 99])}, w)["n"].tolist() == [7, 7, 99]


def test_fedicon_and_fedacross_average_through_the_kernel():
    from ftta_core.fedacross import merge_adapters
    from ftta_core.fedicon import average_states

    g = torch.Generator().manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)) for _ in range(3)]
    for i, net in enumerate(nets):
        net[0].weight.data = torch.randn(2, 3, generator=g)
        net[1].num_batches_tracked += i + 1
    states = [n.state_dict() for n in nets]
    w = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    expected = sum(wi * s["0.weight"].double() for wi, s in zip(w, states)).float()
    for avg in (average_models(states, w), average_states(states, w, list(states[0])),
                merge_adapters(states, [2, 3, 5])):
        torch.testing.assert_close(avg["0.weight"], expected, rtol=0, atol=1e-7)
        assert avg["1.num_batches_tracked"].item() == 3  # the largest count
    # a client with zero weight takes no part, its count included
    assert merge_adapters(states, [1, 1, 0])["1.num_batches_tracked"].item() == 2
