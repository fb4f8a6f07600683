"""EATA, CoTTA and ROID: their defining computations on tiny hand-checkable tensors, per-client state, resume,
backend agreement, and the centralized (one-client, continual) sanity run."""
import copy
import dataclasses
import io
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from studies.centralized import beside_reference, centralized_config, per_corruption_beside, run_centralized
from ftta_core.engine.bank import OptimizerSpec, make_bank
from ftta_core.loop import Engine
from ftta_core.rng import torch_generator
from ftta_core.strategies import build_strategy
from ftta_core.tta import build_local, select_parameters
from ftta_core.tta.augment import AugmentSpec, augment, jitter_orders
from ftta_core.tta.client_params import ema, gradient_step, param_grads, restore_masks, stochastic_restore
from ftta_core.tta.cotta import anchor_confidence, soft_cross_entropy
from ftta_core.tta.eata import eata_selection, ewc_penalty, fisher_information, sample_weights, update_moving_probs
from ftta_core.tta.roid import (KeptStatistics, min_max, prior_correction, roid_weights, soft_likelihood_ratio,
                                symmetric_cross_entropy)

from conftest import shifted_batches

LN2, LN3 = math.log(2), math.log(3)
FISHER = {"fisher_source": "digits_cnn_embedded", "fisher_samples": 48, "fisher_batch": 16}
# small but complete configurations of each method (the digits batches are 8 images per client)
METHOD_CONFIGS = {
    "eata": FISHER,
    "cotta": {"n_augmentations": 3, "ap": 0.95},
    "roid": {},
}


def logits_of(*probs):
    """Logits whose softmax is each given probability row (log-probabilities), as [1, B, K]."""
    return torch.tensor(probs, dtype=torch.float64).log()[None]


def engine(model, name, backend="vectorized", strategy="fedavg", **overrides):
    torch.manual_seed(0)
    return Engine(model, build_local(name, **{**METHOD_CONFIGS[name], **overrides}), build_strategy(strategy),
                  n_clients=4, backend=backend)


# ---------------------------------------------------------------- EATA
def test_eata_entropy_filter_uses_e0_of_ln_c():
    # K=3, E0 = 0.4 ln 3 = 0.439: a 0.98-confident row has H = 0.112 (kept), the uniform row H = ln 3 (dropped)
    logits = logits_of([0.98, 0.01, 0.01], [1 / 3, 1 / 3, 1 / 3], [0.6, 0.3, 0.1])
    reliable, selected = eata_selection(logits, None, None, 0.4 * LN3, 0.4)
    assert reliable.tolist() == [[True, False, False]]  # H(0.6, 0.3, 0.1) = 0.898 > 0.439
    assert torch.equal(reliable, selected)  # no moving average yet: no redundancy filter


def test_eata_redundancy_filter_drops_samples_like_the_moving_average():
    logits = logits_of([0.98, 0.01, 0.01], [0.01, 0.98, 0.01])
    probs = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)  # cos = 0.9999 and 0.0102
    _, selected = eata_selection(logits, probs, torch.tensor([True]), 0.4 * LN3, 0.4)
    assert selected.tolist() == [[False, True]]
    _, selected = eata_selection(logits, probs, torch.tensor([False]), 0.4 * LN3, 0.4)
    assert selected.tolist() == [[True, True]]  # this client has no average yet


def test_eata_weights_and_moving_average_by_hand():
    e0 = 0.4 * LN2
    w = sample_weights(torch.tensor([e0, e0 + 1.0, 0.0]), e0)
    assert torch.allclose(w, torch.tensor([1.0, math.exp(-1.0), math.exp(e0)]))
    probs = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.2, 0.8]])
    has = torch.tensor([True, False, True])
    soft = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]] * 3)
    sel = torch.tensor([[True, False], [True, True], [False, False]])
    new, new_has = update_moving_probs(probs, has, soft, sel, 0.9)
    # blend 0.9 [.5,.5] + 0.1 [1,0]; first average = plain mean; nothing selected = unchanged
    assert torch.allclose(new, torch.tensor([[0.55, 0.45], [0.5, 0.5], [0.2, 0.8]]))
    assert new_has.tolist() == [True, True, True]


def test_ewc_penalty_by_hand():
    params = {"w": torch.tensor([[1.0, 2.0], [0.0, 0.0]])}
    anchor = {"w": torch.tensor([[0.0, 0.0], [1.0, 1.0]])}
    fisher = {"w": torch.tensor([[2.0, 0.5], [1.0, 3.0]])}
    assert torch.allclose(ewc_penalty(params, anchor, fisher, slice(None)), torch.tensor([2.0 + 2.0, 1.0 + 3.0]))
    assert torch.allclose(ewc_penalty({"w": params["w"][1:]}, anchor, fisher, slice(1, 2)), torch.tensor([4.0]))


