"""``bn='running'``: the FL papers' reference TTA-grad client (train-mode BN with running statistics, eval-mode
prediction, whole state mixed), FedCTTA's eval-mode probes and FedAvgM's parameter-only momentum."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

from ftta_core.loop import Engine
from ftta_core.strategies import build_strategy
from ftta_core.strategies.fedctta import similarity_matrix
from ftta_core.strategies.base import ServerInputs
from ftta_core.tta import build_local
from ftta_core.tta.running import RUNNING_PREFIX, RunningStatistics

from conftest import shifted_batches

pytestmark = pytest.mark.usefixtures("one_thread")


def entropy_loss(logits):
    return -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean()


def reference_clients(model, batches, lr, mix, keep_statistics=False):
    """The reference code's clients as plain modules: adapt in train mode (Adam, entropy), then, with ``mix``, the
    server averages every client's whole state_dict (parameters and BN running statistics; with ``keep_statistics``
    the parameters only, each client keeping its running statistics); predict in eval mode."""
    n = batches[0].images.shape[0]
    nets = [copy.deepcopy(model) for _ in range(n)]
    opts = [torch.optim.Adam(net.parameters(), lr=lr) for net in nets]
    logits = []
    for b in batches:
        for i, (net, opt) in enumerate(zip(nets, opts)):
            net.train()
            loss = entropy_loss(net(b.images[i]))
            opt.zero_grad()
            loss.backward()
            opt.step()
        if mix:
            states = [net.state_dict() for net in nets]
            avg = {k: torch.stack([s[k].float() for s in states]).mean(0).to(states[0][k].dtype)
                   for k in states[0] if not k.endswith("num_batches_tracked")
                   and not (keep_statistics and k.endswith(("running_mean", "running_var")))}
            for net in nets:
                net.load_state_dict(avg, strict=False)
        with torch.no_grad():
            logits.append(torch.stack([net.eval()(b.images[i]) for i, net in enumerate(nets)]))
    return logits, nets


@pytest.mark.parametrize("backend", ["loop", "vectorized"])
@pytest.mark.parametrize("strategy", ["local", "fedavg", "fedavg_localstats"])
def test_running_bn_is_the_reference_client(digits_model, backend, strategy):
    batches = shifted_batches(n_clients=3, batch=8, steps=4)
    want, nets = reference_clients(digits_model, batches, 1e-3, mix=strategy != "local",
                                   keep_statistics=strategy == "fedavg_localstats")
    torch.manual_seed(0)
    local = build_local("tent", params="all", optimizer="adam", lr=1e-3, bn="running")
    eng = Engine(digits_model, local, build_strategy(strategy), n_clients=3, backend=backend)
    for b, ref in zip(batches, want):
        eng.step(b)
        got = local.predict(eng.bank, b.images.to(torch.float32)).logits
        # float32 rounding differs (x * scale + shift vs torch.batch_norm) and Adam amplifies it: 1e-3 on logits ~10
        assert torch.allclose(got, ref, atol=1e-3), (got - ref).abs().max()
        assert (got.argmax(-1) == ref.argmax(-1)).all()
    # the running statistics are the modules' running buffers, client by client
    state = local.shared_state(eng.bank)
    for name, m in nets[0].named_modules():
        if isinstance(m, nn.BatchNorm2d):
            stats = state[RUNNING_PREFIX + name]
            for i, net in enumerate(nets):
                buf = dict(net.named_buffers())
                assert torch.allclose(stats[i, 0], buf[f"{name}.running_mean"], atol=1e-4)
                assert torch.allclose(stats[i, 1], buf[f"{name}.running_var"], atol=1e-4, rtol=1e-4)


def test_running_statistics_are_updated_shared_and_used(digits_model):
    batches = shifted_batches(n_clients=2, batch=8, steps=2)
    local = build_local("tent", params="all", optimizer="sgd", lr=1e-3, bn="running")
    eng = Engine(digits_model, local, build_strategy("local"), n_clients=2)
    eng.step(batches[0])
    state = local.shared_state(eng.bank)
    keys = [k for k in state if k.startswith(RUNNING_PREFIX)]
    bn_layers = [n for n, m in digits_model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert sorted(keys) == sorted(RUNNING_PREFIX + n for n in bn_layers)
    first = dict(digits_model.named_buffers())
    mean0 = state[keys[0]][:, 0]
    src = first[keys[0][len(RUNNING_PREFIX):] + ".running_mean"]
    assert not torch.allclose(mean0[0], src)  # moved towards the batch ...
    assert not torch.allclose(mean0[0], mean0[1])  # ... of each client
    x = batches[1].images
    before = local.predict(eng.bank, x).logits
    local.load_state(eng.bank, {**state, keys[0]: state[keys[0]] * 2})
    assert not torch.allclose(local.predict(eng.bank, x).logits, before)  # predictions read the running statistics


def test_running_update_by_hand():
    norm = RunningStatistics(momentum=0.1)
    norm.n_clients = 1
    x = torch.arange(8.0).view(1, 2, 1, 4)  # one client, 2 images, 1 channel, 4 pixels: values 0..7
    norm.training = True
    mean, var = norm("l", x, slice(0, 1), torch.zeros(1), torch.ones(1))
    assert mean.item() == pytest.approx(3.5) and var.item() == pytest.approx(5.25)  # biased variance normalises
    state = norm.state["l"][0]
    assert state[0].item() == pytest.approx(0.35) and state[1].item() == pytest.approx(0.9 + 0.1 * 6.0)  # unbiased
    norm.training = False
    mean, var = norm("l", x, slice(0, 1), torch.zeros(1), torch.ones(1))
    assert mean.item() == pytest.approx(0.35) and var.item() == pytest.approx(1.5)


def test_running_bn_resumes_exactly(digits_model):
    batches = shifted_batches(n_clients=2, batch=8, steps=3)
    make = lambda: Engine(digits_model, build_local("pl", params="all", optimizer="adam", lr=1e-3, bn="running"),  # noqa: E731
                          build_strategy("fedavg"), n_clients=2)
    torch.manual_seed(0)
    full = make()
    want = [full.step(b).correct_mixed for b in batches]
    torch.manual_seed(0)
    first = make()
    first.step(batches[0])
    state = copy.deepcopy(first.state_dict())
    second = make()
    second.load_state_dict(state)
    got = [second.step(b).correct_mixed for b in batches[1:]]
    assert all((a == b).all() for a, b in zip(want[1:], got))


def test_bad_bn_semantics_named():
    with pytest.raises(ValueError, match="bn"):
        build_local("tent", bn="train")
    with pytest.raises(ValueError, match="bn_momentum"):
        build_local("tent", bn="running", bn_momentum=0.0)


def test_fedctta_eval_probes_use_running_statistics(digits_model):
    """probe_bn='eval' with bn='running': the probe logits are the client's eval-mode model on the probes."""
    batches = shifted_batches(n_clients=2, batch=8, steps=1)
    local = build_local("tent", params="all", optimizer="adam", lr=1e-3, bn="running")
    strat = build_strategy("fedctta", probe_bn="eval", n_probes=5)
    eng = Engine(digits_model, local, strat, n_clients=2, backend="loop")
    phase = eng.local_phase(batches[0], strat)
    x = phase.x
    got = strat.probe_uploads(eng.bank, local, x, 0)["probe_mean"]
    _, nets = reference_clients(digits_model, batches, 1e-3, mix=False)
    probes = strat.probe_inputs(0, 2, tuple(x.shape[2:]))
    with torch.no_grad():
        want = torch.stack([net.eval()(probes[i]).mean(0) for i, net in enumerate(nets)])
    assert torch.allclose(got, want, atol=1e-4)


