"""Speed levers (issue 26) give the results of the reference path: the source-output cache, the per-client
convolution of the vectorized bank and FedCTTA's shared probe pass."""
import copy

import numpy as np
import pytest
import torch

from ftta_core.data import load_embedded_digits
from ftta_core.loop import Engine, run_steps
from ftta_core.engine.source_cache import SourceCache, stream_key
from ftta_core.scenarios import client_image_pools, fedtsa_scenario
from ftta_core.stream import CLEAN, CorruptedDomains, Stream
from ftta_core.strategies import build_strategy
from ftta_core.strategies.fedctta import PROBE_BN, PROBE_UPLOAD, FedCTTA
from ftta_core.tta import build_local

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def stream():
    """A 4-client, 16-step stream over the embedded digits (three corruptions and clean)."""
    digits = load_embedded_digits("test")
    names = ["fog", "contrast", "frost", CLEAN]
    sc = fedtsa_scenario(names, niid=True, n_clients=4, batch_size=5, images_per_domain=20, slot_steps=4)
    return Stream(sc, CorruptedDomains(digits, names, 5, seed=0), client_image_pools(len(digits), 4, 20, 0))


def fedtsa_run(model, stream, cache=None, steps=8):
    """TTA-bn + FedTSA (indicators from the source model, rounds computed ahead on a server thread)."""
    engine = Engine(model, build_local("bn"), build_strategy("fedtsa", server_steps=3, window=3), 4,
                    server_threads=1, source_cache=cache)
    return run_steps(engine, stream, 0, steps)


def assert_same_results(a, b):
    """Step results bit for bit: correct counts before/after adaptation and mixing, and W."""
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        for name in ("correct_source", "correct_local", "correct_mixed", "rejected"):
            np.testing.assert_array_equal(getattr(ra, name), getattr(rb, name))
        np.testing.assert_array_equal(ra.weights, rb.weights)


def test_source_cache_reuses_outputs_and_gives_identical_runs(digits_model, stream, tmp_path):
    reference = fedtsa_run(digits_model, stream)
    first = SourceCache.open_for(digits_model, stream, tmp_path)
    assert_same_results(reference, fedtsa_run(digits_model, stream, first))  # filling the cache changes nothing
    assert first.misses == 8 and first.hits == 0 and first.path.is_file()  # saved when the engine closed
    again = SourceCache.open_for(digits_model, stream, tmp_path)  # another run of the grid: read from the file
    assert len(again.entries) == 8
    assert_same_results(reference, fedtsa_run(digits_model, stream, again))
    assert again.hits == 8 and again.misses == 0


def test_source_cache_is_keyed_by_model_and_batch_content(digits_model, stream, tmp_path):
    cache = SourceCache.open_for(digits_model, stream, tmp_path)
    fedtsa_run(digits_model, stream, cache, steps=2)
    changed = copy.deepcopy(digits_model)
    with torch.no_grad():
        next(changed.parameters()).add_(0.01)
    assert SourceCache.open_for(changed, stream, tmp_path).entries == {}  # another model: another file
    foreign = SourceCache(changed, cache.path)  # the same file read for another model: ignored
    assert foreign.entries == {}
    x = stream.batch(0).images
    assert cache.get(x) is not None and cache.get(x + 1e-3) is None  # other pixels: a miss
    digits = load_embedded_digits("test")
    names = ["fog", "contrast", "frost", CLEAN]
    sc = fedtsa_scenario(names, niid=True, n_clients=4, batch_size=5, images_per_domain=20, slot_steps=4)
    reseeded = Stream(sc, CorruptedDomains(digits, names, 5, seed=1), client_image_pools(len(digits), 4, 20, 1))
    assert stream_key(reseeded) != stream_key(stream)