def test_fisher_matches_plain_autograd_on_the_model(digits_model, one_thread):
    """The bank's Fisher (functional gradients, BN on batch statistics) equals squared gradients on the plain model."""
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(12, 3, 16, 16, generator=gen)
    names = select_parameters(digits_model, "bn_affine")
    bank = make_bank("loop", digits_model, 2, names, OptimizerSpec("sgd", 1e-3))
    fisher = fisher_information(bank, images, batch_size=5)  # batches of 5, 5, 2
    model = copy.deepcopy(digits_model).train()
    params = dict(model.named_parameters())
    expected = {k: torch.zeros_like(params[k]) for k in names}
    for xb in images.split(5):
        logits = model(xb)
        grads = torch.autograd.grad(F.cross_entropy(logits, logits.argmax(1)), [params[k] for k in names])
        for k, g in zip(names, grads):
            expected[k] += g ** 2 / 3
    for k in names:
        assert fisher[k].shape == (2, *params[k].shape)
        assert torch.allclose(fisher[k][0], expected[k], rtol=1e-4, atol=1e-10), k
        assert torch.equal(fisher[k][0], fisher[k][1])


def test_eata_source_images_are_cached_and_read_back_without_the_training_set(tmp_path, monkeypatch):
    """The draw is kept as stored and converted as ``Dataset.tensors`` does, so a machine without the training set
    (a lent GPU) gets the same images, hence the same Fisher."""
    import ftta_core.data as data_module
    from ftta_core.data import DatasetNotFoundError
    from ftta_core.tta.eata import load_source_images, source_images_cache

    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path))
    first = load_source_images("digits_cnn_embedded", 24, seed=5)
    path = source_images_cache("digits_cnn_embedded", 24, 5)
    assert path.is_file() and path.parent.parent == tmp_path and first.shape[0] == 24

    def no_training_set(*args, **kwargs):
        raise DatasetNotFoundError("embedded_digits", [tmp_path / "missing"], tmp_path, "not needed")

    monkeypatch.setattr(data_module, "load_dataset", no_training_set)
    assert torch.equal(load_source_images("digits_cnn_embedded", 24, seed=5), first)
    with pytest.raises(DatasetNotFoundError):  # another draw is not cached: the training set is needed again
        load_source_images("digits_cnn_embedded", 24, seed=6)


def test_eata_needs_a_fisher_source_and_names_bad_fields():
    with pytest.raises(ValueError, match="fisher_source"):
        build_local("eata")
    with pytest.raises(ValueError, match="fisher_source"):
        build_local("eata", fisher_source="no_such_model")
    with pytest.raises(ValueError, match="d_margin"):
        build_local("eata", fisher_alpha=0.0, d_margin=0.0)
    assert build_local("eata", fisher_alpha=0.0).fisher is None  # ETA


def test_eata_without_selected_samples_leaves_sgd_clients_unchanged(digits_model, one_thread):
    """Nothing reliable (E0 tiny): the whole loss, EWC included, is zero, so an SGD client does not move (the
    reference skips its step). The first step moves the clients away from the anchor, so the EWC term is not zero."""
    batches = shifted_batches(steps=2)
    eng = engine(digits_model, "eata", strategy="local", optimizer="sgd", lr=0.1)
    source = eng.bank.get_params()
    eng.step(batches[0])
    before = eng.bank.get_params()
    assert any(not torch.equal(before[k], source[k]) for k in before)
    eng.local.e_margin = 1e-9
    eng.step(batches[1])
    after = eng.bank.get_params()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert eng.local.last_selected.tolist() == [0, 0, 0, 0]


# ---------------------------------------------------------------- CoTTA
def test_cotta_loss_and_anchor_confidence_by_hand():
    uniform = torch.zeros(1, 2, 4)
    assert torch.allclose(soft_cross_entropy(uniform, uniform), torch.full((1, 2), math.log(4)))
    student = logits_of([0.5, 0.5])
    teacher = logits_of([0.9, 0.1])
    assert torch.allclose(soft_cross_entropy(student, teacher), torch.tensor([[LN2]], dtype=torch.float64))
    conf = anchor_confidence(logits_of([0.9, 0.1], [0.3, 0.7]))
    assert torch.allclose(conf, torch.tensor([0.8], dtype=torch.float64))


def test_ema_by_hand():
    out = ema({"a": torch.tensor([1.0, 0.0])}, {"a": torch.tensor([0.0, 1.0])}, 0.75)
    assert torch.allclose(out["a"], torch.tensor([0.75, 0.25]))


def test_stochastic_restore_statistics_and_reproducibility():
    params = {"a": torch.zeros(400, 500), "b": torch.zeros(7)}
    source = {"a": torch.ones(400, 500), "b": torch.ones(7)}
    restored = stochastic_restore(params, source, 0.01, torch_generator(0, "test", 1))
    frac = float(restored["a"].mean())  # restored elements are exactly 1, the others exactly 0
    assert set(restored["a"].unique().tolist()) <= {0.0, 1.0}
    # 200,000 Bernoulli(0.01) draws: std of the fraction = sqrt(0.01 * 0.99 / 2e5) = 2.2e-4; allow 5 std
    assert abs(frac - 0.01) < 5 * math.sqrt(0.01 * 0.99 / 2e5)
    again = restore_masks(params, 0.01, torch_generator(0, "test", 1))
    other = restore_masks(params, 0.01, torch_generator(0, "test", 2))
    assert torch.equal(again["a"], restored["a"].bool())
    assert not torch.equal(other["a"], again["a"])
    assert torch.equal(stochastic_restore(params, source, 1.0, torch_generator(0, "t"))["a"], source["a"])
    assert torch.equal(stochastic_restore(params, source, 0.0, torch_generator(0, "t"))["a"], params["a"])