def test_fedctta_eval_probes_under_tta_bn_use_the_previous_aggregation(digits_model):
    batches = shifted_batches(n_clients=3, batch=8, steps=2)
    local = build_local("bn")
    strat = build_strategy("fedctta", probe_bn="eval", n_probes=5)
    eng = Engine(digits_model, local, strat, n_clients=3)
    phase = eng.local_phase(batches[0], strat)
    first = strat.probe_uploads(eng.bank, local, phase.x, 0)["probe_mean"]
    probes = strat.probe_inputs(0, 3, tuple(phase.x.shape[2:]))
    with torch.no_grad():
        source = digits_model.eval()(probes[0]).mean(0)
    assert torch.allclose(first, source.expand(3, -1), atol=1e-5)  # before any aggregation: source statistics
    eng.server_phase(phase, strat)
    mixed = strat.state_dict()["mixed"]
    phase = eng.local_phase(batches[1], strat)
    second = strat.probe_uploads(eng.bank, local, phase.x, 1)["probe_mean"]
    eng.bank.set_bn_stats(mixed)
    want = eng.bank.forward(strat.probe_inputs(1, 3, tuple(phase.x.shape[2:])), "given").logits.mean(1)
    assert torch.allclose(second, want, atol=1e-5)
    assert not torch.allclose(second, first)