@pytest.mark.parametrize("params", ["all", "bn_affine"])
def test_split_per_client_convolutions_equal_grouped_and_the_loop_bank(digits_model, params):
    """All-parameter Tent: per-client convolutions run one per client ('split', the CPU default) or grouped; both
    give the loop bank's (the specification's) predictions and parameters after adaptation, to 1e-5."""
    from conftest import shifted_batches

    batches = shifted_batches(n_clients=4, batch=8, steps=3)

    def run(backend, kernel=None):
        torch.manual_seed(0)
        engine = Engine(digits_model, build_local("tent", params=params, optimizer="sgd", lr=1e-2),
                        build_strategy("fedavg"), 4, backend)
        if kernel is not None:
            engine.bank.set_per_client_conv(kernel)
        logits = [engine.local_phase(b, engine.strategy).local_logits for b in batches]
        return torch.stack(logits), engine.bank.get_params()

    ref_logits, ref_params = run("loop")
    for kernel in ("split", "grouped"):
        logits, params_ = run("vectorized", kernel)
        assert torch.allclose(logits, ref_logits, atol=1e-5), kernel
        for name, value in ref_params.items():
            assert torch.allclose(params_[name], value, atol=1e-5), (kernel, name)
    with pytest.raises(ValueError):
        Engine(digits_model, build_local("bn"), build_strategy("fedavg"), 2).bank.set_per_client_conv("bmm")


def test_an_engine_refuses_a_cache_of_another_model(digits_model):
    changed = copy.deepcopy(digits_model)
    with torch.no_grad():
        next(changed.parameters()).add_(0.01)
    with pytest.raises(ValueError, match="another model"):
        Engine(digits_model, build_local("bn"), build_strategy("fedavg"), 2, source_cache=SourceCache(changed))


def test_runs_built_by_default_reuse_the_source_outputs_and_the_switch_turns_it_off(tmp_path, monkeypatch):
    """By default ``build_run`` gives the engine the stream's cache file; a second run reads it, and both runs equal
    a run without it (``FTTA_SOURCE_CACHE=0``, which writes no file)."""
    from ftta_core.build import SOURCE_CACHE_ENV
    from ftta_core.experiment import ExperimentConfig, run_experiment

    cfg = ExperimentConfig(dataset="embedded_digits", scenario="fedtsa_niid", clients=4, batch_size=5,
                           images_per_client=10, corruptions=["fog", "contrast", "frost", "brightness"], local="bn",
                           strategy="fedtsa", device="cpu", max_steps=4)
    monkeypatch.setattr("ftta_core.engine.source_cache.default_root", lambda: tmp_path)
    monkeypatch.setenv(SOURCE_CACHE_ENV, "0")
    plain = run_experiment(cfg)
    assert not list(tmp_path.glob("*.pt"))
    monkeypatch.delenv(SOURCE_CACHE_ENV)
    first = run_experiment(cfg)
    assert len(list(tmp_path.glob("*.pt"))) == 1
    again = run_experiment(cfg)
    for res in (first, again):
        assert res.summary["accuracy"] == plain.summary["accuracy"]
        assert np.array_equal(res.collaboration, plain.collaboration)


