"""Tests of the server strategies: W validity, each method's defining rule, the simplex QP, memory, engine smoke."""
from __future__ import annotations

import copy
import math
from types import SimpleNamespace
from typing import Dict

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import minimize

from ftta_core.engine.mixing import restrict_to_valid
from ftta_core.strategies import STRATEGIES, build_strategy, check_collaboration
from ftta_core.strategies.base import ServerInputs, cosine_from_gram, gram_matrix, is_bn_stats, size_fractions
from ftta_core.strategies.fedamp import FedAMP
from ftta_core.strategies.fedavgm import FedAvgM
from ftta_core.strategies.fedprox import FedProx
from ftta_core.strategies.ldawa import LDAWA, layer_weights
from ftta_core.strategies.moon import MOON, moon_loss
from ftta_core.strategies.pfedgraph import PFedGraph
from ftta_core.strategies.pfedsd import PFedSD, distillation_loss
from ftta_core.strategies.simplex import graph_weights, project_to_simplex, solve_simplex_qp

NEW = ("fedavgm", "fedprox", "fedamp", "pfedgraph", "ldawa", "moon", "pfedsd")
N = 5


# ---------------------------------------------------------------- helpers


pytestmark = pytest.mark.usefixtures("one_thread")


def random_inputs(seed: int, kind: str = "params", n: int = N, step: int = 0, valid=None) -> ServerInputs:
    """Random shared state (parameters or BN statistics) and an indicator upload for ``n`` clients."""
    g = torch.Generator().manual_seed(seed)
    if kind == "params":
        state = {"conv.weight": torch.randn(n, 3, 2, 2, generator=g), "fc.bias": torch.randn(n, 4, generator=g)}
    else:
        state = {"block1.1": torch.stack([torch.randn(n, 6, generator=g), torch.rand(n, 6, generator=g) + 0.1], 1),
                 "block2.1": torch.stack([torch.randn(n, 3, generator=g), torch.rand(n, 3, generator=g) + 0.1], 1)}
    uploads = {"indicator": torch.rand(n, 8, generator=g) * 3}
    valid = torch.ones(n, dtype=torch.bool) if valid is None else valid
    return ServerInputs(step, state, uploads, valid, torch.full((n,), 10.0))


def server_step(strategy, inputs: ServerInputs):
    """What the engine does on the server: W, validity restriction, mix, after_mix."""
    w = check_collaboration(restrict_to_valid(strategy.collaboration(inputs).float(), inputs.valid), len(inputs.valid))
    mixed = strategy.mix(inputs.state, w)
    mixed = {k: torch.where(inputs.valid.view(-1, *[1] * (v.dim() - 1)), v, inputs.state[k]) for k, v in mixed.items()}
    strategy.after_mix(mixed, inputs)
    return w, mixed


def built(name: str, **params):
    strategy = build_strategy(name, **params)
    strategy.reset(N)
    return strategy


