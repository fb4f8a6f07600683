"""FedICON: contrastive losses against direct loops, eq. 4 weights, the classifier phase, the test-time step,
T3A, and seeded reproducibility (tiny synthetic clients; runs in seconds)."""
import json
import math

import pytest
import torch
from torch import nn

from ftta_core.fedicon import (ClientData, TrainConfig, TTAConfig, aggregation_weights, average_states,
                               contrastive_tta, encoder_names, federated_train, head_names, make_model, ntxent_loss,
                               supcon_loss, t3a_predict, train_classifier)
from ftta_core.fedicon.study import Study, is_record, method_table, record_scope, run_methods
from ftta_core.rng import torch_generator


def supcon_loop(z, labels, tau):
    """Eq. 2-3 written as plain loops over anchors, positives and A(x) (mean over anchors with positives)."""
    z = [[t / math.sqrt(sum(u * u for u in v)) for t in v] for v in z.tolist()]
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
    total, anchors = 0.0, 0
    for i in range(len(z)):
        others = [a for a in range(len(z)) if a != i]
        positives = [p for p in others if labels[p] == labels[i]]
        if not positives:
            continue
        denom = sum(math.exp(dot(z[i], z[a]) / tau) for a in others)
        total += -sum(math.log(math.exp(dot(z[i], z[p]) / tau) / denom) for p in positives) / len(positives)
        anchors += 1
    return total / anchors


def test_supcon_hand_computed_two_points():
    # two identical unit vectors of one class: log(e^{1/tau} / e^{1/tau}) = 0
    z = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert float(supcon_loss(z, torch.tensor([0, 0]), 0.5)) == pytest.approx(0.0, abs=1e-7)
    # three points, orthogonal third of another class: anchor 0 -> -log(e^2 / (e^2 + e^0)), same for anchor 1
    z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    expected = -math.log(math.exp(2) / (math.exp(2) + 1))
    assert float(supcon_loss(z, torch.tensor([0, 0, 1]), 0.5)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("tau", [0.1, 0.5, 1.0])
def test_supcon_matches_loop(tau):
    g = torch_generator(0, "test-supcon")
    z = torch.randn(10, 4, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 3, 1, 1])  # class 3 has no positive: left out of the mean
    assert float(supcon_loss(z, labels, tau)) == pytest.approx(supcon_loop(z, labels.tolist(), tau), rel=1e-9)


def test_ntxent_matches_loop_and_hand_case():
    g = torch_generator(1, "test-ntxent")
    z1, z2 = torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(4, 3, generator=g, dtype=torch.float64)
    ids = [0, 1, 2, 3, 0, 1, 2, 3]
    assert float(ntxent_loss(z1, z2, 0.2)) == pytest.approx(supcon_loop(torch.cat([z1, z2]), ids, 0.2), rel=1e-9)
    # one image, two views: A(x) holds only the positive, so the loss is 0
    assert float(ntxent_loss(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 1.0]]), 0.1)) == pytest.approx(0.0, abs=1e-7)


def test_loss_argument_checks():
    with pytest.raises(ValueError, match="tau"):
        supcon_loss(torch.zeros(2, 2), torch.tensor([0, 0]), 0.0)
    with pytest.raises(ValueError, match="labels"):
        supcon_loss(torch.zeros(2, 2), torch.tensor([0, 0, 1]), 0.1)
    with pytest.raises(ValueError, match="rounds"):
        TrainConfig(rounds=0)


def test_aggregation_weights_eq4():
    w = aggregation_weights([100, 300, 600])
    assert torch.allclose(w, torch.tensor([0.1, 0.3, 0.6], dtype=torch.float64))
    states = [{"a": torch.full((2,), float(v)), "n": torch.tensor(v)} for v in (1, 2, 3)]
    avg = average_states(states, w, ["a", "n"])
    assert torch.allclose(avg["a"], torch.full((2,), 0.1 * 1 + 0.3 * 2 + 0.6 * 3))
    assert int(avg["n"]) == 3  # integer buffers are counters, not averaged: the largest count (engine.average)
    with pytest.raises(ValueError, match="sizes"):
        aggregation_weights([3, 0])


