"""FedCTTA: probes, the statistic, each distance, W, EMA, interval, constant memory, the engine hook, backends."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ftta_core.engine.bank import make_bank
from ftta_core.loop import Engine
from ftta_core.rng import torch_generator
from ftta_core.stream import StreamBatch
from ftta_core.strategies import STRATEGIES, build_strategy, check_collaboration
from ftta_core.strategies.base import ServerInputs, probe_uploads
from ftta_core.strategies.fedctta import PROBE_UPLOAD, FedCTTA, similarity_matrix, similarity_weights
from ftta_core.training import load_source_model
from ftta_core.tta import build_local

LOCALS = {"bn": {}, "tent": {"params": "all", "lr": 1e-3}}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return load_source_model("digits_cnn_embedded")


def inputs(stats: torch.Tensor, step: int = 0, valid=None) -> ServerInputs:
    n = stats.shape[0]
    valid = torch.ones(n, dtype=torch.bool) if valid is None else torch.as_tensor(valid)
    return ServerInputs(step, {}, {PROBE_UPLOAD: stats}, valid, torch.full((n,), 5.0))


def hand_batches(steps: int = 3, n: int = 4, b: int = 5):
    g = torch.Generator().manual_seed(0)
    out = []
    for t in range(steps):
        x = torch.rand(n, b, 3, 16, 16, generator=g)
        x[n // 2:] = x[n // 2:] * 0.3 + 0.6  # two kinds of clients, so W is not uniform
        out.append(StreamBatch(t, x, torch.randint(0, 10, (n, b), generator=g), np.zeros(n, int),
                               np.zeros((n, b), int)))
    return out


# ---------------------------------------------------------------- construction


def test_registered_with_paper_defaults_and_checked_options():
    s = build_strategy("fedctta")
    assert "fedctta" in STRATEGIES and isinstance(s, FedCTTA)
    assert (s.n_probes, s.probes, s.on, s.distance, s.temperature, s.ema, s.interval, s.probe_bn) == \
        (64, "shared", "logits", "euclidean", 1.0, None, 1, "client")
    for bad in [{"probes": "global"}, {"on": "probs"}, {"distance": "l1"}, {"temperature": 0}, {"ema": 1.0},
                {"interval": 0}, {"n_probes": 0}, {"probe_bn": "source"}, {"distance": "kl", "on": "features"},
                {"probe_images": torch.rand(3, 16, 16)},
                {"probe_images": torch.rand(2, 3, 16, 16), "probes": "per_client"}]:
        with pytest.raises(ValueError, match="strategy_params"):
            build_strategy("fedctta", **bad)


def test_base_strategy_hook_uploads_nothing(model):
    bank = make_bank("vectorized", model, 2)
    x = torch.rand(2, 3, 3, 16, 16)
    assert probe_uploads(build_strategy("fedavg"), bank, build_local("bn"), x, 0) == {}


# ---------------------------------------------------------------- probes


def test_probes_reproducible_shared_and_per_client():
    shape = (3, 8, 8)
    shared, per = FedCTTA(n_probes=6, seed=7), FedCTTA(n_probes=6, probes="per_client", seed=7)
    a = shared.probe_inputs(4, 3, shape)
    assert a.shape == (3, 6, *shape) and a.min() >= 0 and a.max() < 1
    assert torch.equal(a, FedCTTA(n_probes=6, seed=7).probe_inputs(4, 3, shape))  # same seed + step
    assert torch.equal(a[0], a[2])  # one reference set for everybody
    assert torch.equal(a[0], torch.rand((6, *shape), generator=torch_generator(7, "fedctta-probes", 4)))
    assert not torch.equal(a, shared.probe_inputs(5, 3, shape))  # fresh each step
    assert not torch.equal(a, FedCTTA(n_probes=6, seed=8).probe_inputs(4, 3, shape))
    p = per.probe_inputs(4, 3, shape)
    assert torch.equal(p, per.probe_inputs(4, 3, shape))
    assert not torch.equal(p[0], p[1])
    for i in range(3):
        assert torch.equal(p[i], torch.rand((6, *shape), generator=torch_generator(7, "fedctta-probes", 4, i)))


def test_fixed_probe_images():
    imgs = torch.rand(5, 3, 8, 8)
    s = FedCTTA(probe_images=imgs)
    z = s.probe_inputs(0, 2, (3, 8, 8))
    assert z.shape == (2, 5, 3, 8, 8) and torch.equal(z[1], imgs) and torch.equal(s.probe_inputs(9, 2, (3, 8, 8)), z)
    with pytest.raises(ValueError, match="probe_images"):
        s.probe_inputs(0, 2, (3, 16, 16))


# ---------------------------------------------------------------- distances and W


def test_euclidean_and_cosine_by_hand():
    s = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]])
    expected = -torch.tensor([[0, 5, 1], [5, 0, math.sqrt(18)], [1, math.sqrt(18), 0]], dtype=torch.float64)
    assert torch.allclose(similarity_matrix(s, "euclidean"), expected, atol=1e-12)
    c = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    r = 1 / math.sqrt(2)
    expected = torch.tensor([[1, r, 0], [r, 1, r], [0, r, 1]], dtype=torch.float64)
    assert torch.allclose(similarity_matrix(c, "cosine"), expected, atol=1e-12)


def test_kl_and_cross_entropy_by_hand():
    p, q = [0.5, 0.5], [0.9, 0.1]
    s = torch.log(torch.tensor([p, q]))  # logits whose softmax is p and q
    kl_pq = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    kl_qp = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    assert torch.allclose(similarity_matrix(s, "kl"), -torch.tensor([[0, kl_pq], [kl_qp, 0]], dtype=torch.float64),
                          atol=1e-12)
    ce = -torch.tensor([[-math.log(0.5), -(0.5 * math.log(0.9) + 0.5 * math.log(0.1))],
                        [-math.log(0.5), -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))]], dtype=torch.float64)
    assert torch.allclose(similarity_matrix(s, "cross_entropy"), ce, atol=1e-12)


def test_cross_entropy_and_kl_give_the_same_w():
    """CE(p_i, p_j) = H(p_i) + KL(p_i || p_j): a per-row constant, which the row softmax removes."""
    s = torch.randn(6, 10, generator=torch.Generator().manual_seed(1)) * 2
    valid = torch.ones(6, dtype=torch.bool)
    assert torch.allclose(similarity_weights(s, valid, "kl"), similarity_weights(s, valid, "cross_entropy"),
                          atol=1e-12)


@pytest.mark.parametrize("distance", ["euclidean", "kl", "cross_entropy", "cosine"])
def test_w_is_row_stochastic_and_non_negative(distance):
    s = torch.randn(7, 10, generator=torch.Generator().manual_seed(2)) * 3
    w = FedCTTA(distance=distance, temperature=0.5).collaboration(inputs(s))
    check_collaboration(w, 7)
    assert (w >= 0).all() and w.dtype == torch.float32
    if distance in ("euclidean", "kl", "cosine"):  # every client is most similar to itself
        assert (w.diagonal() >= w.max(1).values - 1e-6).all()


def test_w_is_row_softmax_of_negative_distances():
    s = torch.randn(5, 10, generator=torch.Generator().manual_seed(3))
    expected = torch.softmax(-torch.cdist(s.double(), s.double()), dim=1)
    assert torch.allclose(FedCTTA().collaboration(inputs(s)).double(), expected, atol=1e-6)
    expected_t = torch.softmax(-torch.cdist(s.double(), s.double()) / 0.25, dim=1)
    assert torch.allclose(FedCTTA(temperature=0.25).collaboration(inputs(s)).double(), expected_t, atol=1e-6)


def test_rejected_client_gets_no_weight_and_keeps_itself():
    s = torch.randn(4, 10, generator=torch.Generator().manual_seed(4))
    s[1] = float("nan")
    valid = torch.tensor([True, False, True, True])
    w = FedCTTA().collaboration(inputs(s, valid=valid))
    check_collaboration(w, 4)
    keep = [0, 2, 3]
    assert (w[keep, 1] == 0).all() and torch.equal(w[1], torch.eye(4)[1])
    assert torch.allclose(w[keep][:, keep], FedCTTA().collaboration(inputs(s[keep])), atol=1e-6)


# ---------------------------------------------------------------- EMA, interval, memory


def test_ema_by_hand_and_resume():
    g = torch.Generator().manual_seed(5)
    o1, o2, o3 = (torch.randn(3, 4, generator=g) for _ in range(3))
    s = FedCTTA(ema=0.9)
    s.reset(3)
    assert torch.allclose(s.collaboration(inputs(o1, 0)), FedCTTA().collaboration(inputs(o1)), atol=1e-6)
    w2 = s.collaboration(inputs(o2, 1))
    assert torch.allclose(w2, FedCTTA().collaboration(inputs(0.9 * o1 + 0.1 * o2)), atol=1e-6)
    # a rejected client's EMA is frozen; the others move on
    o3[2] = float("nan")
    s.collaboration(inputs(o3, 2, valid=[True, True, False]))
    ema = s.state_dict()["ema"]
    expected = 0.9 * (0.9 * o1 + 0.1 * o2) + 0.1 * o3
    assert torch.allclose(ema[:2].float(), expected[:2], atol=1e-6)
    assert torch.allclose(ema[2].float(), (0.9 * o1 + 0.1 * o2)[2], atol=1e-6)
    # resuming from state_dict gives the same next W
    resumed = FedCTTA(ema=0.9)
    resumed.reset(3)
    resumed.load_state_dict(s.state_dict())
    o4 = torch.randn(3, 4, generator=g)
    assert torch.equal(resumed.collaboration(inputs(o4, 3)), s.collaboration(inputs(o4, 3)))
    s.reset(3)
    assert s.state_dict() == {}


def test_interval_aggregates_every_kth_step_identity_in_between(model):
    s = FedCTTA(interval=3, n_probes=4)
    s.reset(4)
    bank = make_bank("vectorized", model, 4)
    local = build_local("bn")
    stats = torch.randn(4, 10, generator=torch.Generator().manual_seed(6))
    for step in range(7):
        x = torch.rand(4, 5, 3, 16, 16)
        local.adapt(bank, x)
        ups = s.client_uploads(s.probe_uploads(bank, local, x, step))
        if step % 3 == 2:
            assert set(ups) == {PROBE_UPLOAD} and ups[PROBE_UPLOAD].shape == (4, 10)
            assert not torch.equal(s.collaboration(inputs(stats, step)), torch.eye(4))
        else:
            assert ups == {}
            assert torch.equal(s.collaboration(ServerInputs(step, {}, {}, torch.ones(4, dtype=torch.bool))),
                               torch.eye(4))
    with pytest.raises(KeyError, match=PROBE_UPLOAD):
        s.collaboration(ServerInputs(2, {}, {}, torch.ones(4, dtype=torch.bool)))


def test_server_memory_is_constant_over_rounds():
    g = torch.Generator().manual_seed(7)
    plain, smooth = FedCTTA(), FedCTTA(ema=0.9)
    for s in (plain, smooth):
        s.reset(5)
    sizes = []
    for t in range(200):
        o = torch.randn(5, 10, generator=g)
        plain.collaboration(inputs(o, t))
        smooth.collaboration(inputs(o, t))
        assert plain.state_dict() == {}
        sizes.append(sum(v.numel() for v in smooth.state_dict().values()))
    assert set(sizes) == {5 * 10 + 5}


# ---------------------------------------------------------------- client side: what is evaluated on the probes


@pytest.mark.parametrize("local_name", sorted(LOCALS))
def test_probe_statistic_uses_the_clients_batch_statistics_and_changes_nothing(model, local_name):
    local = build_local(local_name, **LOCALS[local_name])
    bank = make_bank("vectorized", model, 3, local.trainable(model), local.optimizer())
    x = torch.rand(3, 5, 3, 16, 16, generator=torch.Generator().manual_seed(8))
    x[2] = x[2] * 0.2
    local.adapt(bank, x)
    stats, params = bank.bn_stats(), bank.get_params()
    s = FedCTTA(n_probes=8, seed=3)
    up = s.probe_uploads(bank, local, x, 0)[PROBE_UPLOAD]
    assert up.shape == (3, 10)
    assert all(torch.equal(stats[k], v) for k, v in bank.bn_stats().items())
    assert all(torch.equal(params[k], v) for k, v in bank.get_params().items())
    z = s.probe_inputs(0, 3, (3, 16, 16))
    bank.set_bn_stats(stats)
    assert torch.allclose(up, bank.forward(z, "given").logits.mean(1), atol=1e-6)
    feats = FedCTTA(n_probes=8, seed=3, on="features").probe_uploads(bank, local, x, 0)[PROBE_UPLOAD]
    assert torch.allclose(feats, bank.forward(z, "given").features.mean(1), atol=1e-6)
    own = FedCTTA(n_probes=8, seed=3, probe_bn="probes").probe_uploads(bank, local, x, 0)[PROBE_UPLOAD]
    assert torch.allclose(own, bank.forward(z, "batch").logits.mean(1), atol=1e-6)
    if local_name == "bn":  # same weights, probes normalised with their own statistics: no client differs
        assert torch.allclose(own, own[:1].expand_as(own), atol=1e-5)
        assert not torch.allclose(up, up[:1].expand_as(up), atol=1e-3)


# ---------------------------------------------------------------- end to end, both backends


@pytest.mark.parametrize("local_name", sorted(LOCALS))
def test_engine_backends_agree(model, local_name):
    batches = hand_batches()
    runs = {}
    for backend in ("loop", "vectorized"):
        eng = Engine(model, build_local(local_name, **LOCALS[local_name]), build_strategy("fedctta"), n_clients=4,
                     backend=backend)
        ref = Engine(model, build_local(local_name, **LOCALS[local_name]), build_strategy("fedavg"), n_clients=4,
                     backend=backend)
        out = []
        for b in batches:
            r = eng.step(b)
            assert r.upload_bytes == ref.step(b).upload_bytes + 10 * 4  # + the K = 10 float probe statistic
            out.append((r.weights, eng.local.predict(eng.bank, b.images).logits.argmax(-1), r))
        runs[backend] = out
    for (wl, pl, rl), (wv, pv, rv) in zip(runs["loop"], runs["vectorized"]):
        check_collaboration(torch.as_tensor(wl), 4)
        assert not np.allclose(wl, np.full((4, 4), 0.25), atol=1e-3)  # the clients are told apart
        assert np.allclose(wl, wv, atol=1e-5)
        assert torch.equal(pl, pv)
        assert (rl.correct_local == rv.correct_local).all() and (rl.correct_mixed == rv.correct_mixed).all()


def test_case_study_clusters_are_read_against_uniform_mixing_and_the_meeting_slot():
    """Figs. 3-4 (``fedctta.clusters``): FedAvg's W is uniform mixing on every count; a W that keeps half on each
    client and gives the rest to its group, plus client 1 -> clients 8-10 only in the meeting slot, reads as a
    cluster and as Fig. 4's turn."""
    import numpy as np

    from ftta_core.experiment import ExperimentConfig
    from studies.fedctta.clusters import MEET_SLOT, cluster_reading, cluster_table
    from ftta_core.scenarios import CASE_STUDY_GROUPS
    from ftta_core.workbook import StoredRun

    cfg = ExperimentConfig(dataset="embedded_digits", scenario="case_study_fedctta", clients=10, batch_size=10,
                           images_per_client=20)  # 2 steps per slot
    steps = 2 * 15
    uniform = np.full((steps, 10, 10), 0.1)
    grouped = np.zeros((steps, 10, 10))
    for g in CASE_STUDY_GROUPS.values():
        for i in g:
            grouped[:, i, list(g)] = 0.5 / (len(g) - 1)
            grouped[:, i, i] = 0.5
    meet = slice(2 * MEET_SLOT, 2 * MEET_SLOT + 2)
    grouped[meet, 0, :] = 0.0
    grouped[meet, 0, [0, 7, 8, 9]] = [0.4, 0.2, 0.2, 0.2]
    runs = {name: StoredRun({"config": cfg.to_dict()}, w, None) for name, w in (("fedavg", uniform),
                                                                                  ("grouped", grouped))}
    table = cluster_table(runs)
    assert np.isclose(table.loc["fedavg", "own group"], table.loc["fedavg", "own group, uniform"])
    assert table.loc["fedavg", "client 1 on 8-10, range over slots"] < 1e-9
    assert table.loc["grouped", "own group, of the weight given away"] > 0.9
    assert table.loc["grouped", "meeting slot's rank"] == 1
    assert np.isclose(table.loc["grouped", "client 1 on 8-10, meeting slot"], 0.6)
    text = cluster_reading(table).splitlines()
    assert "equal to uniform" in text[0] and "the same in every slot" in text[0]
    assert "above uniform mixing" in text[1] and "as the paper's Fig. 4 says" in text[1]


