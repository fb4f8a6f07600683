"""Speed levers (issue 26) give the results of the reference path: the source-output cache and the per-client
convolution of the vectorized bank."""
import copy

import numpy as np
import pytest
import torch

from ftta_core.data import load_embedded_digits
from ftta_core.engine.loop import Engine, run_steps
from ftta_core.engine.source_cache import SourceCache, stream_key
from ftta_core.scenarios import client_image_pools, fedtsa_scenario
from ftta_core.stream import CLEAN, CorruptedDomains, Stream
from ftta_core.strategies import build_strategy
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


def test_runs_built_with_the_cache_switch_reuse_the_source_outputs(tmp_path, monkeypatch):
    """``FTTA_SOURCE_CACHE=1``: ``build_run`` gives the engine the stream's cache file; a second run reads it and
    both runs equal a run without it."""
    from ftta_core.build import SOURCE_CACHE_ENV
    from ftta_core.experiment import ExperimentConfig, run_experiment

    cfg = ExperimentConfig(dataset="embedded_digits", scenario="fedtsa_niid", clients=4, batch_size=5,
                           images_per_client=10, corruptions=["fog", "contrast", "frost", "brightness"], local="bn", strategy="fedtsa",
                           device="cpu", max_steps=4)
    plain = run_experiment(cfg).summary["accuracy"]
    monkeypatch.setattr("ftta_core.engine.source_cache.default_root", lambda: tmp_path)
    monkeypatch.setenv(SOURCE_CACHE_ENV, "1")
    first = run_experiment(cfg).summary["accuracy"]
    files = list(tmp_path.glob("*.pt"))
    assert len(files) == 1
    assert run_experiment(cfg).summary["accuracy"] == first == plain