def tiny_clients(sizes=(12, 20), n_test=8, seed=0):
    clients = []
    for i, n in enumerate(sizes):
        g = torch_generator(seed, "tiny", i)
        y = torch.arange(n) % 3
        x = (torch.rand(n, 3, 32, 32, generator=g) * 0.3 + y.view(-1, 1, 1, 1) * 0.3).clamp(0, 1)
        yt = torch.arange(n_test) % 3
        xt = (torch.rand(n_test, 3, 32, 32, generator=g) * 0.3 + yt.view(-1, 1, 1, 1) * 0.3).clamp(0, 1)
        clients.append(ClientData(f"c{i}", x, y, xt, yt, xt))
    return clients


CFG = TrainConfig(rounds=2, local_epochs=1, batch_size=8, cls_rounds=2, cls_personal_epochs=1)


def test_encoder_averaging_and_classifier_phase():
    clients = tiny_clients()
    models = federated_train(clients, "cnn2", "supcon", CFG, seed=0, share="encoder")
    enc = encoder_names(models[0])
    for n in enc:  # eq. 4: every client holds the same averaged encoder
        assert torch.equal(dict(models[0].named_parameters())[n], dict(models[1].named_parameters())[n])
    heads = train_classifier(models, clients, CFG, seed=0)
    for before, after in zip(models, heads):  # the classifier phase leaves the encoder alone, trains the head
        pb, pa = dict(before.named_parameters()), dict(after.named_parameters())
        assert all(torch.equal(pb[n], pa[n]) for n in enc)
        assert not all(torch.equal(pb[n], pa[n]) for n in head_names(after))
    # personalised: after the local epochs, the two clients' heads differ
    assert not torch.equal(heads[0].fc.weight, heads[1].fc.weight)
    # federated only (no personal epochs): heads are the eq. 4 average, identical across clients
    fed = train_classifier(models, clients, TrainConfig(**{**CFG.__dict__, "cls_personal_epochs": 0}), seed=0)
    assert torch.equal(fed[0].fc.weight, fed[1].fc.weight)


def test_contrastive_tta_changes_only_the_encoder():
    clients = tiny_clients()
    model = make_model("cnn2", seed=0, num_classes=3)
    tuned = contrastive_tta(model, clients[0].x_test, CFG, TTAConfig(batch_size=4, lr=0.05),
                            torch_generator(0, "tta"))
    before, after = dict(model.named_parameters()), dict(tuned.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in head_names(model))
    assert any(not torch.equal(before[n], after[n]) for n in encoder_names(model))


def test_t3a_with_no_test_supports_is_prototype_classifier():
    model = make_model("cnn2", seed=0, num_classes=3)
    x = tiny_clients()[0].x_test
    preds = t3a_predict(model, x, TTAConfig(batch_size=len(x), t3a_filter_k=1))
    assert preds.shape == (len(x),) and int(preds.max()) < 3


def test_training_is_reproducible_from_a_seed():
    clients = tiny_clients()
    a = federated_train(clients, "cnn2", "simclr", CFG, seed=3, share="encoder")
    b = federated_train(clients, "cnn2", "simclr", CFG, seed=3, share="encoder")
    c = federated_train(clients, "cnn2", "simclr", CFG, seed=4, share="encoder")
    assert all(torch.equal(p, q) for p, q in zip(a[0].state_dict().values(), b[0].state_dict().values()))
    assert not torch.equal(a[0].conv1.weight, c[0].conv1.weight)


def test_study_methods_and_cache(tmp_path):
    cfg = TrainConfig(rounds=1, local_epochs=1, batch_size=8, cls_rounds=1, cls_personal_epochs=1)
    tta = TTAConfig(batch_size=4, eata_fisher_samples=8)
    methods = ["FedAvg", "FedProx", "FedBN", "FedRep", "Tent", "EATA", "T3A", "FedICON", "ablation 100"]
    rows = run_methods(tmp_path, {"name": "tiny"}, methods, [0], lambda s: tiny_clients(seed=s), "cnn2", cfg, tta,
                       progress=None)
    assert set(rows.method) == set(methods) and len(rows) == 2 * len(methods)
    again = run_methods(tmp_path, {"name": "tiny"}, methods, [0], lambda s: pytest.fail("cache missed"), "cnn2",
                        cfg, tta, progress=None)
    assert again.equals(rows)
    # each stored result is a study record holding what record_scope says (what `runs --migrate` re-scopes to)
    stored = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert len(stored) == len(methods) and all(is_record(r) for r in stored)
    assert all(r["code"]["units"] == record_scope()["units"] for r in stored)
    table = method_table(rows, methods)
    assert list(table.columns) == ["c0", "c1", "mean"]
    with pytest.raises(ValueError, match="method"):
        Study(tiny_clients(), "cnn2", cfg, tta, 0).accuracies("nope")