def test_uniform_departure_finds_the_step_where_w_leaves_uniform_mixing():
    import numpy as np

    from studies.fedctta.clusters import departure_reading, uniform_departure

    w = np.full((6, 4, 4), 0.25)
    w[4:, 0, :] = [0.4, 0.2, 0.2, 0.2]  # W leaves uniform mixing at step 4
    table = uniform_departure(w, slot_steps=2)
    assert list(table["largest |W - 1/N|"].round(6)) == [0.0, 0.0, 0.15] and (table["first step above"] == 4).all()
    assert "first exceeds 0.001 at step 4" in departure_reading("x", table)
    assert "it is FedAvg" in departure_reading("y", uniform_departure(np.full((4, 4, 4), 0.25), slot_steps=2))


# ---------------------------------------------------------------- the study's grids: parameters from factors


def test_study_variants_carry_their_parameters_as_factors():
    from studies.fedctta.study import (TABLE4_CELLS, batch_size_variants, interval_variants, table4_variants,
                                       temperature_variants)

    t4 = table4_variants(torch.rand(2, 3, 16, 16))
    for cell in TABLE4_CELLS:
        v = t4["/".join(cell)]
        assert tuple(v.factors.values()) == cell and (v["strategy_params"]["on"], v["strategy_params"]["distance"]) == cell[1:]
    assert t4["local"].factors == {} == t4["fedavg"].factors
    assert interval_variants([3])["interval 3"].factors == {"interval": 3}
    hot = temperature_variants([3], "eval mode / ", probe_bn="eval")["eval mode / temperature 3"]
    assert hot.factors == {"temperature": 3.0} and hot["strategy_params"] == {"probe_bn": "eval", "temperature": 3.0}
    batch = batch_size_variants([30], 60, ("fedavg",))["fedavg / batch 30"]
    assert batch.factors == {"strategy": "fedavg", "batch": 30} and batch["batch_size"] == 30 and batch["strategy"] == "fedavg"