def test_a_cache_entry_is_read_only_at_the_thread_count_that_computed_it(digits_model):
    """``entry_key`` names the device and the thread count: outputs computed with 2 threads are not served to a
    forward with 1 (its sums round differently), so the cache never changes a run's bits."""
    from ftta_core.engine.source_cache import entry_key

    x = torch.rand(2, 3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    cache = SourceCache(digits_model)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        cache.put(x, torch.zeros(2, 3, 10), torch.zeros(2, 8))
        key_two = entry_key(x)
        torch.set_num_threads(1)
        assert entry_key(x) != key_two and cache.get(x) is None
        torch.set_num_threads(2)
        assert cache.get(x) is not None
    finally:
        torch.set_num_threads(before)


class _RecordingFedCTTA(FedCTTA):
    """FedCTTA keeping every probe statistic it uploads."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.recorded = []

    def probe_uploads(self, bank, local, x, step):
        out = super().probe_uploads(bank, local, x, step)
        self.recorded.append(out[PROBE_UPLOAD])
        return out


@pytest.mark.parametrize("backend", ["vectorized", "loop"])
@pytest.mark.parametrize("probe_bn", PROBE_BN)
@pytest.mark.parametrize("local", [("bn", {}), ("tent", {"params": "bn_affine", "optimizer": "sgd", "lr": 1e-2})])
def test_fedctta_shared_probe_pass_gives_the_reference_statistics_and_w(digits_model, backend, probe_bn, local):
    """Shared probes through ``ClientBank.forward_shared`` (the layers before the first client-dependent one once)
    give the reference pass's probe statistics (N expanded copies through the whole model) and W, to 1e-6, for
    every ``probe_bn`` mode, TTA-bn and BN-affine Tent (per-client BatchNorm weights), both backends."""
    from conftest import shifted_batches

    batches = shifted_batches(n_clients=4, batch=8, steps=3)

    def run(shared_pass: bool):
        torch.manual_seed(0)
        strategy = _RecordingFedCTTA(n_probes=6, probe_bn=probe_bn, seed=1)
        strategy._shared_pass = shared_pass
        engine = Engine(digits_model, build_local(local[0], **local[1]), strategy, 4, backend)
        weights = [engine.step(b).weights for b in batches]
        return torch.stack(strategy.recorded), np.stack(weights), engine.bank.get_params()

    ref_stats, ref_w, ref_params = run(False)
    stats, w, params = run(True)
    assert stats.shape == (3, 4, 10)
    assert torch.allclose(stats, ref_stats, atol=1e-6, rtol=0)
    np.testing.assert_allclose(w, ref_w, atol=1e-6, rtol=0)
    for name, value in ref_params.items():
        assert torch.allclose(params[name], value, atol=1e-6, rtol=0), name


def test_forward_shared_equals_forward_on_expanded_inputs(digits_model):
    """``forward_shared`` = ``forward`` of the inputs copied to every client, in every BN mode; a batch-mode pass
    records the same per-client statistics [N, 2, C]; the layers get their ``shared_rows`` back."""
    from ftta_core.engine.bank import VectorizedBank, bn_layer_names
    from ftta_core.engine.layers import ClientBatchNorm2d

    x = torch.rand(3, 5, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    z = torch.rand(7, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    # no per-client weight (source and batch modes stay shared to the end), or the first BatchNorm's own per client
    for trainable in ((), [f"{bn_layer_names(digits_model)[0]}.weight"]):
        bank = VectorizedBank(digits_model, 3, trainable=trainable)
        bank.forward(x, "batch")
        stats = bank.bn_stats()
        for mode in ("source", "batch", "given"):
            bank.set_bn_stats(stats)
            want = bank.forward(z.unsqueeze(0).expand(3, *z.shape), mode)
            want_stats = bank.bn_stats()
            got = bank.forward_shared(z, mode)
            assert got.logits.shape == (3, 7, 10)
            assert torch.allclose(got.logits, want.logits, atol=1e-6, rtol=0), (trainable, mode)
            assert torch.allclose(got.features, want.features, atol=1e-6, rtol=0), (trainable, mode)
            if mode == "batch":
                for name, value in bank.bn_stats().items():
                    assert value.shape == want_stats[name].shape
                    assert torch.allclose(value, want_stats[name], atol=1e-6, rtol=0)
        assert all(m.shared_rows is None for m in bank.module.modules() if isinstance(m, ClientBatchNorm2d))


class _ResidualNet(torch.nn.Module):
    """A BatchNorm branch added to a branch without one: shared and per-client activations meet in the add."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False), torch.nn.BatchNorm2d(4)
        self.skip, self.fc = torch.nn.Conv2d(3, 4, 1), torch.nn.Linear(4, 3)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)) + self.skip(x)).mean((2, 3))


def test_forward_shared_falls_back_to_the_reference_pass_where_shared_and_per_client_activations_meet():
    from ftta_core.engine.bank import VectorizedBank

    torch.manual_seed(0)
    bank = VectorizedBank(_ResidualNet().eval(), 3)
    bank.forward(torch.rand(3, 5, 3, 8, 8, generator=torch.Generator().manual_seed(0)), "batch")
    bank.set_bn_stats(bank.bn_stats())
    z = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    want = bank.forward(z.unsqueeze(0).expand(3, *z.shape), "given").logits
    assert torch.allclose(bank.forward_shared(z, "given").logits, want, atol=1e-6, rtol=0)
    assert torch.allclose(bank.forward_shared(z, "source").logits,  # nothing per client: shared to the end
                          bank.forward(z.unsqueeze(0).expand(3, *z.shape), "source").logits, atol=1e-6, rtol=0)