def test_cotta_teacher_is_the_ema_of_the_student(digits_model, one_thread):
    """Without restore, after one step: teacher = 0.999 source + 0.001 student; with restore=1 the student is reset."""
    batch = shifted_batches(steps=1)[0]
    eng = engine(digits_model, "cotta", strategy="local", restore=0.0)
    source = eng.bank.get_params()
    eng.local.adapt(eng.bank, batch.images)
    student = eng.bank.get_params()
    for k in source:
        assert torch.allclose(eng.local.teacher[k], 0.999 * source[k] + 0.001 * student[k], atol=1e-7)
    assert any(not torch.equal(student[k], source[k]) for k in source)
    eng = engine(digits_model, "cotta", strategy="local", restore=1.0)
    eng.local.adapt(eng.bank, batch.images)
    assert all(torch.equal(eng.bank.get_params()[k], source[k]) for k in source)


def test_cotta_augments_only_below_the_anchor_threshold(digits_model, one_thread):
    x = shifted_batches(steps=1)[0].images
    never = engine(digits_model, "cotta", ap=0.0)
    never.local.prepare(never.bank, x)
    plain = never.local.pseudo_labels(never.bank, x)
    assert not bool(never.local.last_augmented.any())
    assert torch.equal(plain.logits, never.bank.forward(x, "batch").logits)
    always = engine(digits_model, "cotta", ap=1.0)
    always.local.prepare(always.bank, x)
    averaged = always.local.pseudo_labels(always.bank, x)
    assert bool(always.local.last_augmented.all())
    assert not torch.allclose(averaged.logits, plain.logits)


# ---------------------------------------------------------------- ROID
def test_roid_losses_by_hand():
    assert torch.allclose(min_max(torch.tensor([2.0, 4.0, 3.0])), torch.tensor([0.0, 1.0, 0.5]))
    assert torch.equal(min_max(torch.tensor([1.0, 1.0])), torch.zeros(2))
    # p = (0.5, 0.5): -sum 0.5 log(1 + 1e-5); p = (~1, ~0) is clipped to 0.99: -0.99 log(99 + 1e-5)
    slr = soft_likelihood_ratio(torch.tensor([[0.0, 0.0], [100.0, 0.0]], dtype=torch.float64))
    assert torch.allclose(slr, torch.tensor([-math.log(1 + 1e-5), -0.99 * math.log(99 + 1e-5)], dtype=torch.float64))
    x = logits_of([0.9, 0.1])
    h = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    assert torch.allclose(symmetric_cross_entropy(x, x), torch.tensor([[h]], dtype=torch.float64))
    # a symmetric batch has a uniform prior: s = max(1/2, 1/2) / 0.5 = 1, factor (0.5 + 1) / (1 + 2) = 0.5
    logits = torch.tensor([[[2.0, -1.0], [-1.0, 2.0]]])
    assert torch.allclose(prior_correction(logits), 0.5 * logits)


def test_roid_weights_by_hand():
    # moving average uniform (0.5, 0.5); softmax rows (0.5, 0.5), (0.9, 0.1), (0.75, 0.25)
    logits = logits_of([0.5, 0.5], [0.9, 0.1], [0.75, 0.25])
    probs = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    w = roid_weights(logits, probs, 1 / 3)
    cos = torch.tensor([1.0, 0.5 / (math.sqrt(0.5) * math.sqrt(0.82)), 0.5 / (math.sqrt(0.5) * math.sqrt(0.625))])
    div = 1 - cos  # [0, 0.2191, 0.1056] -> min-max [0, 1, 0.482]; mean 0.494: the third is dropped too
    div = (div - div.min()) / (div.max() - div.min())
    ent = torch.tensor([LN2, -(0.9 * math.log(0.9) + 0.1 * math.log(0.1)),
                        -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))])
    cert = (-ent - (-ent).min()) / ((-ent).max() - (-ent).min())  # [0, 1, 0.408]
    expected = torch.where(div >= div.mean(), torch.exp(div * cert * 3), torch.zeros(3))
    assert expected.tolist()[0] == 0.0 and expected.tolist()[2] == 0.0 and abs(expected[1] - math.exp(3)) < 1e-9
    assert torch.allclose(w[0], expected.double())


