"""FedAcross+: prototypes (eq. 4), nearest-prototype inference (eq. 5), A-only training, VeSSAL (eq. 6), merge."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ftta_core.fedacross import (ClientSpec, ModelSpec, PretrainSpec, VolumeSampler, adapt_client, adapter_state,
                                 balanced_select, build_model, class_prototypes, load_fedacross, merge_adapters,
                                 nearest_prototype, predict, pretrain_server, random_select, run_client,
                                 save_fedacross, sherman_morrison, vessal_select)
from studies.fedacross.study import cost_table
from ftta_core.data import load_embedded_digits
from ftta_core.rng import numpy_generator, torch_generator


@pytest.fixture(scope="module")
def model():
    return build_model(ModelSpec("resnet18", "imagenet", 10, 32), seed=0)


def test_prototypes_are_class_means():
    emb = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 4.0], [0.0, 6.0]])
    protos = class_prototypes(emb, torch.tensor([0, 0, 1, 1]), 3)
    assert torch.equal(protos.centres, torch.tensor([[1.0, 0.0], [0.0, 5.0], [0.0, 0.0]]))
    assert protos.present.tolist() == [True, True, False]
    assert protos.num_bytes == 2 * 2 * 4
    with pytest.raises(ValueError, match="labels"):
        class_prototypes(emb, torch.tensor([0, 0, 1, 3]), 3)


def test_nearest_prototype_euclidean_and_skips_absent_classes():
    protos = class_prototypes(torch.tensor([[1.0, 0.0], [0.0, 5.0]]), torch.tensor([0, 1]), 3)
    # (0, 0) is exactly the (zero) centre of the absent class 2: it must still go to the nearest present class 0
    query = torch.tensor([[0.9, 0.1], [0.0, 4.9], [0.0, 0.0], [3.0, 3.1]])
    assert nearest_prototype(query, protos).tolist() == [0, 1, 0, 1]


def test_only_the_adaptation_module_trains(model):
    gen = torch_generator(0, "test")
    feats, labels = torch.randn(40, 512, generator=gen), torch.arange(40) % 10
    before = {k: v.clone() for k, v in model.state_dict().items()}
    client = adapt_client(model, feats, labels, ClientSpec(epochs=3, lr=0.1), 0)
    after = client.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("adapter.") for k in changed)
    assert {"adapter.0.weight", "adapter.1.weight", "adapter.1.running_mean"} <= changed
    assert all(p.requires_grad == n.startswith("adapter.") for n, p in client.named_parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the server model is untouched


def test_client_predicts_by_prototypes_and_k0_by_classifier(model):
    gen = torch_generator(1, "test")
    centres = 5 * torch.randn(10, 512, generator=gen)
    labels = torch.arange(50) % 10
    feats = centres[labels] + 0.1 * torch.randn(50, 512, generator=gen)
    result = run_client(model, feats, labels, ClientSpec(epochs=20), seed=0)
    assert result.n_support == 50 and bool(result.prototypes.present.all())
    assert (predict(model, result, feats) == labels).float().mean() > 0.9
    with torch.no_grad():
        model.adapter.eval()
        expected = model.classifier(model.adapter(feats)).argmax(1)
    assert torch.equal(predict(model, None, feats), expected)
    assert result.upload_bytes() == sum(v.numel() * v.element_size() for v in result.adapter.values()) + 10 * 32 * 4


def test_sherman_morrison_equals_direct_inverse():
    gen = torch_generator(2, "test")
    inv = 100 * torch.eye(6, dtype=torch.float64)
    s = torch.eye(6, dtype=torch.float64) / 100
    for _ in range(5):
        u = torch.randn(6, generator=gen, dtype=torch.float64)
        inv, s = sherman_morrison(inv, u), s + torch.outer(u, u)
        torch.testing.assert_close(inv, torch.linalg.inv(s), rtol=1e-8, atol=1e-10)


def test_volume_sampler_state_matches_its_definition():
    gen = torch_generator(3, "test")
    emb = torch.randn(60, 5, generator=gen, dtype=torch.float64)
    sampler = VolumeSampler(5, 12, 60, numpy_generator(0, "test"))
    for u in emb:
        sampler.observe(u)
    chosen = emb[sampler.selected]
    s = torch.eye(5, dtype=torch.float64) / 100 + chosen.T @ chosen
    torch.testing.assert_close(sampler.inv, torch.linalg.inv(s), rtol=1e-8, atol=1e-10)
    cov = emb.T @ emb / len(emb)
    assert sampler.trace == pytest.approx(float(torch.trace(cov @ sampler.inv)), rel=1e-8)


def test_sampling_rate_and_budget():
    gen = torch_generator(4, "test")
    emb = torch.randn(200, 8, generator=gen)
    # first item: C = u u^T and S^-1 = 100 I, so p = rate * (u^T S^-1 u) / tr(C S^-1) = budget / n exactly
    first = VolumeSampler(8, 20, 200, numpy_generator(0, "x"))
    assert first.probability(emb[0]) == pytest.approx(20 / 200)
    counts = [len(vessal_select(emb, 20, numpy_generator(s, "budget"))) for s in range(30)]
    assert max(counts) <= 20 and 14 <= np.mean(counts) <= 20
    assert len(vessal_select(emb, 0, numpy_generator(0, "zero"))) == 0
    picked = random_select(200, 20, numpy_generator(0, "random"))
    assert len(np.unique(picked)) == 20 and np.all(np.diff(picked) > 0)
    with pytest.raises(ValueError, match="budget"):
        random_select(10, 11, numpy_generator(0, "random"))
    labels = np.arange(100) % 10
    support = balanced_select(labels, 3, 10, numpy_generator(0, "balanced"))
    assert np.bincount(labels[support], minlength=10).tolist() == [3] * 10


def test_vessal_prefers_novel_directions():
    # a stream of one repeated direction with a few orthogonal items: VeSSAL labels the rare directions far more often
    rng = numpy_generator(5, "test")
    base = np.zeros((300, 4))
    base[:, 0] = 1.0
    rare = rng.choice(300, 15, replace=False)
    base[rare, 0], base[rare, 1 + np.arange(15) % 3] = 0.0, 1.0
    emb = torch.tensor(base)
    hits = sum(np.isin(vessal_select(emb, 15, numpy_generator(s, "v")), rare).mean() for s in range(10)) / 10
    rand = sum(np.isin(random_select(300, 15, numpy_generator(s, "r")), rare).mean() for s in range(10)) / 10
    assert hits > 3 * rand


def test_merge_adapters_is_weighted_fedavg(model):
    a = adapter_state(model)
    b = {k: (v + 1 if v.is_floating_point() else v + 4) for k, v in a.items()}
    merged = merge_adapters([a, b], [1, 3])
    torch.testing.assert_close(merged["0.weight"], a["0.weight"] + 0.75)
    assert merged["1.num_batches_tracked"] == b["1.num_batches_tracked"]
    with pytest.raises(ValueError, match="weights"):
        merge_adapters([a, b], [1])


def test_bad_parameters_name_the_field():
    with pytest.raises(ValueError, match="stem"):
        ModelSpec(stem="vgg")
    with pytest.raises(ValueError, match="lr"):
        ClientSpec(lr=0)
    with pytest.raises(ValueError, match="label_smoothing"):
        PretrainSpec(label_smoothing=1.5)


def test_pretraining_step_and_checkpoint_roundtrip(tmp_path):
    data = load_embedded_digits("train")
    rgb = data.subset(np.arange(64))
    rgb = type(rgb)(rgb.name, np.repeat(rgb.images, 3, axis=3) if rgb.images.shape[3] == 1 else rgb.images,
                    rgb.labels, rgb.class_names)
    m = build_model(ModelSpec("resnet18", "cifar", 10, 16), seed=0)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    losses = []
    pretrain_server(m, rgb, PretrainSpec(epochs=1, batch_size=32), seed=0, log=lambda s, l: losses.append(l))
    assert len(losses) == 2 and all(np.isfinite(losses))
    assert not torch.equal(before["backbone.conv1.weight"], m.state_dict()["backbone.conv1.weight"])
    save_fedacross(m, "tiny", {"note": "test"}, tmp_path)
    loaded = load_fedacross("tiny", tmp_path)
    x, _ = rgb.tensors(np.arange(8))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), m(x), rtol=0.05, atol=0.05)


def test_cost_table_counts_adapter_only(model):
    table = cost_table(model, 5)
    ours, full = table.iloc[0], table.iloc[1]
    assert ours.parameters_trained == 512 * 32 + 32 + 2 * 32
    assert ours.bytes_up == ours.bytes_down + 10 * 32 * 4
    assert full.parameters_trained > 100 * ours.parameters_trained


def test_untrained_model_of_a_committed_card_is_seeded():
    from ftta_core.fedacross import untrained_fedacross

    a, b = untrained_fedacross("fedacross_resnet18_cifar10", 0), untrained_fedacross("fedacross_resnet18_cifar10", 0)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