def test_cli_fedicon_writes_table(tmp_path):
    from ftta_core.cli import main

    assert main(["study", "fedicon", "table", "--methods", "FedAvg", "T3A", "--rounds", "1", "--n-train", "8", "--n-test", "4",
                 "--out", str(tmp_path)]) == 0
    text = (tmp_path / "table.md").read_text()
    assert "FedAvg" in text and "T3A" in text and "mnistm" in text
    assert main(["study", "fedicon", "table", "--methods", "nope", "--rounds", "1", "--n-train", "8", "--n-test", "4",
                 "--out", str(tmp_path)]) == 2


def test_office_covariate_clients_split_each_domain_once_and_corrupt_only_the_test_part():
    """Table 5 shape: one client per Office-Caltech-10 domain; train and test parts disjoint and together the whole
    domain; only the test part corrupted; the same split and corruptions from the same seed."""
    from collections import Counter

    from ftta_core.data import load_dataset
    from ftta_core.data.root import data_root
    from ftta_core.fedicon.data import OFFICE_CLIENT_DOMAINS, office_covariate_clients

    if not (data_root() / "office_caltech10").exists():
        pytest.skip("Office-Caltech-10 is absent from the shared data folder")
    clients = office_covariate_clients(16, seed=0, test_fraction=0.1)
    images = lambda x: Counter(tuple(v) for v in x.flatten(1).mul(255).round().int().tolist())
    assert [c.name for c in clients] == list(OFFICE_CLIENT_DOMAINS)
    for c in clients:
        full = load_dataset(f"office_caltech10/{c.name}", "all", size=16)
        assert len(c.y_test) == round(0.1 * len(full))
        assert images(c.x_train) + images(c.x_test_clean) == images(full.tensors()[0])
        assert not torch.equal(c.x_test, c.x_test_clean)
    again = office_covariate_clients(16, seed=0, test_fraction=0.1)
    assert all(torch.equal(a.x_test, b.x_test) and torch.equal(a.y_train, b.y_train) for a, b in zip(clients, again))
    with pytest.raises(ValueError, match="test_fraction"):
        office_covariate_clients(16, seed=0, test_fraction=1.0)