def test_gradient_step_equals_a_direct_step(digits_model, one_thread):
    """The surrogate step with precomputed gradients moves parameters exactly like bank.adapt on the loss."""
    x = shifted_batches(steps=1)[0].images
    names = select_parameters(digits_model, "bn_affine")
    banks = [make_bank("vectorized", digits_model, 4, names, OptimizerSpec("adam", 1e-2)) for _ in range(2)]

    def ent(out, p, x, clients):
        return -(out.logits.softmax(-1) * out.logits.log_softmax(-1)).sum(-1).mean(1)

    for _ in range(2):
        banks[0].adapt(x, ent)
        grads = param_grads(banks[1], lambda p: ent(banks[1].forward(x, "batch", params=p), p, x, slice(None)))
        gradient_step(banks[1], x, grads, "batch")
    a, b = banks[0].get_params(), banks[1].get_params()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert any(not torch.equal(a[k], digits_model.state_dict()[k].expand_as(a[k])) for k in a)


def test_roid_weight_ensembling_and_prior(digits_model, one_thread):
    batch = shifted_batches(steps=1)[0]
    eng = engine(digits_model, "roid", strategy="local", momentum_src=0.0)
    source = eng.bank.get_params()
    out = eng.local.adapt(eng.bank, batch.images)
    assert all(torch.equal(eng.bank.get_params()[k], source[k]) for k in source)  # fully back to the source
    raw = eng.bank.forward(batch.images, "batch").logits  # the source outputs = the outputs of the step
    assert torch.allclose(out.logits, prior_correction(raw), atol=1e-6)
    assert torch.allclose(eng.local.probs, 0.9 / 10 + 0.1 * raw.softmax(-1).mean(1), atol=1e-6)


def test_bad_parameters_name_the_field():
    cases = [("cotta", {"restore": 2.0}, "restore"), ("cotta", {"augmentation": "x"}, "augmentation"),
             ("roid", {"temperature": 0.0}, "temperature"), ("roid", {"momentum_src": 1.5}, "momentum_src")]
    for name, params, field in cases:
        with pytest.raises(ValueError, match=field):
            build_local(name, **params)


def float64_backends_agree(model, name, **options):
    """Run ``name`` (FedAvg mixing, 3 steps) on both backends in float64; assert the same predictions and shared
    state to 1e-9; return the per-backend (step result, shared state) lists."""
    batches = [dataclasses.replace(b, images=b.images.double()) for b in shifted_batches(steps=3)]
    results = {}
    for backend in ("loop", "vectorized"):
        eng = engine(model, name, backend, **options)
        results[backend] = [(eng.step(b), eng.local.shared_state(eng.bank)) for b in batches]
    for (a, sa), (b, sb) in zip(results["loop"], results["vectorized"]):
        assert (a.correct_local == b.correct_local).all()
        assert (a.correct_mixed == b.correct_mixed).all()
        assert set(sa) == set(sb)
        assert all(torch.allclose(sa[k], sb[k], rtol=0, atol=1e-9) for k in sa)
    return results


# ---------------------------------------------------------------- all three
@pytest.mark.parametrize("name", sorted(METHOD_CONFIGS))
def test_backends_agree_with_fedavg(digits_model, name, one_thread):
    """Same predictions (exactly) and shared parameters (atol 1e-9) on the loop and vectorized backends, float64.

    The method's random draws and per-client state live outside the bank, so only the summation order differs; in
    float64 the parameters agree to ~1e-10 after 3 steps. (In float32 Adam turns rounding-level gradient differences
    into lr-sized steps: CoTTA, all parameters with Adam 1e-3, differs by ~1e-3 after 3 steps although its
    predictions agree; see test_engine_backends.)
    """
    model = copy.deepcopy(digits_model).double()
    results = float64_backends_agree(model, name)
    moved = results["vectorized"][-1][1]
    assert any(not torch.equal(moved[k][0], model.state_dict()[k]) for k in moved)


@pytest.mark.parametrize("name", sorted(METHOD_CONFIGS))
def test_state_dict_round_trip_resumes_exactly(digits_model, name, one_thread):
    """Stop after 2 steps, save (torch.save), load into a fresh engine: step 3 equals the uninterrupted run."""
    batches = shifted_batches(steps=3)
    full = engine(digits_model, name)
    for b in batches[:2]:
        full.step(b)
    buf = io.BytesIO()
    torch.save(full.state_dict(), buf)
    buf.seek(0)
    resumed = engine(digits_model, name)
    resumed.load_state_dict(torch.load(buf, weights_only=False))
    state = resumed.local.state_dict()
    assert state["step"] == 2 and all(state[k] is not None for k in resumed.local.state_names)
    a, b = full.step(batches[2]), resumed.step(batches[2])
    assert (a.correct_local == b.correct_local).all() and (a.correct_mixed == b.correct_mixed).all()
    pa, pb = full.bank.get_params(), resumed.bank.get_params()
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_per_client_state_has_a_client_dimension(digits_model, one_thread):
    for name in METHOD_CONFIGS:
        eng = engine(digits_model, name)
        eng.step(shifted_batches(steps=1)[0])
        for key in eng.local.state_names:
            value = getattr(eng.local, key)
            for t in (value.values() if isinstance(value, dict) else [value]):
                assert t.shape[0] == 4, (name, key)