def test_grid_parameters_come_from_the_factors_whatever_the_labels_say():
    """Variants under arbitrary (even misleading) labels: the grid's interval, temperature, probe setting and Table
    IV cell are the variants' factors, and the labels change no run."""
    from ftta_core.experiment import ExperimentConfig
    from studies.fedctta.study import (TABLE4_FACTORS, interval_variants, live_grid, probe_temperature_grid,
                                       split_table4, table4_variants, temperature_variants)

    cfg = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=4, sh=0.5,
                           corruptions=["fog", "contrast"], images_per_client=20, slot_steps=2, batch_size=5,
                           local="bn", device="cpu", seed=0, max_steps=4)
    t4 = table4_variants(torch.rand(8, 3, 16, 16))
    variants = {"a": interval_variants([3])["interval 3"], "interval 1": temperature_variants([10])["temperature 10"],
                "temperature 3": t4["clean_images/features/cosine"], "x/y/z": t4["random_noise/logits/kl"],
                "b": t4["fedavg"]}
    grid = live_grid(cfg, variants, [0])
    assert list(grid.variant) == list(variants)
    assert grid.interval.iloc[0] == 3 and grid.interval.iloc[1:].isna().all()
    assert grid.temperature.iloc[1] == 10.0 and grid.temperature.drop(1).isna().all()
    cells = split_table4(grid)
    assert cells[TABLE4_FACTORS].values.tolist() == [["clean_images", "features", "cosine"],
                                                      ["random_noise", "logits", "kl"]]
    assert cells["mean"].tolist() == grid.accuracy.iloc[2:4].tolist() and (cells.seeds == 1).all()
    assert grid[grid.probes.isna()].variant.tolist() == ["a", "interval 1", "b"]  # no Table IV cell
    relabelled = live_grid(cfg, {"interval 3": variants["a"], "fedctta / temperature 10": variants["interval 1"]}, [0])
    assert relabelled.accuracy.tolist() == grid.accuracy.iloc[:2].tolist()
    probe = probe_temperature_grid(cfg, [3], [0], settings={"a / temperature 1": {"ema": 0.9}})
    assert probe.setting.tolist() == ["a / temperature 1"] and probe.temperature.tolist() == [3.0]