@pytest.mark.parametrize("backend", ["vectorized", "loop"])
def test_fedctta_eval_probes_under_tta_bn_with_shared_probes_are_fedavg(digits_model, backend):
    """Eval-mode probes under TTA-bn see the last mix's statistics: with one shared probe set every client computes
    the same probe output, so W is uniform mixing from the first step on and FedCTTA predicts as FedAvg; each client's
    own probes break the tie (the reference code's ``probes='per_client'``)."""
    batches = shifted_batches(n_clients=3, batch=8, steps=4)
    runs = {}
    for name, strat in (("fedavg", build_strategy("fedavg")),
                        ("shared", build_strategy("fedctta", probe_bn="eval", n_probes=5)),
                        ("per_client", build_strategy("fedctta", probe_bn="eval", n_probes=5, probes="per_client"))):
        eng = Engine(digits_model, build_local("bn"), strat, n_clients=3, backend=backend)
        runs[name] = [eng.step(b) for b in batches]
    for fedavg, shared in zip(runs["fedavg"], runs["shared"]):
        assert np.allclose(shared.weights, 1 / 3, atol=1e-6)
        assert (shared.correct_mixed == fedavg.correct_mixed).all()
    assert not np.allclose(runs["per_client"][0].weights, 1 / 3, atol=1e-6)


def test_reference_code_similarity_forms_by_hand():
    s = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    cos = similarity_matrix(s, "cosine")
    assert torch.allclose(similarity_matrix(s, "cosine_exp"), cos.exp())
    assert torch.allclose(similarity_matrix(s, "kl_exp"), similarity_matrix(s, "kl").exp())
    assert similarity_matrix(s, "cosine_exp")[0, 1].item() == pytest.approx(1.0)  # exp(cos 90 degrees) = exp(0)


def test_fedavgm_momentum_on_parameters_only_equals_fedavg_under_tta_bn(digits_model):
    batches = shifted_batches(n_clients=3, batch=8, steps=3)
    out = {}
    for name, params in (("fedavg", {}), ("params", {"momentum_on": "params"}), ("all", {})):
        strat = build_strategy("fedavg" if name == "fedavg" else "fedavgm", **params)
        eng = Engine(digits_model, build_local("bn"), strat, n_clients=3)
        out[name] = [eng.step(b).correct_mixed for b in batches]
        out[name + "_state"] = eng.bank.bn_stats()
    assert all((a == b).all() for a, b in zip(out["fedavg"], out["params"]))
    with pytest.raises(ValueError, match="momentum_on"):
        build_strategy("fedavgm", momentum_on="stats")