# ---------------------------------------------------------------- centralized sanity run
def test_centralized_run_on_digits(one_thread):
    corruptions = ["gaussian_noise", "contrast"]
    methods = ["source", "bn", "tent", "eata", "cotta", "roid"]
    table = run_centralized(methods, dataset="embedded_digits", images_per_corruption=20, batch_size=10,
                            corruptions=corruptions, device="cpu",
                            overrides={"eata": {"fisher_samples": 40}, "cotta": {"n_augmentations": 2}})
    assert list(table.columns) == ["method", "corruption", "n", "error", "error_after_update"]
    assert table["method"].tolist() == [m for m in methods for _ in corruptions]
    assert table["corruption"].tolist() == corruptions * len(methods)
    assert (table["n"] == 20).all() and table["error"].between(0, 100).all()
    src = table[table.method == "source"]
    assert (src["error"] == src["error_after_update"]).all()  # nothing adapts
    beside = beside_reference(table)
    assert beside.set_index("method").loc["roid", "reference_error"] == 16.2
    assert beside.set_index("method").loc["source", "reference_error"] == 43.5
    assert np.isclose(beside.set_index("method").loc["bn", "ours_error"], table[table.method == "bn"]["error"].mean())
    per = per_corruption_beside(table)
    assert per.loc["contrast", "source_reference"] == 46.7 and "roid_ours" in per.columns


def test_centralized_config_is_one_client_in_sequence():
    cfg = centralized_config("eata", dataset="embedded_digits", images_per_corruption=400, batch_size=200,
                             corruptions=["fog", "snow"], seed=3)
    assert (cfg.clients, cfg.strategy, cfg.scenario, cfg.batch_size) == (1, "local", "fedtsa_iid", 200)
    assert cfg.local_params["fisher_source"] == "digits_cnn_embedded" and cfg.local_params["seed"] == 3
    assert centralized_config("tent").local_params == {"params": "bn_affine", "optimizer": "adam", "lr": 1e-3}
    with pytest.raises(ValueError, match="images_per_corruption"):
        centralized_config("bn", images_per_corruption=100, batch_size=200)


def test_centralized_cli_writes_table_with_command(tmp_path, one_thread):
    from ftta_core.cli import main

    stem = tmp_path / "c"
    rc = main(["study", "centralized", "table", "--methods", "source", "bn", "--dataset", "embedded_digits", "--images", "10",
               "--batch-size", "10", "--corruptions", "fog", "--device", "cpu", "--table", str(stem)])
    assert rc == 0
    md = stem.with_suffix(".md").read_text().splitlines()
    assert md[0].startswith("Made by: `python -m ftta_core") and "| bn |" in "\n".join(md)
    assert len(stem.with_suffix(".csv").read_text().splitlines()) == 3


def test_ordering_reading_names_the_methods_that_move():
    from studies.centralized import ordering_reading

    beside = pd.DataFrame({"method": ["source", "bn", "tent", "cotta"], "ours_error": [36.0, 30.0, 25.0, 28.0],
                           "reference_error": [43.5, 20.4, 20.0, 16.5]})
    text = ordering_reading(beside)
    assert "over 4 methods: 0.80" in text and "Lowest error here: tent; highest: source" in text
    assert "cotta (2 here, 1 there: 28.0% vs 16.5%)" in text and "tent (1 here, 2 there" in text
    assert "The adapting methods span 25.0-30.0% here and 16.5-20.4% there" in text
    assert "bn" not in text.split("Ranks that differ")[1] and "source (" not in text
    same = beside.assign(ours_error=[40.0, 30.0, 29.0, 20.0])
    assert ordering_reading(same).endswith("Same ordering as the benchmark.")
    assert ordering_reading(beside.iloc[:1]).startswith("Fewer than two")


# ---------------------------------------------------------------- options that follow the papers (defaults pinned)
# Logits of the local prediction after 3 adapt steps on shifted_batches(), float64, vectorized backend, client c's
# first sample, class 0 ([c=0..3]) and the sum over everything. Computed with the code before the options
# skip_empty / augment_kept_only / jitter_order existed: the defaults must reproduce them (the stored runs under
# figures/ used these methods). EATA with e_margin 0.1 has a client with no selected sample at step 2, so the
# default "Adam still moves it" path is pinned too; CoTTA with ap 0.95 averages augmentations (colour jitter).
# Tolerance 1e-9: float64 summation order on another CPU (the backends themselves differ by ~1e-14 here); any change
# of behaviour moves these by more than 1e-4.
PINNED_CONFIGS = {"eata": {**FISHER, "e_margin": 0.1}, "cotta": {"n_augmentations": 3, "ap": 0.95}, "roid": {}}
PINNED_LOGITS = {
    "eata": ([-0.3713565149934825, -0.6582418052508899, -3.8450472082258687, 0.59306249999203], -13.513567227328638),
    "cotta": ([-0.37269227571568075, 0.03295408240067051, -3.844560264609599, -2.2362481889059302],
              -13.651518983116958),
    "roid": ([-0.031247048786527152, -0.05567785666739797, -0.47869951194201776, 0.07183166436112069],
             -1.2609179577457936),
}


