"""FedTHE baseline of the FedICON study: the ensemble weight, the two heads' sharing, the frozen model at test time,
seeded reproducibility and the Study/run_methods wiring (tiny synthetic clients; each test runs in seconds)."""
import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from ftta_core.fedicon import FedTHEConfig, TrainConfig, TTAConfig, TwoHeadModel, fedthe_train, make_model, the_predict
from ftta_core.fedicon.adaptation import predict
from ftta_core.fedicon.fedthe import _plus_logits, ensemble_weights, feature_history, marginal_entropy
from ftta_core.fedicon.study import METHODS, TABLE1_METHODS, run_methods
from ftta_core.fedicon.training import federated_train, make_objective
from ftta_core.rng import torch_generator

from test_fedicon import tiny_clients

CFG1 = TrainConfig(rounds=1, local_epochs=1, batch_size=8, cls_rounds=1, cls_personal_epochs=1)
THE = FedTHEConfig()


def random_batch(seed: int, b: int = 6, c: int = 3, d: int = 5):
    g = torch_generator(seed, "test-fedthe-batch")
    return [torch.randn(*shape, generator=g) for shape in [(b, c), (b, c), (b, d), (d,), (d,)]]


def test_ensemble_weight_in_unit_interval_and_moves_when_heads_differ():
    g, p, z, h_l, h_g = random_batch(0)
    e = ensemble_weights(g, p, z, h_l, h_g, THE)
    assert e.shape == (6,) and bool(((e >= 0) & (e <= 1)).all())
    assert not torch.allclose(e, torch.full_like(e, THE.init))
    assert torch.equal(ensemble_weights(g, p, z, h_l, h_g, FedTHEConfig(steps=0)), torch.full_like(e, 0.5))


@pytest.mark.parametrize("init", [0.5, 0.3])
def test_ensemble_weight_stays_at_init_when_the_objective_has_zero_gradient(init):
    # identical heads: the ensemble is the same whatever e (zero entropy gradient) and s = 1 (no alignment term)
    g, _, z, h_l, h_g = random_batch(1)
    e = ensemble_weights(g, g.clone(), z, h_l, h_g, FedTHEConfig(init=init))
    assert torch.allclose(e, torch.full_like(e, init), atol=1e-7, rtol=0)
    if init == 0.5:
        assert torch.equal(e, torch.full_like(e, 0.5))


def identical_heads_model(seed: int = 0) -> TwoHeadModel:
    body = make_model("cnn2", seed, num_classes=3)
    with torch.no_grad():
        body.fc.bias.zero_()
        personal = torch.nn.Linear(64, 3, bias=False)
        personal.weight.copy_(body.fc.weight)
    return TwoHeadModel(body, personal, torch.zeros(64), torch.ones(64))


def test_identical_heads_give_either_heads_prediction():
    model = identical_heads_model()
    x = tiny_clients()[0].x_test
    preds, e = the_predict(model, x, THE, batch_size=3)
    assert torch.equal(e, torch.full((len(x),), 0.5))
    assert torch.equal(preds, predict(model.body, x))
    with torch.no_grad():
        assert torch.equal(preds, model.personal(model.forward_features(x)).argmax(1))


def test_global_head_is_aggregated_personal_head_is_not():
    clients = tiny_clients()
    models = fedthe_train(clients, "cnn2", CFG1, THE, seed=0)
    a, b = models[0].body.state_dict(), models[1].body.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # encoder + global head: FedAvg
    assert not torch.equal(models[0].personal.weight, models[1].personal.weight)  # personalised head: local
    assert models[0].personal.bias is None
    assert torch.equal(models[0].global_rep, models[1].global_rep)
    assert not torch.equal(models[0].local_rep, models[1].local_rep)
    # h_g is the size-weighted mean of the clients' mean training features (sizes 12 and 20)
    assert torch.allclose(models[0].global_rep, (12 * models[0].local_rep + 20 * models[1].local_rep) / 32, atol=1e-6)


def test_personal_head_is_trained_before_every_local_update_and_on_the_final_model():
    clients = tiny_clients()
    none = fedthe_train(clients, "cnn2", CFG1, FedTHEConfig(personal_epochs=0), seed=0)
    one = fedthe_train(clients, "cnn2", CFG1, THE, seed=0)
    # the personalised head never touches the shared model ...
    assert all(torch.equal(p, q) for p, q in zip(none[0].body.state_dict().values(), one[0].body.state_dict().values()))
    # ... and is trained (its seeded initialisation is the same in both runs)
    assert not torch.equal(none[0].personal.weight, one[0].personal.weight)


def test_before_local_sees_each_round_s_received_model():
    clients = tiny_clients()
    seen = []
    federated_train(clients, "cnn2", "bsm", TrainConfig(rounds=2, batch_size=8), 0, tag="the",
                    before_local=lambda r, i, m: seen.append((r, i, m.fc.weight.detach().clone())))
    assert [(r, i) for r, i, _ in seen] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert torch.equal(seen[0][2], seen[1][2]) and torch.equal(seen[2][2], seen[3][2])  # the same global model
    assert not torch.equal(seen[0][2], seen[2][2])