def test_fedavgm_parameter_only_momentum_by_hand():
    strat = build_strategy("fedavgm", beta=0.5, momentum_on="params")
    strat.reset(2)
    w = torch.full((2, 2), 0.5)
    valid = torch.ones(2, dtype=torch.bool)
    stats = torch.tensor([[[0.0], [1.0]], [[2.0], [3.0]]])
    states = [{"fc.weight": torch.tensor([[a], [a + 2.0]]), "running.bn": stats + a} for a in (1.0, 3.0, 5.0)]
    mixed = []
    for st in states:
        strat.collaboration(ServerInputs(0, st, {}, valid, torch.ones(2)))
        mixed.append(strat.mix(st, w))
    # parameters: averages 2, 4, 6; v = -2 then 0.5 * -2 + (4 - 6) = -3; g = 4, then 4 + 3 = 7 (FedAvg: 6)
    assert torch.allclose(mixed[2]["fc.weight"], torch.tensor([[7.0], [7.0]]))
    # statistics: the plain average (1 + 5, 2 + 5) / 2 with no momentum
    assert torch.allclose(mixed[2]["running.bn"], (stats.mean(0, keepdim=True) + 5.0).expand(2, 2, 1))


def test_distance_scales_by_hand():
    from ftta_core.strategies.base import scale_distances

    d = torch.tensor([[0.0, 2.0, 4.0], [2.0, 0.0, 6.0], [4.0, 6.0, 0.0]], dtype=torch.float64)
    valid = torch.ones(3, dtype=torch.bool)
    assert torch.equal(scale_distances(d, valid, "none"), d)
    assert torch.allclose(scale_distances(d, valid, "count", 4), d / 4)
    med = scale_distances(d, valid, "row_median")  # medians of {2, 4}, {2, 6}, {4, 6}: 3, 4, 5
    assert torch.allclose(med, d / torch.tensor([3.0, 4.0, 5.0], dtype=torch.float64)[:, None])
    valid[2] = False  # a rejected client does not count in the others' medians
    assert torch.allclose(scale_distances(d, valid, "row_median")[0], d[0] / 2)


def test_row_median_makes_w_invariant_to_the_distance_scale():
    from ftta_core.strategies.fedctta import similarity_weights

    stats = torch.randn(5, 10, generator=torch.Generator().manual_seed(0))
    valid = torch.ones(5, dtype=torch.bool)
    a = similarity_weights(stats, valid, scale="row_median")
    b = similarity_weights(stats * 100, valid, scale="row_median")
    assert torch.allclose(a, b)
    assert not torch.allclose(similarity_weights(stats, valid), similarity_weights(stats * 100, valid))
    strat = build_strategy("pfedbbn", temperature=2.0, scale="count")
    up = {"bbn_stats.l": torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(1))}
    w = strat.collaboration(ServerInputs(0, {}, up, torch.ones(3, dtype=torch.bool), torch.ones(3)))
    plain = build_strategy("pfedbbn", temperature=4.0).collaboration(
        ServerInputs(0, {}, up, torch.ones(3, dtype=torch.bool), torch.ones(3)))
    assert torch.allclose(w, plain)  # count = 2 terms: d / 2 / 2 = d / 4
    with pytest.raises(ValueError, match="scale"):
        build_strategy("fedctta", scale="count")


def test_fedavg_with_local_statistics_equals_local_under_tta_bn_and_keeps_each_clients_statistics(digits_model):
    batches = shifted_batches(n_clients=3, batch=8, steps=3)
    out = {}
    for name in ("local", "fedavg_localstats", "fedavg"):
        eng = Engine(digits_model, build_local("bn"), build_strategy(name), n_clients=3)
        out[name] = [eng.step(b).correct_mixed for b in batches]
    assert all((a == b).all() for a, b in zip(out["local"], out["fedavg_localstats"]))  # TTA-bn shares statistics only
    strat = build_strategy("fedavg_localstats")
    state = {"conv.weight": torch.arange(6.0).view(3, 2), RUNNING_PREFIX + "bn1": torch.rand(3, 2, 4)}
    mixed = strat.mix(state, torch.full((3, 3), 1 / 3))
    assert torch.allclose(mixed["conv.weight"], state["conv.weight"].mean(0).expand(3, 2))
    assert torch.equal(mixed[RUNNING_PREFIX + "bn1"], state[RUNNING_PREFIX + "bn1"])