def pinned_run(model, name, backend="vectorized", **overrides):
    """The local prediction's logits [4, 8, K] after 3 adapt steps (float64) and the engine."""
    eng = engine(copy.deepcopy(model).double(), name, backend, strategy="local",
                 **{**PINNED_CONFIGS[name], **overrides})
    for b in shifted_batches(steps=3):
        out = eng.local.adapt(eng.bank, b.images.double())
    return out.logits, eng


@pytest.mark.parametrize("name", sorted(PINNED_LOGITS))
def test_defaults_reproduce_the_pinned_logits(digits_model, name, one_thread):
    logits, _ = pinned_run(digits_model, name)
    first, total = PINNED_LOGITS[name]
    assert torch.allclose(logits[:, 0, 0], torch.tensor(first, dtype=torch.float64), rtol=0, atol=1e-9)
    assert abs(float(logits.sum()) - total) < 1e-9


def test_pinned_eata_run_has_an_empty_client_that_skip_empty_leaves_alone(digits_model, one_thread):
    """The pinned EATA run exercises the default's empty step (client 1 at step 2); skip_empty changes exactly it."""
    default, eng = pinned_run(digits_model, "eata")
    skipped, _ = pinned_run(digits_model, "eata", skip_empty=True)
    assert eng.local.last_selected.tolist() == [3, 1, 5, 2]
    assert not torch.allclose(default, skipped, rtol=0, atol=1e-6)


def client_state(bank, method, i):
    """Client i's trainable parameters, optimiser state tensors (Adam moments, momentum buffers) and step count."""
    params = {k: v[i].clone() for k, v in bank.get_params().items()}
    if hasattr(bank, "optimizers"):  # loop bank: client i's own optimiser
        opt, row = bank.optimizers[i], (lambda t: t.clone())
    else:  # vectorized bank: row i of the stacked state; the step count per client is the method's client_steps
        opt, row = bank.optimizer, (lambda t: t[i].clone())
    state = {(n, k): row(v) for n, p in enumerate(opt.param_groups[0]["params"])
             for k, v in opt.state.get(p, {}).items() if k != "step"}
    steps = {n: float(opt.state[p]["step"]) for n, p in enumerate(opt.param_groups[0]["params"])
             if "step" in opt.state.get(p, {})} if hasattr(bank, "optimizers") else {}
    own = None if method.client_steps is None else int(method.client_steps[i])
    return params, state, steps, own


def same_state(a, b):
    (pa, sa, ta, na), (pb, sb, tb, nb) = a, b
    return (all(torch.equal(pa[k], pb[k]) for k in pa) and set(sa) == set(sb)
            and all(torch.equal(sa[k], sb[k]) for k in sa) and ta == tb and na == nb)


@pytest.mark.parametrize("backend", ["loop", "vectorized"])
@pytest.mark.parametrize("optim", [{}, {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9}], ids=["adam", "sgd_momentum"])
def test_eata_skip_empty_leaves_a_client_without_selection_exactly_unchanged(digits_model, backend, optim, one_thread):
    """e_margin 0.1: at step 2 client 1 selects nothing. With skip_empty its parameters and optimiser state (moments,
    momentum buffer, step count) are bit-identical after the step while the other clients move; without it (the
    default) Adam / momentum still move it."""
    batches = shifted_batches(steps=2)
    moved = {}
    for skip in (True, False):
        eng = engine(digits_model, "eata", backend, strategy="local", e_margin=0.1, skip_empty=skip, **optim)
        eng.local.adapt(eng.bank, batches[0].images)
        before = [client_state(eng.bank, eng.local, i) for i in range(4)]
        eng.local.adapt(eng.bank, batches[1].images)
        after = [client_state(eng.bank, eng.local, i) for i in range(4)]
        assert eng.local.last_selected.tolist() == [2, 0, 4, 4]
        assert all(not same_state(before[i], after[i]) for i in (0, 2, 3))
        moved[skip] = not same_state(before[1], after[1])
        if skip and optim == {}:
            assert eng.local.client_steps.tolist() == [2, 1, 2, 2]
            assert before[1][3] == after[1][3] == 1 and after[0][3] == 2
            if backend == "loop":  # the clients' own Adam step counts
                assert set(after[1][2].values()) == {1.0} and set(after[0][2].values()) == {2.0}
    assert moved == {True: False, False: True}


