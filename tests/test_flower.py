"""Flower (flwr 1.41, Message API, in-process grid): the generic engine adapter agrees with the loop engine, and
FedAcross+ runs as a ServerApp + ClientApp with a FedAvg merge of A."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ftta_core.loop import Engine
from ftta_core.experiment import ExperimentConfig, build_stream, local_params, run_experiment, strategy_params
from ftta_core.fedacross import ClientSpec, ModelSpec, build_model, merge_adapters, run_client
from studies.fedacross.study import ClientFeatures, support_indices
from ftta_core.flower import run_engine_on_flower, run_fedacross_on_flower
from ftta_core.rng import derive_seed, torch_generator
from ftta_core.strategies import build_strategy
from ftta_core.training import load_source_model
from ftta_core.tta import build_local

TOLERANCE = 1e-6  # max |logit difference| allowed; observed 0 (the same float operations in the same order)


def _engine_logits(cfg: ExperimentConfig, stream, steps: int):
    """Loop-backend engine, step by step: W and the logits of the mixed models."""
    torch.manual_seed(derive_seed(cfg.seed, "engine"))
    engine = Engine(load_source_model(cfg.model_name), build_local(cfg.local, **local_params(cfg)),
                    build_strategy(cfg.strategy, **strategy_params(cfg)), cfg.clients, "loop", "cpu")
    weights, logits = [], []
    for t in range(steps):
        batch = stream.batch(t)
        weights.append(engine.step(batch).weights)
        logits.append(engine.local.predict(engine.bank, batch.images).logits)
    return np.stack(weights), torch.stack(logits)


@pytest.mark.parametrize("strategy", ["fedavg", "fedamp"])
def test_flower_adapter_equals_loop_engine(strategy):
    cfg = ExperimentConfig(dataset="embedded_digits", clients=4, local="bn", strategy=strategy, backend="loop",
                           device="cpu", max_steps=3, seed=0)
    stream = build_stream(cfg, "cpu")
    run = run_engine_on_flower(cfg, stream=stream)
    assert run.messages == (3 + 1) * 4  # one message per client per step (mix of t-1 + batch t), one final
    assert run.record["status"] == "finished" and not any(map(any, run.record["absent"] + run.record["rejected"]))
    weights, logits = _engine_logits(cfg, stream, 3)
    np.testing.assert_allclose(np.stack(run.weights), weights, atol=TOLERANCE, rtol=0)
    flower_logits = torch.stack(run.logits)
    assert float((flower_logits - logits).abs().max()) <= TOLERANCE
    # and the predictions' correctness equals run_experiment's table, step by step and client by client
    res = run_experiment(cfg, stream=stream)
    correct = (flower_logits.argmax(-1) == torch.stack(run.labels)).sum(-1).numpy()
    expected = res.steps.pivot(index="step", columns="client", values="correct_mixed").to_numpy()
    np.testing.assert_array_equal(correct, expected)
    np.testing.assert_allclose(np.stack(run.weights), res.collaboration, atol=TOLERANCE, rtol=0)


def _toy_clients(n: int) -> list:
    """Clients whose backbone features are class centres + a client-specific shift + noise."""
    gen = torch_generator(0, "flower-test")
    centres = 3 * torch.randn(10, 512, generator=gen)
    out = []
    for i in range(n):
        shift = torch.randn(512, generator=gen)
        ys, yt = torch.arange(60) % 10, torch.arange(40) % 10
        xs = centres[ys] + shift + 0.5 * torch.randn(60, 512, generator=gen)
        xt = centres[yt] + shift + 0.5 * torch.randn(40, 512, generator=gen)
        out.append(ClientFeatures(f"c{i}", xs, ys, xt, yt))
    return out


def test_fedacross_on_flower_merges_a_and_admits_new_clients():
    model = build_model(ModelSpec("resnet18", "imagenet", 10, 32), seed=0)
    clients, spec = _toy_clients(3), ClientSpec(epochs=5)
    run = run_fedacross_on_flower(model, clients, k=3, selection="vessal", n_new=1, new_client_steps=2, spec=spec)
    assert set(run.accuracy) == {"client 0", "client 1"}  # client 2 joins in round 2
    # the server's merge is the FedAvg of what the clients computed (recomputed here without Flower)
    direct = []
    for c in clients[:2]:
        idx = support_indices("vessal", model, c, 3, 0, c.name)
        direct.append(run_client(model, c.stream[idx], c.stream_labels[idx], spec, None, 0, c.name))
    expected = merge_adapters([r.adapter for r in direct], [r.n_support for r in direct])
    for k, v in expected.items():
        torch.testing.assert_close(run.merged[k], v)
    assert {r["start"] for r in run.new_client} == {"server A", "merged A (FedAvg)"}
    assert all(set(p) == {"centres", "classes"} for p in run.prototypes.values())
    a_bytes = sum(v.numel() * v.element_size() for v in expected.values())
    assert a_bytes * 4 <= run.bytes_down < 2 * a_bytes * 4  # 2 initial + 2 joins (one per start) of A, plus headers