def slsqp(P: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Reference solution of min 1/2 x^T P x + q^T x on the simplex by scipy SLSQP."""
    n = len(q)
    res = minimize(lambda x: 0.5 * x @ P @ x + q @ x, np.full(n, 1.0 / n), jac=lambda x: P @ x + q, method="SLSQP",
                   bounds=[(0.0, None)] * n, options={"ftol": 1e-15, "maxiter": 500},
                   constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1, "jac": lambda x: np.ones(n)}])
    return res.x


def kkt_residual(P: np.ndarray, q: np.ndarray, x: np.ndarray) -> float:
    """Largest violation of the KKT conditions of the simplex QP at x."""
    g = P @ x + q
    support = x > 1e-12
    nu = g[support].mean()
    return max(abs(x.sum() - 1), max(0.0, -x.min()), np.abs(g[support] - nu).max(), max(0.0, -(g - nu).min()))


# ---------------------------------------------------------------- generic: registry, W validity, round trip


def test_registry_keeps_existing_and_adds_new():
    assert {"local", "fedavg", "fedavg_ft", *NEW} <= set(STRATEGIES)
    with pytest.raises(ValueError, match="fedprox"):
        build_strategy("fedprox", nonsense=1)
    for bad in (dict(name="fedamp", similarity_on="x"), dict(name="pfedgraph", lam=0), dict(name="ldawa", bn_stats="x"),
                dict(name="fedavgm", beta=1.0), dict(name="pfedsd", teacher="x"), dict(name="moon", tau=0)):
        with pytest.raises(ValueError):
            build_strategy(**bad)


@pytest.mark.parametrize("kind", ["params", "bn"])
@pytest.mark.parametrize("name", NEW)
def test_w_is_row_stochastic_on_random_uploads(name, kind):
    strategy = built(name)
    for step in range(3):
        inputs = random_inputs(step, kind, step=step)
        w, mixed = server_step(strategy, inputs)
        assert w.shape == (N, N) and (w >= 0).all()
        assert {k: v.shape for k, v in mixed.items()} == {k: v.shape for k, v in inputs.state.items()}
        assert all(torch.isfinite(v).all() for v in mixed.values())


@pytest.mark.parametrize("name", NEW)
def test_rejected_client_is_excluded_and_nan_safe(name):
    valid = torch.tensor([True, True, False, True, True])
    strategy = built(name)
    for step in range(2):
        inputs = random_inputs(10 + step, valid=valid, step=step)
        inputs.state["fc.bias"][2] = float("nan")
        inputs.uploads["indicator"][2] = float("inf")
        w = strategy.collaboration(inputs)
        assert torch.isfinite(w).all()
        w, mixed = server_step(strategy, inputs)
        assert torch.all(w[valid][:, 2] == 0) and w[2, 2] == 1
        if type(strategy).mix is not type(built("fedavg")).mix:  # own mixing (FedAvgM, LDAWA) must skip NaN rows
            assert all(torch.isfinite(v[valid]).all() for v in mixed.values())


@pytest.mark.parametrize("kind", ["params", "bn"])
@pytest.mark.parametrize("name", NEW)
def test_state_dict_round_trip(name, kind):
    a = built(name)
    for step in range(2):
        server_step(a, random_inputs(20 + step, kind, step=step))
    b = built(name)
    b.load_state_dict(a.state_dict())
    nxt = random_inputs(30, kind, step=2)
    wa, ma = server_step(a, nxt)
    wb, mb = server_step(b, nxt)
    assert torch.equal(wa, wb)
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def test_memory_is_bounded():
    strategy = built("moon")
    for step in range(6):
        server_step(strategy, random_inputs(step, step=step))
    assert set(strategy.memory.saved) == {"local", "received"}  # one copy of each, whatever the number of steps
    assert built("fedamp").keep == () and built("fedamp", similarity_on="update").keep == ("received",)


# ---------------------------------------------------------------- FedAvgM


def test_fedavgm_momentum_matches_hand_computation():
    beta, lr = 0.9, 1.0
    strategy = built("fedavgm", beta=beta, server_lr=lr)
    states = [random_inputs(40 + t, step=t) for t in range(3)]
    outs = [server_step(strategy, s)[1] for s in states]
    for k in states[0].state:
        a1, a2, a3 = (s.state[k].mean(0) for s in states)
        g1, v1 = a1, torch.zeros_like(a1)          # first mix: g_prev := avg, v := 0
        v2 = beta * v1 + (g1 - a2)
        g2 = g1 - lr * v2                           # = a2
        v3 = beta * v2 + (g2 - a3)
        g3 = g2 - lr * v3                           # = a3 - beta * (a1 - a2)
        for out, g in zip(outs, (g1, g2, g3)):
            torch.testing.assert_close(out[k], g.expand_as(out[k]), atol=1e-5, rtol=0)
        torch.testing.assert_close(g3, a3 - beta * (a1 - a2), atol=1e-5, rtol=0)
    torch.testing.assert_close(server_step(built("fedavgm"), states[0])[0], torch.full((N, N), 1.0 / N))


def test_fedavgm_keeps_bn_variances_non_negative():
    strategy = built("fedavgm")
    high, low = random_inputs(1, "bn"), random_inputs(2, "bn", step=1)
    for k in high.state:
        high.state[k][:, 1] += 10.0
    for inputs in (high, low, low, low):
        mixed = server_step(strategy, inputs)[1]
        assert all((v[:, 1] >= 0).all() for v in mixed.values())
    assert is_bn_stats("block1.1", low.state["block1.1"]) and not is_bn_stats("fc.weight", torch.zeros(N, 2, 3))


# ---------------------------------------------------------------- FedProx


def test_fedprox_regulariser_gradient_is_mu_times_difference():
    mu = 0.7
    strategy = built("fedprox", mu=mu)
    bank = SimpleNamespace(trainable=["conv.weight", "fc.bias"])
    assert strategy.regularizer(bank, torch.zeros(1)) is None  # before the first mix: no regulariser
    inputs = random_inputs(3)
    _, received = server_step(strategy, inputs)
    assert strategy.regularizer(SimpleNamespace(trainable=[]), torch.zeros(1)) is None  # TTA-bn: inert
    loss_fn = strategy.regularizer(bank, torch.zeros(1))
    theta = {k: (v + torch.randn_like(v)).requires_grad_(True) for k, v in received.items()}
    loss = loss_fn(None, theta, None, slice(None))
    assert loss.shape == (N,)
    grads = torch.autograd.grad(loss.sum(), list(theta.values()))
    for (k, t), grad in zip(theta.items(), grads):
        torch.testing.assert_close(grad, mu * (t.detach() - received[k]))
    one = loss_fn(None, {k: v[2:3] for k, v in theta.items()}, None, slice(2, 3))  # the loop bank's per-client call
    torch.testing.assert_close(one, loss[2:3])


@pytest.mark.parametrize("backend,participation", [("loop", 1.0), ("vectorized", 1.0), ("vectorized", 0.5)])
def test_fedprox_predicts_as_fedavg_when_each_round_is_one_step_from_the_received_model(tmp_path, monkeypatch,
                                                                                        backend, participation):
    """Every client takes one adaptation step per round, from the model it has just received (an absent client's
    'received' model is its own), so the proximal gradient mu (theta - theta_received) is zero at every step: FedProx
    predicts exactly as FedAvg, with Adam and running BN statistics too (why FedProx equals FedAvg to every digit in
    the stored Table 1 runs, notebook 10)."""
    from ftta_core.experiment import ExperimentConfig, run_experiment

    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    small = dict(dataset="embedded_digits", scenario="heterogeneity", corruptions=["gaussian_noise", "contrast"],
                 clients=4, batch_size=8, images_per_client=40, sh=0.5, th=0.2, device="cpu", seed=1,
                 local="tent", local_params={"params": "all", "optimizer": "adam", "lr": 3e-3, "bn": "running"},
                 backend=backend, participation=participation)
    avg = run_experiment(ExperimentConfig(**small, strategy="fedavg"))
    prox = run_experiment(ExperimentConfig(**small, strategy="fedprox", strategy_params={"mu": 10.0}))
    assert not avg.steps["correct_mixed"].equals(avg.steps["correct_source"])  # the clients did adapt
    pd.testing.assert_frame_equal(prox.steps, avg.steps)


def test_fling_fedprox_term_does_not_move_the_first_step_from_the_received_model():
    """The public Fling FedProx client (FLAIR-Community/Fling, ``fedprox_client.train_step`` with
    ``torch_utils.get_model_difference``) adds ``mu * sum_k ||theta_k - theta_k^received||_2`` (per-tensor norms,
    not squared), the received copy taken when ``train`` starts. torch's norm has gradient 0 at 0, so a round of one
    step from the received model is the step without the term, as with our squared term: that client would equal
    FedAvg under the Table 1 protocol too. From the second step on the term does move the client."""
    gen = torch.Generator().manual_seed(0)
    received = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))
    batches = [torch.randn(6, 3, 8, 8, generator=gen) for _ in range(2)]

    def adapt(mu: float, steps: int) -> Dict[str, torch.Tensor]:
        model = copy.deepcopy(received).train()
        anchor = {k: v.detach().clone() for k, v in model.named_parameters()}
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        for x in batches[:steps]:
            logits = model(x)
            loss = -(logits.softmax(1) * logits.log_softmax(1)).sum(1).mean()
            loss = loss + mu * sum(torch.norm(p - anchor[k], p=2) for k, p in model.named_parameters())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return {k: v.detach() for k, v in model.state_dict().items()}

    one_plain, one_prox = adapt(0.0, 1), adapt(10.0, 1)
    assert all(torch.equal(one_plain[k], one_prox[k]) for k in one_plain)
    two_plain, two_prox = adapt(0.0, 2), adapt(10.0, 2)
    assert any(not torch.equal(two_plain[k], two_prox[k]) for k in two_plain)


@pytest.mark.parametrize("backend", ["loop", "vectorized"])
def test_fedprox_source_pulls_towards_the_source_model_and_resumes_with_it(digits_model, backend):
    """FedProx anchored at the source: the anchor is the clients' trainable parameters before their first step,
    kept for the whole run (so its term moves the clients, unlike FedProx's under one step per round), mu = 0 is
    FedAvg, and a run resumed from ``state_dict`` after the anchor was taken continues exactly."""
    from conftest import shifted_batches
    from ftta_core.loop import Engine
    from ftta_core.tta import build_local

    batches = shifted_batches(n_clients=3, batch=8, steps=4)

    def make(strategy: str, **params) -> Engine:
        torch.manual_seed(0)
        local = build_local("tent", params="all", optimizer="adam", lr=3e-3, bn="running")
        return Engine(digits_model, local, build_strategy(strategy, **params), n_clients=3, backend=backend)

    def correct(engine: Engine, steps) -> list:
        return [engine.step(b).correct_mixed for b in steps]

    source = make("fedavg").bank.get_params()
    full = make("fedprox_source", mu=50.0)
    want = correct(full, batches)
    assert set(full.strategy.source) == set(source)
    assert all(torch.equal(full.strategy.source[k], source[k]) for k in source)
    avg = correct(make("fedavg"), batches)
    assert all((a == b).all() for a, b in zip(correct(make("fedprox_source", mu=0.0), batches), avg))
    assert any((a != b).any() for a, b in zip(want, avg))  # the term moves the clients
    first = make("fedprox_source", mu=50.0)
    correct(first, batches[:2])
    state = copy.deepcopy(first.state_dict())
    resumed = make("fedprox_source", mu=50.0)
    resumed.load_state_dict(state)
    assert all(torch.equal(resumed.strategy.source[k], source[k]) for k in source)
    assert all((a == b).all() for a, b in zip(correct(resumed, batches[2:]), want[2:]))


# ---------------------------------------------------------------- FedAMP


def test_fedamp_self_weight_and_closer_clients_weigh_more():
    ind = torch.tensor([[0.0], [1.0], [5.0], [5.5]])
    inputs = ServerInputs(0, {}, {"indicator": ind}, torch.ones(4, dtype=torch.bool))
    strategy = build_strategy("fedamp")
    strategy.reset(4)
    assert strategy.needs == ("indicator",)
    w = check_collaboration(strategy.collaboration(inputs), 4)
    torch.testing.assert_close(w.diagonal(), torch.full((4,), 0.3))
    assert w[0, 1] > w[0, 2] > w[0, 3] and w[2, 3] > w[2, 1] > w[2, 0]
    e = torch.exp(-torch.tensor([1.0, 5.0, 5.5]))
    torch.testing.assert_close(w[0, 1:], 0.7 * e / e.sum())
    cosine = FedAMP(metric="cosine", temperature=0.1, similarity_on="state")  # HeurFedAMP, sigma = 10
    x = random_inputs(5)
    cos = cosine_from_gram(gram_matrix(x.state.values())).float()
    w = cosine.collaboration(x)
    off = torch.exp(10 * cos[0, 1:])
    torch.testing.assert_close(w[0, 1:], 0.7 * off / off.sum())


# ---------------------------------------------------------------- pFedGraph and the simplex QP


def test_project_to_simplex_matches_qp_and_slsqp():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7, 20, 50):
        v = rng.normal(size=(4, n)) * 3
        x = project_to_simplex(torch.tensor(v)).numpy()
        for row, xr in zip(v, x):
            np.testing.assert_allclose(xr, solve_simplex_qp(np.eye(n), -row), atol=1e-10)
            np.testing.assert_allclose(xr, slsqp(np.eye(n), -row), atol=1e-6)
            assert kkt_residual(np.eye(n), -row, xr) < 1e-10
    np.testing.assert_allclose(project_to_simplex(torch.tensor([0.2, 0.3, 0.5])).numpy(), [0.2, 0.3, 0.5])


@pytest.mark.parametrize("rank", ["full", "deficient"])
def test_solve_simplex_qp_matches_slsqp_and_kkt(rank):
    rng = np.random.default_rng(1 if rank == "full" else 2)
    for trial in range(25):
        n = int(rng.integers(1, 25))
        r = n + 2 if rank == "full" else max(1, n // 3)
        a = rng.normal(size=(r, n))
        P, q = a.T @ a * rng.uniform(0.2, 3), rng.normal(size=n) * rng.uniform(0.1, 5)
        x, ref = solve_simplex_qp(P, q), slsqp(P, q)
        assert kkt_residual(P, q, x) < 1e-9
        f = lambda z: 0.5 * z @ P @ z + q @ z  # noqa: E731
        assert f(x) <= f(ref) + 1e-8
        if rank == "full":  # unique minimiser
            np.testing.assert_allclose(x, ref, atol=1e-6)


def test_pfedgraph_rows_solve_the_reference_qp():
    """Each row minimises pFedGraph's cvxpy objective ``lam x^T x + (d - 2 lam p)^T x`` (quad_form without 1/2)."""
    rng = np.random.default_rng(3)
    lam, n = 0.8, 6
    d = -rng.uniform(-1, 1, size=(n, n))
    d = (d + d.T) / 2
    np.fill_diagonal(d, -1.0)
    p = rng.uniform(1, 3, size=n)
    p /= p.sum()
    w = graph_weights(torch.tensor(d), torch.tensor(p), lam).numpy()
    for i in range(n):
        P, q = 2 * lam * np.eye(n), d[i] - 2 * lam * p
        np.testing.assert_allclose(w[i], solve_simplex_qp(P, q), atol=1e-10)
        np.testing.assert_allclose(w[i], slsqp(P, q), atol=1e-6)
    with pytest.raises(ValueError):
        solve_simplex_qp(np.eye(2), np.array([np.nan, 0.0]))


def test_pfedgraph_prefers_similar_updates_and_clips():
    base = torch.randn(1, 10, generator=torch.Generator().manual_seed(0))
    direction = torch.tensor([[1.0] * 5 + [0.0] * 5, [1.0] * 5 + [0.0] * 5, [0.0] * 5 + [1.0] * 5,
                              [0.0] * 5 + [1.0] * 5])
    noise = 0.3 * torch.randn(4, 10, generator=torch.Generator().manual_seed(1))
    received = {"fc.weight": base.expand(4, 10).clone()}
    inputs = ServerInputs(1, {"fc.weight": base + direction + noise}, {}, torch.ones(4, dtype=torch.bool),
                          torch.full((4,), 10.0))
    strategy = PFedGraph()
    strategy.reset(4)
    strategy.memory.observe({}, received)
    w = check_collaboration(strategy.collaboration(inputs), 4)
    assert w[0, 1] > w[0, 2] and w[0, 1] > w[0, 3] and w[2, 3] > w[2, 0]
    d = strategy.difference(inputs)
    assert torch.all(d.diagonal() == -1) and torch.all((d >= -1) & ((d == -1) | (d >= -0.9)))
    same = ServerInputs(0, {"fc.weight": torch.ones(4, 3)}, {}, torch.ones(4, dtype=torch.bool),
                        torch.tensor([1.0, 1.0, 2.0, 4.0]))
    w = PFedGraph(similarity_on="state").collaboration(same)  # identical models: d = -1 everywhere -> W rows = p
    torch.testing.assert_close(w, size_fractions(same).float().expand(4, 4))


# ---------------------------------------------------------------- LDAWA


def test_ldawa_per_layer_weights():
    n = 3
    state = {"a.weight": torch.tensor([[1.0, 0.0], [1.0, 0.1], [-1.0, -0.2]]),
             "b.weight": torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]]),
             "block1.1": torch.rand(n, 2, 4, generator=torch.Generator().manual_seed(0))}
    inputs = ServerInputs(0, state, {}, torch.ones(n, dtype=torch.bool), torch.ones(n))
    strategy = LDAWA()
    strategy.reset(n)
    w = check_collaboration(strategy.collaboration(inputs), n)
    p = torch.full((n,), 1 / 3, dtype=torch.float64)
    expected = {}
    for k, v in state.items():
        mean = v.double().mean(0)
        cos = F.cosine_similarity(v.double().reshape(n, -1), mean.reshape(1, -1), dim=1).clamp(0, 1)
        expected[k] = p if k == "block1.1" else p * cos / (p * cos).sum()  # BN statistics: FedAvg by default
    got = layer_weights(state, {k: v.mean(0, keepdim=True) for k, v in state.items()}, p)
    for k in state:
        torch.testing.assert_close(got[k], expected[k])
    assert got["a.weight"][2] == 0 and got["b.weight"][2] > 0  # anti-aligned only in layer a
    avg = torch.stack(list(expected.values())).mean(0)
    torch.testing.assert_close(w[1], (avg / avg.sum()).float())
    mixed = strategy.mix(state, w)
    for k, v in state.items():
        torch.testing.assert_close(mixed[k], (expected[k].float() @ v.reshape(n, -1)).reshape(v.shape[1:]).expand_as(v))
    # the next step measures cosines against this global model ('previous', L-DAWA's w_g)
    nxt = {k: v + 0.5 for k, v in state.items()}
    strategy.collaboration(ServerInputs(1, nxt, {}, torch.ones(n, dtype=torch.bool), torch.ones(n)))
    ref = {k: v[:1] for k, v in mixed.items()}
    for k, v in layer_weights(nxt, ref, p).items():
        torch.testing.assert_close(strategy._weights[k], v)
    raw = layer_weights(state, {k: v.mean(0, keepdim=True) for k, v in state.items()}, p, normalize=False,
                        bn_stats="layerwise")
    assert raw["a.weight"].sum() < 1 and raw["block1.1"].sum() <= 1 + 1e-12