def test_eata_skip_empty_backends_agree_with_per_client_step_counts(one_thread, digits_model):
    """After a skipped step Adam's step counts differ between clients (the vectorized bank keeps one scalar per
    stacked tensor and steps again per count): 4 steps agree with the loop bank's per-client optimisers (float64),
    and a resumed run (state_dict with client_steps) continues exactly."""
    model = copy.deepcopy(digits_model).double()
    batches = [b.images.double() for b in shifted_batches(steps=4)]
    params, steps = {}, {}
    for backend in ("loop", "vectorized"):
        eng = engine(model, "eata", backend, strategy="local", e_margin=0.1, skip_empty=True)
        for x in batches:
            eng.local.adapt(eng.bank, x)
        params[backend], steps[backend] = eng.bank.get_params(), eng.local.client_steps.tolist()
        if backend == "loop":
            assert steps[backend] == [[float(o.state[p]["step"]) for p in o.param_groups[0]["params"]][0]
                                      for o in eng.bank.optimizers]
    assert steps["loop"] == steps["vectorized"] == [4, 3, 4, 4]
    assert all(torch.allclose(params["loop"][k], params["vectorized"][k], rtol=0, atol=1e-9) for k in params["loop"])
    full = engine(model, "eata", "vectorized", strategy="local", e_margin=0.1, skip_empty=True)
    for x in batches[:3]:
        full.local.adapt(full.bank, x)
    buf = io.BytesIO()
    torch.save(full.state_dict(), buf)
    buf.seek(0)
    resumed = engine(model, "eata", "vectorized", strategy="local", e_margin=0.1, skip_empty=True)
    resumed.load_state_dict(torch.load(buf, weights_only=False))
    assert resumed.local.client_steps.tolist() == [3, 2, 3, 3]
    full.local.adapt(full.bank, batches[3])
    resumed.local.adapt(resumed.bank, batches[3])
    pa, pb = full.bank.get_params(), resumed.bank.get_params()
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert "client_steps" not in engine(model, "eata").local.state_dict()  # default checkpoints keep their keys


@pytest.mark.parametrize("backend", ["loop", "vectorized"])
def test_roid_kept_only_bn_statistics_are_those_of_the_kept_samples(digits_model, backend, one_thread):
    """augment_kept_only: every BN layer of the augmented pass uses the statistics of the kept samples alone (those
    of a forward of the kept samples only), and the kept samples' logits are that forward's; the default uses the
    whole batch's statistics."""
    x = shifted_batches(steps=1)[0].images
    eng = engine(digits_model, "roid", backend, strategy="local", augment_kept_only=True)
    roid = eng.local
    roid.prepare(eng.bank, x)
    keep = roid.kept(eng.bank.forward(x, "batch").logits)
    assert bool(keep.any(1).all()) and not bool(keep.all(1).any())  # every client drops some samples
    x_aug = augment(x, torch_generator(0, "test"), "roid")
    whole_logits = roid.augmented_logits(eng.bank, x_aug, None)
    whole = eng.bank.bn_stats()
    kept_logits = roid.augmented_logits(eng.bank, x_aug, keep)
    kept = eng.bank.bn_stats()
    single = make_bank("loop", digits_model, 1)  # the clients still hold the source parameters
    for i in range(4):
        alone = single.forward(x_aug[i:i + 1, keep[i]], "batch")
        stats = single.bn_stats()
        for layer in kept:
            assert torch.allclose(kept[layer][i], stats[layer][0], rtol=0, atol=1e-5), layer
            assert not torch.allclose(whole[layer][i], stats[layer][0], rtol=0, atol=1e-3), layer
        assert torch.allclose(kept_logits[i, keep[i]], alone.logits[0], rtol=0, atol=1e-5)
        assert not torch.allclose(whole_logits[i, keep[i]], alone.logits[0], rtol=0, atol=1e-3)
    everything = single.forward(x_aug[:1], "batch")
    assert all(torch.allclose(whole[k][0], single.bn_stats()[k][0], rtol=0, atol=1e-5) for k in whole)
    assert torch.allclose(whole_logits[0], everything.logits[0], rtol=0, atol=1e-5)


def test_roid_kept_only_gradient_is_that_of_the_kept_only_forward(digits_model, one_thread):
    """The dropped samples of the masked forward get weight 0 and no gradient through the statistics: the
    consistency term's gradient equals the reference's (augmented forward of the kept samples only), per client."""
    model = copy.deepcopy(digits_model).double()
    x = shifted_batches(steps=1)[0].images.double()
    eng = engine(model, "roid", "vectorized", strategy="local", augment_kept_only=True)
    roid, bank = eng.local, eng.bank
    roid.prepare(bank, x)
    ref = bank.forward(x, "batch").logits
    w = roid_weights(ref, roid._probs_for(ref), roid.temperature)
    keep = w > 0
    x_aug = augment(x, torch_generator(0, "test"), "roid")
    grads = param_grads(bank, lambda p: (w * symmetric_cross_entropy(roid.augmented_logits(bank, x_aug, keep, p),
                                                                     ref)).sum(1))
    names = select_parameters(model, "bn_affine")
    for i in range(4):
        single = make_bank("loop", model, 1, names, OptimizerSpec("sgd", 1.0))
        alone = lambda p: (w[i, keep[i]] * symmetric_cross_entropy(  # noqa: E731
            single.forward(x_aug[i:i + 1, keep[i]], "batch", params=p).logits[0], ref[i, keep[i]])).sum()[None]
        g = param_grads(single, alone)
        assert all(torch.allclose(grads[k][i], g[k][0], rtol=0, atol=1e-10) for k in names)