def test_fedthe_plus_tunes_a_copy_per_sample():
    model = fedthe_train(tiny_clients(), "cnn2", CFG1, THE, seed=0)[0]
    x = tiny_clients()[0].x_test[:3]
    e = torch.full((3,), 0.5)
    with torch.no_grad():
        g, p = model.heads(model.forward_features(x))
    cfg = FedTHEConfig(plus_steps=2, plus_views=4, plus_lr=0.5)
    g2, p2 = _plus_logits(model, x, e, cfg, CFG1.views, torch_generator(0, "test-plus"))
    assert not torch.allclose(g, g2) and not torch.allclose(p, p2)
    g1, _ = _plus_logits(model, x[:1], e, cfg, CFG1.views, torch_generator(0, "test-plus"))
    assert torch.equal(g1[0], g2[0])  # the first image is tuned from the same start with the same views


def test_test_time_changes_only_the_ensemble_weights():
    clients = tiny_clients()
    model = fedthe_train(clients, "cnn2", CFG1, THE, seed=0)[0]
    before = copy.deepcopy(model.state_dict())
    x = clients[0].x_test
    _, e = the_predict(model, x, THE, batch_size=4)
    _, e_plus = the_predict(model, x, FedTHEConfig(plus_steps=1, plus_views=4), 4, CFG1.views,
                            torch_generator(0, "test-plus"))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # encoder, both heads and h_l, h_g untouched
    assert torch.equal(e, e_plus)  # FedTHE+ tunes after THE: the weights are THE's


def test_same_seed_same_predictions():
    clients = tiny_clients()
    runs = [fedthe_train(clients, "cnn2", CFG1, THE, seed=s) for s in (5, 5, 6)]
    x = clients[1].x_test
    cfg = FedTHEConfig(plus_steps=1, plus_views=4)
    out = [the_predict(r[1], x, cfg, 4, CFG1.views, torch_generator(0, "test-plus")) for r in runs[:2]]
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
    assert all(torch.equal(p, q) for p, q in zip(runs[0][1].state_dict().values(), runs[1][1].state_dict().values()))
    assert not torch.equal(runs[0][1].body.conv1.weight, runs[2][1].body.conv1.weight)
    with pytest.raises(ValueError, match="generator"):
        the_predict(runs[0][1], x, cfg, 4, CFG1.views)


def test_feature_history_is_an_ema_along_the_stream():
    z = torch.tensor([[0.0], [1.0], [2.0]])
    assert torch.allclose(feature_history(z, 0.5), torch.tensor([[0.0], [0.5], [1.25]]))
    assert torch.allclose(feature_history(z, 0.5, torch.tensor([4.0])), torch.tensor([[2.0], [1.5], [1.75]]))


def test_marginal_entropy_and_balanced_softmax():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    p = logits.softmax(1)
    assert float(marginal_entropy(logits)) == pytest.approx(float(-(p * p.log()).sum()), rel=1e-6)
    assert float(marginal_entropy(torch.tensor([[5.0, 0.0], [0.0, 5.0]]))) == pytest.approx(math.log(2), rel=1e-6)
    counts = torch.tensor([3, 0, 1])
    loss = make_objective("bsm", CFG1, counts)
    model = torch.nn.Identity()
    y = torch.tensor([0, 2])
    x = torch.tensor([[0.1, 0.2, 0.3], [1.0, -1.0, 0.0]])
    expected = F.cross_entropy(x + torch.log(torch.tensor([4.0, 1.0, 2.0])), y)
    assert float(loss(model, x, y, None)) == pytest.approx(float(expected), rel=1e-6)
    with pytest.raises(ValueError, match="class_counts"):
        make_objective("bsm", CFG1)
    with pytest.raises(ValueError, match="init"):
        FedTHEConfig(init=1.0)


def test_run_methods_dispatches_fedthe(tmp_path):
    assert "FedTHE" in TABLE1_METHODS and METHODS["FedTHE"][0] == METHODS["FedTHE+"][0] == "fedthe"
    tta = TTAConfig(batch_size=4)
    the = FedTHEConfig(plus_steps=1, plus_views=2)
    methods = ["FedAvg", "FedTHE", "FedTHE+"]
    rows = run_methods(tmp_path, {"name": "tiny"}, methods, [0], lambda s: tiny_clients(seed=s), "cnn2", CFG1, tta,
                       progress=None, the_cfg=the)
    assert set(rows.method) == set(methods) and len(rows) == 2 * len(methods)
    records = [json.loads(p.read_text())["setting"] for p in tmp_path.glob("*.json")]
    assert {r["method"] for r in records if "the" in r} == {"FedTHE", "FedTHE+"}  # FedAvg's key is unchanged
    again = run_methods(tmp_path, {"name": "tiny"}, methods, [0], lambda s: pytest.fail("cache missed"), "cnn2",
                        CFG1, tta, progress=None, the_cfg=the)
    assert again.equals(rows)
