"""FedTSA: the TS-Block, the heterogeneity-aware masks, the loss, the bounded memory bank and the strategy."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from ftta_core.loop import Engine
from ftta_core.strategies import STRATEGIES, build_strategy, check_collaboration
from ftta_core.strategies.base import ServerInputs, cosine_from_gram, gram_matrix, lookahead_of
from ftta_core.strategies.fedtsa import VARIANTS, FedTSA, IndicatorMemory, variant_name
from ftta_core.strategies.ts_block import (TSBlock, masked_softmax, sample_spatial_mask, sample_temporal_mask,
                                           similarity_mask, weighted_choice)
from ftta_core.stream import StreamBatch
from ftta_core.training import load_source_model
from ftta_core.tta import build_local

DRAWS = 4000
# A Bernoulli(p) frequency over K independent draws has standard deviation sqrt(p(1-p)/K) <= 0.5/sqrt(K); five of
# those (0.040 for K=4000) is exceeded with probability < 6e-7 per entry, so with a few dozen entries a correct
# sampler fails with probability < 1e-4 (and the draws are seeded, so the test is deterministic anyway), while a
# sampler off by 0.05 or more in any entry is caught.
TOL = 5 * 0.5 / math.sqrt(DRAWS)


pytestmark = pytest.mark.usefixtures("one_thread")


def indicators(seed: int, n: int = 6, d: int = 8) -> torch.Tensor:
    """Non-negative 'feature means' [n, d] of moderate norm (like post-ReLU features)."""
    return torch.rand(n, d, generator=torch.Generator().manual_seed(seed))


def inputs_for(step: int, ind: torch.Tensor, valid=None) -> ServerInputs:
    n = ind.shape[0]
    valid = torch.ones(n, dtype=torch.bool) if valid is None else valid
    return ServerInputs(step, {}, {"indicator": ind}, valid, torch.full((n,), 10.0))


def run_strategy(strategy: FedTSA, steps, n: int = 6, d: int = 8, seed_offset: int = 0):
    """Feed indicators(step + seed_offset) for every step; return the W of each step."""
    return [strategy.collaboration(inputs_for(t, indicators(t + seed_offset, n, d))) for t in steps]


def reference_block(x: np.ndarray, temporal_mask=None, spatial_mask=None):
    """Identity-initialised TS-Block by explicit loops (float64): Eqs. 9-14 (masks exclude entries, Eqs. 16-17)."""
    t_len, n, d = x.shape

    def softmax(row, keep):
        row = np.where(keep, row, -np.inf)
        e = np.exp(row - row[keep].max())
        return np.where(keep, e, 0.0) / np.where(keep, e, 0.0).sum()

    x_ta = np.zeros_like(x)
    att_t = np.zeros((n, t_len, t_len))
    for i in range(n):
        for a in range(t_len):
            scores = np.array([x[a, i] @ x[b, i] / math.sqrt(d) for b in range(t_len)])
            keep = np.ones(t_len, bool) if temporal_mask is None else temporal_mask[i, a]
            att_t[i, a] = softmax(scores, keep)
            x_ta[a, i] = sum(att_t[i, a, b] * x[b, i] for b in range(t_len))
    out = np.zeros_like(x)
    att_s = np.zeros((t_len, n, n))
    for a in range(t_len):
        for i in range(n):
            scores = np.array([x_ta[a, i] @ x_ta[a, j] / math.sqrt(d) for j in range(n)])
            keep = np.ones(n, bool) if spatial_mask is None else spatial_mask[i]
            att_s[a, i] = softmax(scores, keep)
            out[a, i] = sum(att_s[a, i, j] * x_ta[a, j] for j in range(n))
    return out, att_t, att_s


# ---------------------------------------------------------------- the TS-Block


def test_registered_and_needs_indicator():
    assert "fedtsa" in STRATEGIES
    assert build_strategy("fedtsa").needs == ("indicator",)


def test_ts_block_shapes():
    x = torch.rand(4, 5, 8)
    out = TSBlock(8)(x)
    assert out.output.shape == out.temporal_output.shape == (4, 5, 8)
    assert out.temporal_scores.shape == out.temporal_attention.shape == (5, 4, 4)
    assert out.spatial_attention.shape == (4, 5, 5)
    no_time = TSBlock(8, temporal=False)(x)
    assert no_time.temporal_attention is None and torch.equal(no_time.temporal_output, x)
    with pytest.raises(ValueError):
        TSBlock(8)(torch.rand(5, 8))


@pytest.mark.parametrize("masked", [False, True])
def test_attention_rows_sum_to_one(masked):
    x = torch.rand(5, 6, 8)
    gen = torch.Generator().manual_seed(0)
    t_mask = ((torch.rand(6, 5, 5, generator=gen) < 0.5) | torch.eye(5, dtype=torch.bool)) if masked else None
    s_mask = ((torch.rand(6, 6, generator=gen) < 0.5) | torch.eye(6, dtype=torch.bool)) if masked else None
    out = TSBlock(8)(x, t_mask, s_mask)
    for att in (out.temporal_attention, out.spatial_attention):
        assert (att >= 0).all()
        assert torch.allclose(att.sum(-1), torch.ones(att.shape[:-1]), atol=1e-6)
    if masked:  # excluded entries get exactly zero attention
        assert (out.temporal_attention[~t_mask] == 0).all()
        assert (out.spatial_attention[:, ~s_mask] == 0).all()


def test_block_matches_loop_reference_with_and_without_masks():
    x = torch.rand(3, 4, 5, dtype=torch.float64)
    block = TSBlock(5).double()
    t_mask = torch.tensor([[[1, 0, 1], [0, 1, 0], [1, 1, 1]]] * 4, dtype=torch.bool)
    s_mask = torch.eye(4, dtype=torch.bool) | torch.tensor([[0, 1, 0, 0]] * 4, dtype=torch.bool)
    for tm, sm in ((None, None), (t_mask, s_mask)):
        got = block(x, tm, sm)
        ref, att_t, att_s = reference_block(x.numpy(), None if tm is None else tm.numpy(),
                                            None if sm is None else sm.numpy())
        assert np.allclose(got.output.detach().numpy(), ref, atol=1e-12)
        assert np.allclose(got.temporal_attention.detach().numpy(), att_t, atol=1e-12)
        assert np.allclose(got.spatial_attention.detach().numpy(), att_s, atol=1e-12)


def test_hadamard_mask_mode_is_the_literal_product():
    scores = torch.tensor([[2.0, -1.0, 3.0]])
    mask = torch.tensor([[True, False, True]])
    assert torch.allclose(masked_softmax(scores, mask, "hadamard"), torch.softmax(torch.tensor([[2.0, 0.0, 3.0]]), 1))
    assert masked_softmax(scores, mask, "exclude")[0, 1] == 0


def test_identity_init_w_is_softmax_of_scaled_gram():
    """One step in memory: X_TA = X, so W = row-softmax(<p_i, p_j> / sqrt(D)) (TS-sim = the untrained full block)."""
    ind = indicators(3, n=6, d=8)
    expected = torch.softmax(gram_matrix([ind]) / math.sqrt(8), dim=1).float()
    for params in ({"server_steps": 0}, {"variant": "TS-sim"}):
        s = build_strategy("fedtsa", **params)
        s.reset(6)
        assert torch.allclose(s.collaboration(inputs_for(0, ind)), expected, atol=1e-6)
    # with history: W = softmax of the scaled Gram of the temporal-attention output at the current step
    s = build_strategy("fedtsa", server_steps=0, window=3)
    s.reset(6)
    w = run_strategy(s, range(3))[-1]
    x = np.stack([indicators(t).double().numpy() for t in range(3)])
    _, _, att_s = reference_block(x)
    assert np.allclose(w.numpy(), att_s[-1], atol=1e-6)


# ---------------------------------------------------------------- masks


def test_similarity_mask_thresholds_cosine_at_its_mean():
    ind = indicators(5, n=7)
    cos = cosine_from_gram(gram_matrix([ind]))
    assert torch.equal(similarity_mask(ind), cos >= cos.mean())
    assert similarity_mask(ind).diagonal().all()


def test_weighted_choice_draws_proportionally_without_replacement():
    w = torch.tensor([0.1, 0.4, 0.2, 0.0, 0.3])
    gen = torch.Generator().manual_seed(1)
    picks = torch.stack([weighted_choice(w, 1, gen) for _ in range(DRAWS)]).double().mean(0)
    assert torch.allclose(picks, (w / w.sum()).double(), atol=TOL)
    cand = torch.tensor([True, False, True, True, True])
    for _ in range(50):
        m = weighted_choice(w, 3, gen, cand)
        assert int(m.sum()) == 3 and not m[1]


def _attention(n: int, seed: int) -> torch.Tensor:
    return torch.softmax(2 * torch.randn(n, n, generator=torch.Generator().manual_seed(seed)), dim=1)


def test_bernoulli_spatial_mask_frequencies_match_attention():
    """Paper: an edge is dropped w.p. 1 - a_ij, a non-edge added w.p. a_ij: each entry present w.p. a_ij."""
    n = 6
    a = _attention(n, 0)
    current = similarity_mask(indicators(7, n=n))
    assert current.any() and (~current).any()
    gen = torch.Generator().manual_seed(2)
    freq = torch.stack([sample_spatial_mask(a, current, gen) for _ in range(DRAWS)]).double().mean(0)
    eye = torch.eye(n, dtype=torch.bool)
    assert (freq[eye] == 1).all()
    assert torch.allclose(freq[~eye], a.double()[~eye], atol=TOL)


def test_bernoulli_temporal_mask_frequencies_match_attention():
    a = torch.stack([_attention(4, s) for s in range(3)])  # [N=3, T=4, T]
    gen = torch.Generator().manual_seed(3)
    freq = torch.stack([sample_temporal_mask(a, gen) for _ in range(DRAWS)]).double().mean(0)
    eye = torch.eye(4, dtype=torch.bool).expand(3, 4, 4)
    assert (freq[eye] == 1).all()
    assert torch.allclose(freq[~eye], a.double()[~eye], atol=TOL)


def test_count_spatial_mask_drops_and_adds_the_configured_numbers():
    """Code: int(0.8 * edges) edges dropped (proportional to 1 - a), int(0.2 * non-edges) added (proportional to a)."""
    n = 8
    a = _attention(n, 4)
    current = similarity_mask(indicators(11, n=n))
    eye = torch.eye(n, dtype=torch.bool)
    edges, non_edges = current & ~eye, ~current & ~eye
    n_drop, n_add = int(int(edges.sum()) * 0.8), int(int(non_edges.sum()) * 0.2)
    assert n_drop > 0 and n_add > 0
    gen = torch.Generator().manual_seed(5)
    dropped_freq = torch.zeros(n, n, dtype=torch.float64)
    for _ in range(500):
        m = sample_spatial_mask(a, current, gen, "count", 0.8, 0.2)
        assert m.diagonal().all()
        assert int((edges & ~m).sum()) == n_drop
        assert int((non_edges & m).sum()) == n_add
        dropped_freq += (edges & ~m).double() / 500
    # an edge with low attention is dropped more often than the edge with the highest attention
    e = edges.nonzero()
    att_e = a[e[:, 0], e[:, 1]]
    lo, hi = e[att_e.argmin()], e[att_e.argmax()]
    assert dropped_freq[lo[0], lo[1]] >= dropped_freq[hi[0], hi[1]]


def test_count_temporal_mask_masks_the_configured_fraction():
    """Code: int(T*T*0.75) of the T*T entries drawn (proportional to 1 - a), then the diagonal restored.

    So each client loses between that count minus T and that count of its off-diagonal entries, and entries with
    low attention are masked more often than entries with high attention.
    """
    t = 6
    a = torch.stack([_attention(t, s) for s in range(4)])
    count = int(t * t * 0.75)
    gen = torch.Generator().manual_seed(6)
    freq = torch.zeros(4, t, t, dtype=torch.float64)
    for _ in range(500):
        m = sample_temporal_mask(a, gen, "count", 0.75)
        assert m.diagonal(dim1=1, dim2=2).all()
        off = (~m).sum((1, 2))
        assert ((off <= count) & (off >= count - t)).all()
        freq += (~m).double() / 500
    off_diag = ~torch.eye(t, dtype=torch.bool).expand(4, t, t)
    att, masked = a[off_diag], freq[off_diag]
    order = att.argsort()
    quarter = len(order) // 4
    assert masked[order[:quarter]].mean() > masked[order[-quarter:]].mean() + 0.05


# ---------------------------------------------------------------- the loss


@pytest.mark.parametrize("augmentation", ["bernoulli", "count"])
def test_first_loss_equals_hand_computation(augmentation):
    """L = MSE(X_TSA, X) + lam * MSE(X_TSA, X_TSA') at the identity init, with the masks the strategy drew."""
    lam, window = 0.7, 3
    s = build_strategy("fedtsa", server_steps=1, lam=lam, window=window, augmentation=augmentation)
    s.reset(4)
    run_strategy(s, range(window), n=4, d=5)
    diag = s.last_diagnostics
    x = np.stack([indicators(t, 4, 5).double().numpy() for t in range(window)])
    out, _, _ = reference_block(x)
    aug, _, _ = reference_block(x, diag.temporal_mask.numpy(), diag.spatial_mask.numpy())
    reg, rob = np.mean((out - x) ** 2), np.mean((out - aug) ** 2)
    assert diag.loss_regularization[0] == pytest.approx(reg, rel=1e-5)
    assert diag.loss_robustness[0] == pytest.approx(rob, rel=1e-4, abs=1e-9)
    assert diag.loss[0] == pytest.approx(reg + lam * rob, rel=1e-5)


def test_training_lowers_the_loss_and_diagnostics_stay_bounded():
    s = build_strategy("fedtsa", server_steps=30, lr=1e-2, variant="w/o aug")
    s.reset(5)
    for t in range(12):
        s.collaboration(inputs_for(t, indicators(t, 5, 8)))
        assert s.last_diagnostics.loss.shape == (30,)
    assert s.last_diagnostics.loss[-1] < s.last_diagnostics.loss[0]
    assert (s.last_diagnostics.loss_robustness == 0).all()


def test_lambda_zero_is_the_without_augmentation_variant():
    """Fig 7's lambda = 0 point is read from the `w/o aug` run (notebook 11): the two must be the same computation."""
    runs = [build_strategy("fedtsa", server_steps=8, **kw) for kw in ({"lam": 0.0}, {"variant": "w/o aug"})]
    for s in runs:
        s.reset(6)
    for t in range(4):
        w = [s.collaboration(inputs_for(t, indicators(t, 6, 8))) for s in runs]
        assert torch.equal(w[0], w[1])
        assert np.array_equal(runs[0].last_diagnostics.loss, runs[1].last_diagnostics.loss)


# ---------------------------------------------------------------- memory bank


def test_memory_bank_is_a_bounded_ring_buffer():
    mem = IndicatorMemory(4)
    for t in range(3):
        mem.push(t, indicators(t))
    assert len(mem) == 3 and mem.ordered().shape == (3, 6, 8)  # fewer than T: what exists
    for t in range(3, 25):
        mem.push(t, indicators(t))
        assert mem.buffer.shape == (4, 6, 8)
    assert list(mem.ordered_steps()) == [21, 22, 23, 24]
    assert torch.equal(mem.ordered(), torch.stack([indicators(t) for t in range(21, 25)]))


def test_strategy_memory_bounded_and_rejected_rows_repeat_the_last_one():
    s = build_strategy("fedtsa", window=3, server_steps=0)
    s.reset(6)
    run_strategy(s, range(10))
    assert s.memory.buffer.shape == (3, 6, 8) and list(s.last_diagnostics.window_steps) == [7, 8, 9]
    bad = indicators(10).clone()
    bad[2] = float("nan")
    valid = torch.ones(6, dtype=torch.bool)
    valid[2] = False
    w = s.collaboration(inputs_for(10, bad, valid))
    assert torch.isfinite(w).all()
    assert torch.equal(s.memory.latest()[2], indicators(9)[2])


# ---------------------------------------------------------------- the strategy


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("augmentation", ["bernoulli", "count"])
def test_w_row_stochastic_and_non_negative(variant, augmentation):
    s = build_strategy("fedtsa", variant=variant, augmentation=augmentation, server_steps=3)
    s.reset(6)
    for w in run_strategy(s, range(4)):
        check_collaboration(w, 6)
    d = s.last_diagnostics
    assert d.weights.shape == (6, 6)
    if variant in ("w/o time", "S-sim"):
        assert d.temporal_attention is None


def test_s_sim_is_row_softmax_of_cosine():
    s = build_strategy("fedtsa", variant="s_sim")
    s.reset(6)
    ind = indicators(4)
    w = s.collaboration(inputs_for(0, ind))
    assert torch.allclose(w, torch.softmax(cosine_from_gram(gram_matrix([ind])), 1).float(), atol=1e-6)


def test_variant_names_and_validation():
    assert variant_name("wo_time") == "w/o time" and variant_name("W/O-AUG") == "w/o aug"
    assert variant_name("ts-sim") == "TS-sim"
    for bad in ({"variant": "nope"}, {"window": 0}, {"lam": -1}, {"augmentation": "x"}, {"edge_drop": 2},
                {"mask_mode": "x"}, {"select": "x"}, {"graph_on": "x"}):
        with pytest.raises(ValueError):
            build_strategy("fedtsa", **bad)


@pytest.mark.parametrize("params", [{}, {"augmentation": "count", "select": "best", "bias": True,
                                          "graph_on": "temporal"}])
def test_same_seed_same_w_different_seed_differs(params):
    runs = {}
    for seed in (0, 0, 1):
        s = build_strategy("fedtsa", server_steps=4, lr=1e-2, seed=seed, **params)
        s.reset(6)
        runs.setdefault(seed, []).append(torch.stack(run_strategy(s, range(3))))
    assert torch.equal(runs[0][0], runs[0][1])
    assert (runs[0][0] - runs[1][0]).abs().max() > 1e-6


@pytest.mark.parametrize("warm_start", [False, True])
def test_state_dict_round_trip_reproduces_the_next_w(warm_start):
    a = build_strategy("fedtsa", server_steps=3, window=3, warm_start=warm_start)
    a.reset(6)
    run_strategy(a, range(5))
    state = a.state_dict()
    b = build_strategy("fedtsa", server_steps=3, window=3, warm_start=warm_start)
    b.reset(6)
    b.load_state_dict(state)
    w_a = a.collaboration(inputs_for(5, indicators(5)))
    w_b = b.collaboration(inputs_for(5, indicators(5)))
    assert torch.equal(w_a, w_b)
    # the saved state is a copy: continuing `a` did not change it
    c = build_strategy("fedtsa", server_steps=3, window=3, warm_start=warm_start)
    c.reset(6)
    c.load_state_dict(state)
    assert torch.equal(c.collaboration(inputs_for(5, indicators(5))), w_a)


def test_two_groups_get_most_weight_within_their_group():
    gen = torch.Generator().manual_seed(0)
    centres = torch.relu(torch.randn(2, 16, generator=gen)) * 2
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    s = build_strategy("fedtsa", server_steps=10)
    s.reset(8)
    for t in range(4):
        ind = centres[group] + 0.2 * torch.randn(8, 16, generator=gen)
        w = s.collaboration(inputs_for(t, ind.clamp_min(0)))
    same = group[:, None] == group[None, :]
    within = (w * same).sum(1)
    # dot-product attention also favours keys of large norm: here group 1's centre is longer, so group 0 keeps
    # ~0.7 within its group while group 1 keeps > 0.99; "most weight" is the property the method guarantees
    assert (within > 0.5).all(), within


@pytest.mark.parametrize("backend_pair", [("loop", "vectorized")])
def test_engine_backends_agree(backend_pair):
    """TTA-bn + FedTSA on a hand-made stream: identical predictions and W on both backends."""
    gen = torch.Generator().manual_seed(0)
    batches = [StreamBatch(t, torch.rand(4, 5, 3, 16, 16, generator=gen), torch.randint(0, 10, (4, 5), generator=gen),
                           np.zeros(4, int), np.zeros((4, 5), int)) for t in range(3)]
    model = load_source_model("digits_cnn_embedded")
    runs = {}
    for b in backend_pair:
        eng = Engine(model, build_local("bn"), build_strategy("fedtsa", server_steps=5), n_clients=4, backend=b)
        results = [eng.step(batch) for batch in batches]
        preds = eng.local.predict(eng.bank, batches[-1].images).logits.argmax(-1)
        runs[b] = (results, preds, eng.strategy.last_diagnostics)
    (ra, pa, da), (rb, pb, db) = runs.values()
    assert torch.equal(pa, pb)
    for a, b in zip(ra, rb):
        assert (a.correct_local == b.correct_local).all() and (a.correct_mixed == b.correct_mixed).all()
        assert np.allclose(a.weights, b.weights, atol=1e-5)
        check_collaboration(torch.as_tensor(a.weights), 4)
    assert list(da.window_steps) == [0, 1, 2] and da.loss.shape == (5,)


def test_weights_do_not_depend_on_the_local_method():
    """FedTSA's W comes from the frozen source model's indicators only: TTA-bn and TTA-grad (Tent, all parameters)
    on one stream get the same W at every step, bit for bit (so a TTA-grad table row differs from TTA-bn only by
    what W mixes: BN statistics or parameters)."""
    gen = torch.Generator().manual_seed(1)
    batches = [StreamBatch(t, torch.rand(4, 5, 3, 16, 16, generator=gen), torch.randint(0, 10, (4, 5), generator=gen),
                           np.zeros(4, int), np.zeros((4, 5), int)) for t in range(4)]
    model = load_source_model("digits_cnn_embedded")
    weights = {}
    for name, params in (("bn", {}), ("tent", {"params": "all", "optimizer": "sgd", "lr": 1e-2})):
        eng = Engine(model, build_local(name, **params), build_strategy("fedtsa", server_steps=5), n_clients=4)
        weights[name] = [eng.step(batch).weights for batch in batches]
    assert all(np.array_equal(a, b) for a, b in zip(weights["bn"], weights["tent"]))


def test_predrawn_bernoulli_uniforms_give_the_masks_of_drawing_each_iteration():
    # FedTSA draws a round's mask uniforms up front (no host round trip per iteration on a GPU); they must be the
    # very draws the per-iteration sampling makes from the same generator, in the same order
    from ftta_core.strategies.ts_block import bernoulli_uniforms

    n, t, iterations = 5, 4, 3
    gen = torch.Generator().manual_seed(3)
    temporal_att = [torch.softmax(torch.randn(n, t, t, generator=gen), -1) for _ in range(iterations)]
    spatial_att = [torch.softmax(torch.randn(n, n, generator=gen), -1) for _ in range(iterations)]
    current = torch.rand(n, n, generator=gen) > 0.5
    one_by_one, up_front = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    temporal_u, spatial_u = bernoulli_uniforms(iterations, n, t, True, up_front)
    assert temporal_u.shape == (iterations, n, t, t) and spatial_u.shape == (iterations, n, n)
    for it in range(iterations):
        expected_t = sample_temporal_mask(temporal_att[it], one_by_one)
        expected_s = sample_spatial_mask(spatial_att[it], current, one_by_one)
        assert torch.equal(sample_temporal_mask(temporal_att[it], None, uniform=temporal_u[it]), expected_t)
        assert torch.equal(sample_spatial_mask(spatial_att[it], current, None, uniform=spatial_u[it]), expected_s)
    assert bernoulli_uniforms(2, n, t, False, torch.Generator().manual_seed(7))[0] is None


def test_block_heads_are_views_of_one_fused_weight_reset_to_identity():
    block = TSBlock(4, bias=True)
    assert block.heads == ("temporal_query", "temporal_key", "spatial_query", "spatial_key")
    assert [n for n, _ in block.named_parameters()] == ["qk_weight", "qk_bias"]
    with torch.no_grad():
        block.qk_weight.add_(1.0)
        block.qk_bias.add_(1.0)
    assert torch.equal(block.head_weight("spatial_key"), torch.eye(4) + 1)
    block.reset_parameters()
    fresh = TSBlock(4, bias=True)
    assert all(torch.equal(a, b) for a, b in zip(block.parameters(), fresh.parameters()))
    with pytest.raises(KeyError, match="temporal_query"):
        TSBlock(4, temporal=False).head_weight("temporal_query")


def test_block_loads_a_state_saved_with_one_linear_per_head():
    """Blocks saved before the heads were fused (``spatial_query.weight``, ...) still load, in head order."""
    heads = {h: torch.full((3, 3), float(i)) for i, h in enumerate(("temporal_query", "temporal_key",
                                                                    "spatial_query", "spatial_key"))}
    state = {f"{h}.weight": w for h, w in heads.items()}
    block = TSBlock(3)
    block.load_state_dict(state)
    for h, w in heads.items():
        assert torch.equal(block.head_weight(h), w)


def test_each_round_starts_from_the_identity_block_unless_warm_start():
    """The strategy keeps one block object; without warm_start a round trains it from the identity again, so
    round r's W does not depend on earlier rounds' training (same W as a strategy that only saw round r's window)."""
    a = build_strategy("fedtsa", server_steps=4, window=2)
    a.reset(6)
    w_a = run_strategy(a, range(3))[-1]
    b = build_strategy("fedtsa", server_steps=4, window=2)
    b.reset(6)
    b.memory.push(1, indicators(1))
    w_b = b.collaboration(inputs_for(2, indicators(2)))
    assert torch.equal(w_a, w_b)


class ListStream:
    """The part of a ``Stream`` that ``Engine.prefetch`` and ``run_steps`` read: ``len`` and ``batch(t)``."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def batch(self, t: int) -> StreamBatch:
        return self.batches[t]


def small_stream(steps: int, seed: int = 2, n: int = 4) -> ListStream:
    gen = torch.Generator().manual_seed(seed)
    return ListStream([StreamBatch(t, torch.rand(n, 5, 3, 16, 16, generator=gen),
                                   torch.randint(0, 10, (n, 5), generator=gen), np.zeros(n, int), np.zeros((n, 5), int))
                       for t in range(steps)])


@pytest.mark.parametrize("params", [{}, {"augmentation": "count", "select": "best"}, {"variant": "w/o time"},
                                    {"rounds_per_batch": 3}, {"rounds_per_batch": 4, "variant": "w/o aug"},
                                    {"rounds_per_batch": 3, "select": "best"}])
def test_rounds_computed_ahead_on_server_threads_give_the_same_run(monkeypatch, params):
    """With server threads the engine hands FedTSA the source indicators of the next steps and its rounds run
    while the clients adapt (several as one block of rounds with ``rounds_per_batch``); every W, diagnostic and
    prediction is bit for bit that of computing each round in its step, and the rounds did run on the server
    threads."""
    import threading

    from ftta_core.loop import run_steps

    threads, batches = [], []
    train = FedTSA._train

    def spy(self, x, *args, **kwargs):
        rounds = x.shape[0] if x.dim() == 4 else 1
        threads.extend([threading.current_thread().name] * rounds)
        batches.append(rounds)
        return train(self, x, *args, **kwargs)

    monkeypatch.setattr(FedTSA, "_train", spy)
    stream = small_stream(9)
    model = load_source_model("digits_cnn_embedded")
    runs = {}
    for server_threads in (0, 3):
        threads.clear()
        batches.clear()
        eng = Engine(model, build_local("bn"), build_strategy("fedtsa", server_steps=4, window=3, **params),
                     n_clients=4, server_threads=server_threads, server_pool="thread")
        diagnostics = []
        results = run_steps(eng, stream, on_step=lambda r: diagnostics.append(eng.strategy.last_diagnostics))
        eng.close()
        runs[server_threads] = (results, diagnostics, list(threads), list(batches))
    (plain, plain_diag, plain_threads, _), (ahead, ahead_diag, ahead_threads, ahead_batches) = runs[0], runs[3]
    assert plain_threads == ["MainThread"] * 9
    assert len(ahead_threads) == 9 and all(name.startswith("ftta-server") for name in ahead_threads)
    batched = params.get("rounds_per_batch", 1) > 1 and params.get("select") != "best"
    assert (max(ahead_batches) > 1) == batched  # the windows of full length come in blocks of rounds
    # a block of rounds is the same computation batched: equal up to float rounding (bmm may sum in another order)
    same = (lambda u, v: np.allclose(u, v, rtol=0, atol=1e-5)) if batched else np.array_equal
    for a, b in zip(plain, ahead):
        assert same(a.weights, b.weights) and np.array_equal(a.correct_mixed, b.correct_mixed)
        assert np.array_equal(a.correct_source, b.correct_source)
    for a, b in zip(plain_diag, ahead_diag):
        assert a.step == b.step and list(a.window_steps) == list(b.window_steps)
        assert same(a.loss, b.loss) and same(a.loss_robustness, b.loss_robustness)
        assert (a.spatial_mask is None) == (b.spatial_mask is None)
        assert a.spatial_mask is None or torch.equal(a.spatial_mask, b.spatial_mask)
        assert a.selected_iteration == b.selected_iteration and a.seconds > 0 and b.seconds > 0


@pytest.mark.parametrize("params", [{}, {"rounds_per_batch": 3}, {"augmentation": "count", "select": "best"}])
def test_rounds_computed_ahead_in_worker_processes_give_the_same_run(monkeypatch, params):
    """The CPU default (``loop.default_server_pool``): rounds ahead run in forked worker processes, side by side with
    the clients instead of queueing for one GIL; every W, diagnostic and prediction is bit for bit that of computing
    each round in its step (one thread either way), and the rounds did run in other processes."""
    import os

    from ftta_core.loop import default_server_pool, run_steps

    if default_server_pool() != "process":
        pytest.skip("no fork on this platform: rounds ahead run in threads")
    rounds = FedTSA._rounds

    def tagged(self, windows, steps):  # runs in the worker: its pid travels back with each round's diagnostics
        out = rounds(self, windows, steps)
        for diag in out:
            diag.pid = os.getpid()
        return out

    tagged.__name__ = "_rounds"  # a bound method pickles as (object, name)
    monkeypatch.setattr(FedTSA, "_rounds", tagged)
    stream, model = small_stream(9), load_source_model("digits_cnn_embedded")
    runs = {}
    for server_threads in (0, 2):
        eng = Engine(model, build_local("bn"), build_strategy("fedtsa", server_steps=4, window=3, **params),
                     n_clients=4, server_threads=server_threads)
        diagnostics = []
        runs[server_threads] = (run_steps(eng, stream, on_step=lambda r: diagnostics.append(eng.strategy.last_diagnostics)),
                                diagnostics, eng.server_pool_kind)
        eng.close()
    (plain, plain_diag, _), (ahead, ahead_diag, kind) = runs[0], runs[2]
    assert kind == "process"
    assert {getattr(d, "pid", os.getpid()) for d in ahead_diag} - {os.getpid()}  # served by other processes
    batched = params.get("rounds_per_batch", 1) > 1
    same = (lambda u, v: np.allclose(u, v, rtol=0, atol=1e-5)) if batched else np.array_equal
    for a, b in zip(plain, ahead):
        assert same(a.weights, b.weights) and np.array_equal(a.correct_mixed, b.correct_mixed)
    for a, b in zip(plain_diag, ahead_diag):
        assert a.step == b.step and same(a.loss, b.loss) and a.selected_iteration == b.selected_iteration


def test_a_strategy_that_cannot_be_pickled_has_its_rounds_ahead_in_threads(caplog):
    """A planner that cannot be sent to a worker process (here: it holds a lock) is served by threads, and the
    log says why."""
    import threading

    from ftta_core.loop import default_server_pool

    if default_server_pool() != "process":
        pytest.skip("no fork on this platform: rounds ahead run in threads")
    strategy = build_strategy("fedtsa", server_steps=2)
    strategy.lock = threading.Lock()
    eng = Engine(load_source_model("digits_cnn_embedded"), build_local("bn"), strategy, n_clients=4,
                 server_threads=1)
    eng.prefetch(small_stream(3), 0, 3)
    eng.close()
    assert eng.server_pool_kind == "thread" and "cannot be sent to a worker process" in caplog.text


def test_server_pool_is_validated(monkeypatch):
    from ftta_core.loop import SERVER_POOL_ENV, default_server_pool

    with pytest.raises(ValueError, match="server_pool"):
        Engine(load_source_model("digits_cnn_embedded"), build_local("bn"), build_strategy("fedtsa"), n_clients=2,
               server_pool="gpu")
    monkeypatch.setenv(SERVER_POOL_ENV, "thread")
    assert default_server_pool() == "thread"
    monkeypatch.setenv(SERVER_POOL_ENV, "fork")
    with pytest.raises(ValueError, match=SERVER_POOL_ENV):
        default_server_pool()
    monkeypatch.delenv(SERVER_POOL_ENV)
    assert default_server_pool("cuda:0") == "thread"


@pytest.mark.parametrize("rounds_per_batch", [0, 3])
def test_a_plan_that_differs_from_the_memory_is_redone(rounds_per_batch):
    """A client whose upload is rejected at a planned step (here: its state was non-finite) changes the memory the
    plan assumed: that round and every later planned one are recomputed (batches of rounds included), so W stays
    that of the plain server."""
    from concurrent.futures import ThreadPoolExecutor

    steps, n = range(9), 6
    valid = [torch.ones(n, dtype=torch.bool) for _ in steps]
    valid[4] = torch.tensor([True, False, True, True, True, True])
    plain = build_strategy("fedtsa", server_steps=3, window=3)
    plain.reset(n)
    expected = [plain.collaboration(inputs_for(t, indicators(t), valid[t])) for t in steps]
    ahead = build_strategy("fedtsa", server_steps=3, window=3, rounds_per_batch=rounds_per_batch)
    ahead.reset(n)
    with ThreadPoolExecutor(2) as pool:
        ahead.plan_rounds(list(steps), {"indicator": torch.stack([indicators(t) for t in steps])},
                          torch.ones(len(steps), n, dtype=torch.bool), pool.submit)
        got = [ahead.collaboration(inputs_for(t, indicators(t), valid[t])) for t in steps]
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(expected, got))
    assert rounds_per_batch or all(torch.equal(a, b) for a, b in zip(expected, got))
    assert not ahead._pending and not ahead._ahead


@pytest.mark.parametrize("params", [{}, {"variant": "w/o time", "bias": True}, {"variant": "w/o aug"},
                                    {"mask_mode": "hadamard"}])
def test_a_block_of_rounds_trains_each_round_as_it_would_alone(params):
    """``TSBlock(rounds=R)`` trained on R windows at once (``FedTSA._rounds``): each round's W, losses and masks are
    those of training it alone from its own identity block and generator (up to float rounding)."""
    strategy = build_strategy("fedtsa", server_steps=6, **params)
    windows = torch.stack([torch.stack([indicators(10 * r + t, n=5, d=12) for t in range(4)]) for r in range(3)])
    steps = [7, 8, 11]
    together = strategy._rounds(windows, steps)
    for r, step in enumerate(steps):
        alone = strategy._rounds(windows[r:r + 1], [step])[0]
        assert torch.allclose(together[r].weights, alone.weights, rtol=0, atol=1e-6)
        assert torch.allclose(together[r].spatial_attention, alone.spatial_attention, rtol=0, atol=1e-6)
        assert np.allclose(together[r].loss, alone.loss, rtol=1e-5, atol=1e-9)
        for name in ("current_mask", "spatial_mask", "temporal_mask"):
            a, b = getattr(together[r], name), getattr(alone, name)
            assert (a is None and b is None) or torch.equal(a, b)
    assert not torch.allclose(together[0].weights, together[1].weights)  # three different rounds


def test_rounds_per_batch_by_device_and_validated():
    """By default one round per batch on a CPU and 64 on a GPU; the variants that read the host every iteration
    (the code's 'best' selection, counted masks, M^cur on the temporal output) keep rounds apart."""
    from ftta_core.strategies.ts_block import TSBlock

    assert build_strategy("fedtsa").plan_chunk("cpu") == 1 and build_strategy("fedtsa").plan_chunk("cuda:0") == 64
    assert build_strategy("fedtsa", rounds_per_batch=8).plan_chunk("cpu") == 8
    assert build_strategy("fedtsa").batched_rounds and build_strategy("fedtsa", lam=0.0, augmentation="count").batched_rounds
    for params in ({"select": "best"}, {"augmentation": "count"}, {"graph_on": "temporal"}):
        assert not build_strategy("fedtsa", **params).batched_rounds
    with pytest.raises(ValueError, match="rounds_per_batch"):
        build_strategy("fedtsa", rounds_per_batch=-1)
    with pytest.raises(ValueError, match="rounds"):
        TSBlock(8, rounds=0)
    with pytest.raises(ValueError, match=r"X \[2, T, N, 8\]"):
        TSBlock(8, rounds=2)(torch.rand(3, 4, 5, 8))
    with pytest.raises(ValueError, match="one at a time"):
        strategy = build_strategy("fedtsa", select="best", server_steps=2)
        strategy._train(torch.rand(2, 3, 4, 8), [torch.Generator()] * 2, TSBlock(8, rounds=2))


def test_prefetch_hands_a_batching_strategy_its_steps_in_chunks():
    """A strategy that batches R rounds gets the steps two chunks ahead, a chunk at a time."""
    stream = small_stream(30)
    eng = Engine(load_source_model("digits_cnn_embedded"), build_local("bn"),
                 build_strategy("fedtsa", server_steps=2, rounds_per_batch=5), n_clients=4, server_threads=1)
    eng.prefetch(stream, 0, 30)
    assert sorted(eng.strategy._pending) == list(range(10))
    for t in range(5):
        eng.step(stream.batch(t))
        eng.prefetch(stream, t + 1, 30)
        assert sorted(eng.strategy._pending) == list(range(t + 1, 10 if t < 4 else 15))
    eng.close()


def test_prefetched_source_pass_is_used_only_for_the_same_batch():
    """``prefetch`` keeps the source forwards for ``local_phase``; a step given another batch recomputes them."""
    stream, other = small_stream(3), small_stream(3, seed=5)
    model = load_source_model("digits_cnn_embedded")
    eng = Engine(model, build_local("bn"), build_strategy("fedtsa", server_steps=2), n_clients=4, server_threads=2)
    eng.prefetch(stream, 0, 3)
    got = eng.step(other.batch(0))
    eng.close()
    fresh = Engine(model, build_local("bn"), build_strategy("fedtsa", server_steps=2), n_clients=4, server_threads=0)
    want = fresh.step(other.batch(0))
    assert np.array_equal(got.correct_source, want.correct_source) and np.array_equal(got.weights, want.weights)


def test_run_with_rounds_ahead_interrupted_and_resumed_is_the_plain_run(tmp_path, monkeypatch):
    """``run_experiment`` with server threads, killed mid-run and resumed from its checkpoint: the same steps and W
    as the run that computes each round in its step (the plan is dropped with the interrupted engine and rebuilt
    from the restored memory)."""
    import ftta_core.loop as loop_mod
    from ftta_core.experiment import ExperimentConfig, run_experiment

    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    cfg = ExperimentConfig(dataset="embedded_digits", scenario="fedtsa_niid", clients=4, batch_size=8,
                           images_per_client=24, corruptions=["fog", "contrast", "frost", "glass_blur"], device="cpu",
                           strategy="fedtsa", strategy_params={"server_steps": 3, "window": 4})
    plain = run_experiment(cfg, server_threads=0)

    class Interrupt(Exception):
        pass

    original, calls = loop_mod.Engine.step, {"n": 0}

    def flaky(self, batch):
        calls["n"] += 1
        if calls["n"] == 8:  # inside the second slot (slots are 5 steps)
            raise Interrupt
        return original(self, batch)

    monkeypatch.setattr(loop_mod.Engine, "step", flaky)
    with pytest.raises(Interrupt):
        run_experiment(cfg, out=tmp_path / "run", server_threads=2)
    monkeypatch.setattr(loop_mod.Engine, "step", original)
    resumed = run_experiment(cfg, out=tmp_path / "run", server_threads=2)
    assert np.array_equal(resumed.collaboration, plain.collaboration)
    pd.testing.assert_frame_equal(resumed.steps.reset_index(drop=True), plain.steps.reset_index(drop=True),
                                  check_dtype=False)
    assert (plain.summary["server_threads"], resumed.summary["server_threads"]) == (0, 2)


def test_by_default_every_thread_serves_rounds_ahead_and_clients_keep_half():
    """One torch thread: no server thread (a run-plan worker keeps its one core). Four: four server threads, and
    the clients run on two threads until ``close`` restores the count."""
    from ftta_core.loop import default_server_threads

    assert default_server_threads() == 0  # the one_thread fixture
    assert default_server_threads("cuda:0") == 2  # on a GPU the threads only launch the (batched) rounds
    torch.set_num_threads(4)
    assert default_server_threads() == 4
    eng = Engine(load_source_model("digits_cnn_embedded"), build_local("bn"), build_strategy("fedtsa", server_steps=2),
                 n_clients=4)
    stream = small_stream(20)
    eng.prefetch(stream, 0, 20)
    assert torch.get_num_threads() == 2 and eng.rounds_ahead_threads == 4
    assert sorted(eng.strategy._pending) == list(range(16))  # 4 steps ahead per server thread
    eng.step(stream.batch(0))
    eng.prefetch(stream, 1, 20)  # later calls keep the first call's threads (torch's count changed meanwhile)
    assert sorted(eng.strategy._pending) == list(range(1, 17))
    eng.close()
    assert torch.get_num_threads() == 4


def test_warm_start_and_untrained_variants_do_not_plan_ahead():
    assert build_strategy("fedtsa").lookahead == ("indicator",)
    assert build_strategy("fedtsa", warm_start=True).lookahead == ()
    assert build_strategy("fedtsa", variant="S-sim").lookahead == ()
    assert lookahead_of(build_strategy("fedavg")) == ()


def test_claims_reading_pairs_seeds_and_names_each_verdict():
    """Notebook 10's reading of Table 1: each difference paired by seed and decided by ``stats.verdict`` (NIID
    'beats': a direction claim, the interval above 0; IID 'matches': a tie claim, the interval inside +-0.5); a
    missing FedTSA row is said."""
    from studies.fedtsa.table1 import fedtsa_claims_reading

    rows = []
    for seed in range(3):
        for setting, tsa, avg in (("niid", 72.0 + 0.1 * seed, 72.05), ("iid", 74.4, 74.45 + 0.1 * seed)):
            for strategy, acc in (("fedtsa", tsa), ("fedavg", avg)):
                rows.append({"setting": setting, "strategy": strategy, "seed": seed, "accuracy": acc,
                             "accuracy_local": 69.0, "accuracy_source": 63.5})
    text = fedtsa_claims_reading(pd.DataFrame(rows), "bn")
    assert "Local 69.00 (FedTSA - Local = +3.10 [+2.85, +3.35] (3 seeds); 'beats': holds)" in text
    assert "FedAvg 72.05 (FedTSA - FedAvg = +0.05 [-0.20, +0.30] (3 seeds); 'beats': undetermined)" in text
    assert ("IID: FedTSA 74.40 against FedAvg 74.55 (FedTSA - FedAvg = -0.15 [-0.40, +0.10] (3 seeds); "
            "'matches': holds)") in text
    assert "the paper: FedTSA 60.27, Local 56.93, FedAvg 56.52" in text
    apart = pd.DataFrame(rows).assign(accuracy=lambda r: r.accuracy + (r.setting == "iid") * (r.strategy == "fedavg"))
    assert "'matches': does not hold" in fedtsa_claims_reading(apart, "bn")  # FedAvg 1 point above at every seed
    same = pd.DataFrame(rows).assign(accuracy=lambda r: r.accuracy.where(r.setting == "niid", 74.4))
    assert "'matches': holds, identical at every seed" in fedtsa_claims_reading(same, "bn")
    two = fedtsa_claims_reading(pd.DataFrame(rows).query("seed < 2"), "bn")  # under 3 seeds: never holds
    assert "FedTSA - Local = +3.05 [+2.41, +3.69] (2 seeds); 'beats': undetermined" in two
    grad = fedtsa_claims_reading(pd.DataFrame(rows).query("strategy != 'fedtsa'"), "grad")
    assert grad == "**TTA-grad.** NIID: no FedTSA run stored yet. IID: no FedTSA run stored yet."


def test_table1_markdown_gives_no_spread_for_one_seed():
    """A row stored at one seed shows its mean and (1), never a '± 0.00' spread it does not have."""
    from studies.fedtsa.table1 import to_markdown

    table = pd.DataFrame({"method": ["Local", "FedAvg"], "setting": ["niid", "iid"], "ours_mean": [60.0, 61.5],
                          "ours_std": [0.0, 0.25], "seeds": [1, 3], "paper_mean": [56.93, float("nan")],
                          "paper_std": [0.1, float("nan")], "difference": [3.07, float("nan")]})
    rows = to_markdown(table).splitlines()[2:]
    assert rows[0] == "| Local | NIID | 60.00 (1) | 56.93 ± 0.10 | +3.07 |"
    assert rows[1] == "| FedAvg | IID | 61.50 ± 0.25 (3) | – | – |"


@pytest.mark.parametrize("server_threads", [0, 2])
def test_a_run_tells_its_length_once_and_a_resumed_run_tells_the_same(monkeypatch, server_threads):
    """``expect_rounds`` hears the run's stop step once per engine run, with or without rounds ahead, and a run
    resumed part-way (a new engine from step 6) hears the same number: FedTSA then chooses compiled or eager rounds
    as the uninterrupted run did, so the resumed run computes what the uninterrupted one computed."""
    from ftta_core.loop import run_steps

    told = []
    monkeypatch.setattr(FedTSA, "expect_rounds", lambda self, rounds: told.append(rounds))
    stream = small_stream(9)
    model = load_source_model("digits_cnn_embedded")
    for start in (0, 6):
        told.clear()
        eng = Engine(model, build_local("bn"), build_strategy("fedtsa", server_steps=2, window=3), n_clients=4,
                     server_threads=server_threads, server_pool="thread")
        run_steps(eng, stream, start=start)
        assert told == [9], (start, told)