def test_online_tta_never_adapts_on_a_single_image_batch():
    """A last test batch of one image joins the one before: ResNet-18 at 32 px has 1x1 maps, where BatchNorm in
    training mode cannot take one image (Office-Caltech caltech10 under Table 5's split: 225 = 7 x 32 + 1)."""
    from ftta_core.fedicon.adaptation import online_batches, tent_predict
    from ftta_core.fedicon.models import make_model

    assert online_batches(225, 32)[-1] == slice(192, 225) and len(online_batches(225, 32)) == 7
    assert online_batches(200, 32)[-1] == slice(192, 200) and online_batches(1, 32) == [slice(0, 1)]
    assert sum(b.stop - b.start for b in online_batches(97, 32)) == 97
    x = torch.rand(33, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    preds = tent_predict(make_model("resnet18", seed=0), x, TTAConfig(batch_size=32))
    assert preds.shape == (33,)


def _tidy(values):
    """Tidy FedICON rows from {method: {seed: {client: accuracy}}}."""
    import pandas as pd

    return pd.DataFrame([{"method": m, "seed": s, "client": c, "accuracy": a, "shift": "shifted"}
                         for m, by_seed in values.items() for s, by_client in by_seed.items()
                         for c, a in by_client.items()])


def test_paired_verdict_flags_a_fedavg_at_chance():
    from studies.fedicon.report import paired_verdict

    at_chance = _tidy({"FedICON": {0: {"a": 40.0}}, "FedAvg": {0: {"a": 11.0}}})
    trained = _tidy({"FedICON": {0: {"a": 40.0}}, "FedAvg": {0: {"a": 30.0}}})
    near = _tidy({"FedICON": {0: {"a": 40.0}}, "FedAvg": {0: {"a": 18.0}}})  # 8 points above chance, under 2x it
    assert "Caveat: FedAvg (11.0%) is within 2x chance (10%)" in paired_verdict("x", at_chance)
    assert "within 2x chance" in paired_verdict("x", near)
    assert "chance" not in paired_verdict("x", trained)
    # one seed: the difference is read, never called ahead
    assert "FedICON - FedAvg = +10.00 (1 seed): undetermined, fewer than 3 seeds" in paired_verdict("x", trained)


def test_budget_reading_reports_each_budget_and_the_domain_gap():
    from studies.fedicon.report import budget_reading

    small = _tidy({"FedICON": {s: {"mnist": 80.0, "mnistm": 20.0 + s} for s in (0, 1)},
                   "FedAvg": {s: {"mnist": 80.0, "mnistm": 40.0} for s in (0, 1)}})
    large = _tidy({"FedICON": {s: {"mnist": 90.0, "mnistm": 50.0 + s} for s in (0, 1)},
                   "FedAvg": {s: {"mnist": 85.0, "mnistm": 40.0} for s in (0, 1)},
                   "Local": {s: {"mnist": 60.0, "mnistm": 30.0} for s in (0, 1)}})
    text = budget_reading({"small": small, "large": large}, {"FedICON": 62.23, "FedAvg": 55.04})
    lines = text.splitlines()
    assert lines[0].startswith("- small") and "FedICON - FedAvg = -9.75" in lines[0]
    assert "on mnistm alone FedICON 20.5, FedAvg 40.0" in lines[0]
    assert lines[1].startswith("- large") and "FedICON - FedAvg = +7.75" in lines[1]
    assert "best other method Local 45.0" in lines[1]
    assert lines[2].endswith("+7.19.")


def test_fill_by_spec_gives_a_variant_the_runs_of_its_twin_method_and_no_other():
    from studies.fedicon.report import distinct_models, fill_by_spec
    from ftta_core.fedicon.study import ABLATION, ablation_name

    variants = [ablation_name(*f) for f in ABLATION]
    needed = distinct_models(["Local", "FedAvg", "FedICON", "FedICON w/o TTA", *variants, "FedICON-us"])
    # "none of the parts" is Local, "sharing only" FedAvg, "all three" FedICON, "no TTA" FedICON w/o TTA
    assert needed == ["Local", "FedAvg", "FedICON", "FedICON w/o TTA", "ablation 100", "ablation 001",
                      "ablation 011", "ablation 101", "FedICON-us"]
    rows = _tidy({"Local": {0: {"a": 30.0}}, "FedICON": {0: {"a": 60.0}}, "ablation 100": {0: {"a": 40.0}}})
    filled = fill_by_spec(rows, variants)
    by = filled.groupby("method").accuracy.mean()
    assert by["ablation 000"] == 30.0 and by["ablation 111"] == 60.0 and by["ablation 100"] == 40.0
    assert "ablation 010" not in by  # FedAvg has no rows: nothing to copy
    assert len(filled) == len(rows) + 2


def test_components_reading_pairs_each_part_and_names_ties():
    from studies.fedicon.report import components_reading
    from ftta_core.fedicon.study import ABLATION, ablation_name

    acc = {(0, 0, 0): 30.0, (1, 0, 0): 35.0, (0, 1, 0): 50.0, (0, 0, 1): 31.0, (1, 1, 0): 55.0, (0, 1, 1): 58.0,
           (1, 0, 1): 36.0, (1, 1, 1): 58.0}
    methods = {ablation_name(*f): {s: {"a": acc[f] + s} for s in (0, 1)} for f in ABLATION}
    methods.update({"FedICON": methods[ablation_name(True, True, True)],
                    "FedICON-us": {s: {"a": 57.0 + s} for s in (0, 1)}, "FedAvg": methods["ablation 010"]})
    text = components_reading({"budget": _tidy(methods)})
    assert text.startswith("- budget (seeds [0, 1])")
    assert "local invariance extraction: all three - without it = +0.00" in text  # 111 vs 011
    assert "global invariance sharing: all three - without it = +22.00" in text and "(paper +12.56)" in text
    assert "test-time adaptation: all three - without it = +3.00" in text and "(paper +2.84)" in text
    tie = "[global invariance sharing, test-time adaptation] = [local invariance extraction, global invariance " \
          "sharing, test-time adaptation] (58.50"
    assert tie in text
    assert "FedICON - FedICON-us = +1.00" in text and "(paper +0.63)" in text
    assert "FedICON-us - FedAvg = +7.00" in text and "(paper +6.56)" in text
