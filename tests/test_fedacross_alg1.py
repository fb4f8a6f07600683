"""FedAcross+ as Algorithm 1 trains it: per-batch T through the frozen backbone, eq. 6 on tau(T(x)), k per class,
early stopping, and the A2 settling table; the defaults stay the cached-feature path of the stored runs."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ftta_core.fedacross import (ClientSpec, EarlyStop, ModelSpec, adapt_client, adapter_state, build_model,
                                 holdout_split, train_adapter, vessal_select,
                                 vessal_select_per_class)
from ftta_core.fedacross.client import _holdout_score, backbone_features, client_copy, embed_features
from studies.fedacross.study import (A2_VARIANTS, ClientFeatures, a2_settling, a2_summary, evaluate_client,
                                       support_indices)
from ftta_core.rng import numpy_generator, torch_generator


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return build_model(ModelSpec("resnet18", "imagenet", 10, 32), seed=0)


def _client(model, name: str, n_stream: int = 40, n_test: int = 20, seed: int = 0) -> ClientFeatures:
    gen = torch_generator(seed, "alg1-test", name)
    xs, xt = torch.rand(n_stream, 3, 32, 32, generator=gen), torch.rand(n_test, 3, 32, 32, generator=gen)
    ys, yt = torch.arange(n_stream) % 10, torch.arange(n_test) % 10
    return ClientFeatures(name, backbone_features(model, xs), ys, backbone_features(model, xt), yt, xs)


def _previous_adapt_client(model, feats, labels, spec, seed, *keys):
    """The cached-feature loop as it was before the Alg. 1 options (the regression oracle for the defaults)."""
    client, opt = client_copy(model, spec)
    gen = torch_generator(seed, "fedacross", "client", *[str(k) for k in keys])
    n, steps = len(labels), 0
    client.adapter.train()
    client.classifier.eval()
    for _ in range(spec.epochs if n >= 2 else 0):
        perm = torch.randperm(n, generator=gen)
        for s in range(0, n, spec.batch_size):
            idx = perm[s:s + spec.batch_size]
            if len(idx) < 2:
                continue
            if spec.max_steps is not None and steps >= spec.max_steps:
                return client.eval()
            loss = F.cross_entropy(client.classifier(client.adapter(feats[idx])), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
    return client.eval()


def _count_backbone_calls(model):
    calls = []
    handle = model.backbone.register_forward_hook(lambda mod, inp, out: calls.append(inp[0].shape[0]))
    return calls, handle


@pytest.mark.parametrize("spec", [ClientSpec(epochs=3, batch_size=16), ClientSpec(epochs=4, max_steps=5)])
def test_default_path_reproduces_the_previous_training(model, spec):
    c = _client(model, "default")
    new = adapt_client(model, c.stream, c.stream_labels, spec, 3, "a", 1)
    old = _previous_adapt_client(model, c.stream, c.stream_labels, spec, 3, "a", 1)
    assert all(torch.equal(a, b) for a, b in zip(adapter_state(new).values(), adapter_state(old).values()))
    # the default VeSSAL selection still embeds tau(x) of the clean stream with the whole k * L budget
    expected = vessal_select(embed_features(model, c.stream), 20, numpy_generator(0, "fedacross", "select", "vessal",
                                                                                  2, "x"))
    assert np.array_equal(support_indices("vessal", model, c, 2, 0, "x"), expected)


def test_augmented_path_passes_every_batch_through_the_frozen_backbone(model):
    c = _client(model, "aug")
    spec = ClientSpec(epochs=3, batch_size=16, augment_through_backbone=True)
    backbone_before = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    calls, handle = _count_backbone_calls(model)
    try:
        client, log = train_adapter(model, c.stream, c.stream_labels, spec, 0, "k", images=c.stream_images)
        assert calls == [16, 16, 8] * 3 and log.backbone_batches == 9 == log.steps
        calls.clear()
        plain, plain_log = train_adapter(model, c.stream, c.stream_labels, dataclasses.replace(
            spec, augment_through_backbone=False), 0, "k")
        assert calls == [] and plain_log.backbone_batches == 0
    finally:
        handle.remove()
    # f and its BN statistics untouched (frozen, eval mode); A trained on different (augmented) features
    assert all(torch.equal(backbone_before[k], v) for k, v in client.backbone.state_dict().items())
    assert not torch.equal(client.adapter[0].weight, plain.adapter[0].weight)
    again, _ = train_adapter(model, c.stream, c.stream_labels, spec, 0, "k", images=c.stream_images)
    assert torch.equal(again.adapter[0].weight, client.adapter[0].weight)  # seeded augmentation
    with pytest.raises(ValueError, match="images"):
        train_adapter(model, c.stream, c.stream_labels, spec, 0)
    with pytest.raises(ValueError, match="stream images"):
        evaluate_client(model, dataclasses.replace(c, stream_images=None), np.arange(20), spec, 0)


def test_vessal_on_the_augmented_view_and_per_class_k(model):
    c = _client(model, "sel", n_stream=120)
    clean = support_indices("vessal", model, c, 3, 0, "s")
    aug = support_indices("vessal", model, c, 3, 0, "s", view="augmented")
    assert not np.array_equal(clean, aug)
    full = support_indices("vessal", model, c, 3, 0, "s", view="augmented", per_class=True)
    assert np.bincount(c.stream_labels[full].numpy(), minlength=10).tolist() == [3] * 10
    with pytest.raises(ValueError, match="VeSSAL"):
        support_indices("random", model, c, 3, 0, per_class=True)
    with pytest.raises(ValueError, match="stream images"):
        support_indices("vessal", model, dataclasses.replace(c, stream_images=None), 3, 0, view="augmented")


def test_per_class_filling_is_k_per_class_where_the_pool_allows():
    gen = torch_generator(0, "pc")
    labels = np.r_[np.arange(200) % 4, [4, 4]]  # class 4 has 2 items only
    emb = torch.randn(len(labels), 6, generator=gen)
    for s in range(5):
        picked = vessal_select_per_class(emb, labels, 5, 5, numpy_generator(s, "pc"))
        assert len(np.unique(picked)) == len(picked) and np.all(np.diff(picked) > 0)
        assert np.bincount(labels[picked], minlength=5).tolist() == [5, 5, 5, 5, 2]
    assert len(vessal_select_per_class(emb, labels, 0, 5, numpy_generator(0, "pc"))) == 0


def test_holdout_early_stopping_stops_and_restores_the_best_a(model):
    gen = torch_generator(9, "es")
    labels = torch.arange(60) % 10
    feats = torch.randn(60, 512, generator=gen)  # no class structure: A can only over-fit the training part
    stop = EarlyStop(patience=3)
    client, log = train_adapter(model, feats, labels, ClientSpec(epochs=200, lr=0.5, early_stop=stop), 0, "es")
    assert log.epochs < 200 and log.epochs == log.best_epoch + stop.patience
    train, val = holdout_split(labels, 1, 0, "es")
    assert len(val) == 10 and len(np.intersect1d(train, val)) == 0
    best = log.history[log.best_epoch - 1]
    acc, neg_ce = _holdout_score(client, feats[train], labels[train], feats[val], labels[val])
    assert acc == pytest.approx(best["val_accuracy"]) and -neg_ce == pytest.approx(best["val_loss"], rel=1e-5)
    assert (best["val_accuracy"], -best["val_loss"]) >= max((h["val_accuracy"], -h["val_loss"]) for h in log.history)
    with pytest.raises(ValueError, match="hold"):
        train_adapter(model, feats[:10], labels[:10], ClientSpec(epochs=5, early_stop=stop), 0)


def test_loss_plateau_rule_and_bad_options(model):
    gen = torch_generator(10, "plateau")
    feats, labels = torch.randn(40, 512, generator=gen), torch.arange(40) % 10
    spec = ClientSpec(epochs=50, early_stop=EarlyStop(rule="loss", patience=2, min_delta=10.0))
    _, log = train_adapter(model, feats, labels, spec, 0)
    assert log.epochs == 3 and log.best_epoch == 1
    for bad in ({"rule": "val"}, {"patience": 0}, {"min_delta": -1.0}, {"val_per_class": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            EarlyStop(**bad)


def test_a2_settling_tiny(model):
    clients = {s: [_client(model, f"c{i}", seed=s) for i in range(2)] for s in (0, 1)}
    spec = ClientSpec(epochs=3, batch_size=16)
    table = a2_settling(model, clients, [1, 2], spec, EarlyStop(patience=1))
    assert len(table) == 2 * 2 * (1 + 2 * 4)
    assert set(table.variant) == set(A2_VARIANTS) and (table[table.variant == A2_VARIANTS[0]].k == 0).all()
    by = table.set_index(["seed", "client", "k", "variant"])
    assert (table[table.variant == "prototypes, server A"].steps == 0).all()
    alg1 = table[table.variant.str.contains("Alg. 1") & table.accuracy.notna()]
    assert (alg1.backbone_batches > 0).all() and (table[table.variant.str.contains("cached")].backbone_batches == 0).all()
    assert table[table.k == 1].loc[lambda t: t.variant.str.contains("early")].note.eq("no hold-out item").all()
    # the cached-feature variant is what the stored runs did (evaluate_client with the default spec)
    c = clients[1][0]
    idx = support_indices("balanced", model, c, 2, 1, c.name)
    acc, _ = evaluate_client(model, c, idx, spec, 1, None, c.name, 2, "balanced")
    assert by.loc[(1, c.name, 2, "prototypes, A on cached features"), "accuracy"] == acc
    summary = a2_summary(table)
    assert summary.loc[("prototypes, A as Alg. 1", 2), "seeds"] == 2
    with pytest.raises(ValueError, match="variants"):
        a2_settling(model, clients, [2], spec, variants=["A"])


def test_a2_reading_pairs_each_variant_with_g_by_seed():
    import pandas as pd

    from studies.fedacross.study import A2_VARIANTS, a2_reading

    rows = []
    for seed in (0, 1, 2):
        rows.append({"seed": seed, "client": "c", "k": 0, "variant": A2_VARIANTS[0], "accuracy": 40.0 + seed})
        for k in (3, 5):
            rows.append({"seed": seed, "client": "c", "k": k, "variant": A2_VARIANTS[1], "accuracy": 30.0 + seed})
            rows.append({"seed": seed, "client": "c", "k": k, "variant": A2_VARIANTS[3], "accuracy": 45.0 + 2 * seed})
            rows.append({"seed": seed, "client": "c", "k": k, "variant": A2_VARIANTS[4], "accuracy": 45.0 + 2 * seed})
    text = a2_reading(pd.DataFrame(rows))
    assert "g (the server's classifier, no adaptation): 41.0%" in text
    assert "prototypes, server A: k = 3: 31.0% (below g)" in text
    assert "prototypes, A as Alg. 1: k = 3: 47.0% (above g)" in text
    assert "Effect of early stopping: k = 3: with - without = +0.00 [+0.00, +0.00] (3 seeds): identical" in text
    assert "Effect of training A (Alg. 1) at all: k = 3: with - without = +16.00 [" in text


def test_fedacross_reading_calls_a_cell_above_or_below_g_only_when_its_interval_excludes_0():
    import pandas as pd

    from studies.fedacross.study import fedacross_reading

    rows = []
    for seed in (0, 1, 2):
        rows.append({"k": 0, "selection": "none", "seed": seed, "accuracy": 40.0 + seed})
        rows.append({"k": 3, "selection": "random", "seed": seed, "accuracy": 30.0 + seed})  # 10 below at every seed
        rows.append({"k": 3, "selection": "vessal", "seed": seed, "accuracy": 40.0 + seed + (-3, 4, -1)[seed]})
    benefit = pd.DataFrame([{"steps": s, "start": start, "seed": seed, "accuracy": 50.0 + seed + (start == "server A")}
                            for s in (0, 5) for start in ("merged A (FedAvg)", "server A") for seed in (0, 1)])
    text = fedacross_reading(pd.DataFrame(rows), benefit, pd.DataFrame(), pd.DataFrame(), [0, 1, 2])
    assert "the 2 (k, selection) cells: 1 below g, 1 undetermined against g." in text
    assert "k = 3: VeSSAL - random = +10.00 [" in text and "(3 seeds): ahead" in text
    # two seeds: a constant difference is still undetermined (stats.MIN_SEEDS)
    assert "the merged A is undetermined at 2 of 2 step counts" in text
    assert "merged A - server A = -1.00 [-1.00, -1.00] (2 seeds): undetermined, fewer than 3 seeds" in text