def test_roid_kept_only_changes_the_run_and_keeps_the_default(digits_model, one_thread):
    default, _ = pinned_run(digits_model, "roid", augment_kept_only=False)
    kept, _ = pinned_run(digits_model, "roid", augment_kept_only=True)
    assert torch.allclose(default[:, 0, 0], torch.tensor(PINNED_LOGITS["roid"][0], dtype=torch.float64), atol=1e-9)
    assert not torch.allclose(default, kept, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="at least one kept"):
        KeptStatistics(torch.tensor([[True, False], [False, False]]))


# ---------------------------------------------------------------- CoTTA jitter order
def test_shuffled_jitter_applies_the_drawn_order():
    """Brightness b and gamma g (2 ops): 'fixed' is always gamma(brightness(x)); 'shuffled' draws the factors as
    'fixed' does, then a random order per client batch (``jitter_orders``); both orders occur over seeds."""
    spec = AugmentSpec(brightness=(0.6, 1.4), gamma=(0.7, 1.3))
    x = torch.rand(1, 5, 3, 6, 6, generator=torch_generator(0, "x"))
    orders = set()
    for seed in range(12):
        gen = torch_generator(seed, "jitter")
        b = 0.6 + 0.8 * torch.rand(1, generator=gen, dtype=torch.float64).float()
        g = 0.7 + 0.6 * torch.rand(1, generator=gen, dtype=torch.float64).float()
        order = tuple(jitter_orders(gen, 1, 2)[0].tolist())
        orders.add(order)
        bright_first = (x * b).clamp(0, 1).clamp_min(0).pow(g).clamp(0, 1)
        gamma_first = (x.clamp_min(0).pow(g).clamp(0, 1) * b).clamp(0, 1)
        fixed = augment(x, torch_generator(seed, "jitter"), spec)
        shuffled = augment(x, torch_generator(seed, "jitter"), spec, jitter_order="shuffled")
        assert torch.allclose(fixed, bright_first, rtol=0, atol=1e-6)
        assert torch.allclose(shuffled, bright_first if order == (0, 1) else gamma_first, rtol=0, atol=1e-6)
        assert torch.equal(shuffled, augment(x, torch_generator(seed, "jitter"), spec, jitter_order="shuffled"))
    assert orders == {(0, 1), (1, 0)}
    with pytest.raises(ValueError, match="jitter_order"):
        augment(x, torch_generator(0, "t"), spec, jitter_order="random")


def test_cotta_shuffled_jitter_is_reproducible_and_varies_across_calls_clients_and_steps(digits_model, monkeypatch,
                                                                                         one_thread):
    """CoTTA draws one order of the 5 colour transforms per augmented view and client from its generator for
    (seed, step): the same on both backends and for a rerun, different across the views of a step, across clients
    and across steps; 'fixed' (the default) draws none."""
    import ftta_core.tta.augment as aug_module

    drawn = []

    def recording(generator, units, n_ops):
        out = jitter_orders(generator, units, n_ops)
        drawn.append(out)
        return out

    monkeypatch.setattr(aug_module, "jitter_orders", recording)
    batches = shifted_batches(steps=2)
    runs = {}
    for key, backend, order in (("a", "vectorized", "shuffled"), ("b", "vectorized", "shuffled"),
                                ("loop", "loop", "shuffled"), ("fixed", "vectorized", "fixed")):
        drawn.clear()
        eng = engine(digits_model, "cotta", backend, strategy="local", ap=1.0, jitter_order=order)
        logits = [eng.local.adapt(eng.bank, b.images).logits for b in batches]
        runs[key] = ([d.clone() for d in drawn], logits)
    assert runs["fixed"][0] == []
    orders = runs["a"][0]
    assert len(orders) == 2 * 3 and all(o.shape == (4, 5) for o in orders)  # 2 steps x 3 views, [clients, ops]
    assert all(sorted(row.tolist()) == [0, 1, 2, 3, 4] for o in orders for row in o)
    for other in ("b", "loop"):
        assert all(torch.equal(o, p) for o, p in zip(orders, runs[other][0]))
    assert len({tuple(o.flatten().tolist()) for o in orders}) == 6  # every view of every step its own orders
    assert all(len({tuple(row.tolist()) for row in o}) > 1 for o in orders)  # clients differ
    assert all(torch.equal(a, b) for a, b in zip(runs["a"][1], runs["b"][1]))
    assert not torch.allclose(runs["a"][1][0], runs["fixed"][1][0], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="jitter_order"):
        build_local("cotta", jitter_order="random")


# ---------------------------------------------------------------- the options on both backends
OPTION_CONFIGS = {
    "eata_skip": ("eata", {"skip_empty": True, "e_margin": 0.1}),
    "roid_kept": ("roid", {"augment_kept_only": True}),
    "cotta_shuffled": ("cotta", {"jitter_order": "shuffled"}),
}


@pytest.mark.parametrize("key", sorted(OPTION_CONFIGS))
def test_paper_options_backends_agree_with_fedavg(digits_model, key, one_thread):
    """As test_backends_agree_with_fedavg (float64, 3 steps, fedavg mixing) with the paper's behaviour selected."""
    name, options = OPTION_CONFIGS[key]
    float64_backends_agree(copy.deepcopy(digits_model).double(), name, **options)