# ---------------------------------------------------------------- MOON and pFedSD


def test_moon_loss_matches_hand_computation():
    z = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])
    zg = torch.tensor([[[1.0, 1.0], [0.0, 1.0]]])
    zp = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    tau = 0.5
    hand = []
    for pos, neg in ((1 / math.sqrt(2), 0.0), (1.0, 0.0)):
        hand.append(-math.log(math.exp(pos / tau) / (math.exp(pos / tau) + math.exp(neg / tau))))
    torch.testing.assert_close(moon_loss(z, zg, zp, tau), torch.tensor([sum(hand) / 2]))


def test_pfedsd_kl_zero_for_equal_teacher_and_matches_kl_div():
    s = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(0))
    t = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(distillation_loss(s, s.clone()), torch.zeros(2))
    for temp in (1.0, 2.0):
        ref = torch.stack([F.kl_div((s[i] / temp).log_softmax(-1), (t[i] / temp).softmax(-1), reduction="batchmean")
                           for i in range(2)]) * temp ** 2
        torch.testing.assert_close(distillation_loss(s, t, temp), ref)
    assert PFedSD().keep == ("local",) and PFedSD(teacher="received").keep == ("received",)


@pytest.mark.parametrize("name", ["moon", "pfedsd"])
def test_feature_regularisers_use_remembered_models(name, tiny_model):
    from ftta_core.engine.bank import OptimizerSpec, make_bank
    from ftta_core.tta import select_parameters

    bank = make_bank("vectorized", tiny_model, 2, select_parameters(tiny_model, "all"), OptimizerSpec("sgd", 1e-3))
    x = torch.rand(2, 3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    strategy = build_strategy(name)
    strategy.reset(2)
    assert strategy.regularizer(bank, x) is None
    local = bank.get_params()
    noise = torch.Generator().manual_seed(1)
    received = {k: v + 0.01 * torch.randn(v.shape, generator=noise) for k, v in local.items()}
    strategy.after_mix(received, ServerInputs(0, local, {}, torch.ones(2, dtype=torch.bool)))
    loss_fn = strategy.regularizer(bank, x)
    with torch.no_grad():
        out = bank.forward(x, "batch")
        z_glob = bank.forward(x, "batch", params=received)
        z_prev = bank.forward(x, "batch", params=local)
    value = loss_fn(out, local, x, slice(None))
    if name == "moon":
        torch.testing.assert_close(value, moon_loss(out.features, z_glob.features, z_prev.features, 0.5))
    else:  # teacher = previous local model = current params: KL is zero
        torch.testing.assert_close(value, torch.zeros(2))
        assert distillation_loss(out.logits, z_glob.logits).abs().sum() > 0


# ---------------------------------------------------------------- end-to-end through the engine


@pytest.fixture(scope="module")
def tiny_model():
    from ftta_core.models import build_model

    torch.manual_seed(0)
    return build_model("digits_cnn")


def stream_batches(steps: int = 3):
    from ftta_core.stream import StreamBatch

    g = torch.Generator().manual_seed(7)
    return [StreamBatch(t, torch.rand(4, 5, 3, 16, 16, generator=g), torch.randint(0, 10, (4, 5), generator=g),
                        np.zeros(4, int), np.zeros((4, 5), int)) for t in range(steps)]


@pytest.mark.parametrize("name", NEW)
def test_engine_backends_agree(name, tiny_model):
    from ftta_core.loop import Engine
    from ftta_core.tta import build_local

    batches = stream_batches()
    for local_name, params in (("tent", dict(params="all", lr=1e-3)), ("bn", {})):
        results: Dict[str, list] = {}
        for backend in ("loop", "vectorized"):
            engine = Engine(tiny_model, build_local(local_name, **params), build_strategy(name), n_clients=4,
                            backend=backend)
            results[backend] = []
            for batch in batches:
                res = engine.step(batch)
                out = engine.local.predict(engine.bank, batch.images)
                results[backend].append((res.weights, out.logits.argmax(-1)))
        for (w_loop, pred_loop), (w_vec, pred_vec) in zip(results["loop"], results["vectorized"]):
            check_collaboration(torch.from_numpy(w_loop), 4)
            np.testing.assert_allclose(w_loop, w_vec, atol=1e-5)
            assert torch.equal(pred_loop, pred_vec)
