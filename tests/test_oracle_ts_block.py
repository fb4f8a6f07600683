"""Oracle: FedTSA's server round (TS-Block passes, hand-derived gradient, masks, Adam) against a frozen verbatim copy
of the autograd implementation it replaced (``tests/frozen/ts_block_v1.py``, commit c9857d8), in float64.

Same inputs, same generators: every mask must be equal exactly (same draws in the same order), W, the trained
block, the attention and the losses equal up to float64 rounding (rtol 1e-9), for the paper's defaults and every
option that changes the round's arithmetic (bias, 'hadamard' masks, no temporal module, no augmentation, the
code's counted masks with 'best' selection, M^cur from the temporal output), one round and a block of rounds.
"""
from __future__ import annotations

from typing import Optional

import pytest
import torch

from frozen import ts_block_v1 as v1
from ftta_core.rng import torch_generator
from ftta_core.strategies.fedtsa import FedTSA
from ftta_core.strategies.ts_block import TSBlock

# atol: for entries whose gradient is 0 up to rounding (e.g. the key bias, which softmax ignores)
RTOL, ATOL = 1e-9, 1e-10
T, N, D, STEPS = 5, 6, 16, 12

CASES = {
    "paper": {},
    "bias": {"bias": True},
    "hadamard": {"mask_mode": "hadamard"},
    "w/o time": {"variant": "w/o time"},
    "w/o aug": {"variant": "w/o aug"},
    "code": {"augmentation": "count", "select": "best", "bias": True, "lam": 0.5},
    "graph on temporal": {"graph_on": "temporal", "augmentation": "count"},
    "w/o time, hadamard": {"variant": "w/o time", "mask_mode": "hadamard", "bias": True},
}


def frozen_round(strategy: FedTSA) -> v1.FrozenRound:
    """The frozen round with ``strategy``'s options."""
    s = strategy
    return v1.FrozenRound(lam=s.lam, lr=s.lr, server_steps=s.server_steps, augmentation=s.augmentation,
                          temporal_drop=s.temporal_drop, edge_drop=s.edge_drop, edge_add=s.edge_add,
                          temporal=s.temporal, augment=s.augment, trained=s.trained, mask_mode=s.mask_mode,
                          select=s.select, graph_on=s.graph_on)


def close(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> None:
    assert (a is None) == (b is None)
    if a is not None:
        torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=RTOL, atol=ATOL)


def windows(rounds: Optional[int], seed: int = 0) -> torch.Tensor:
    """Indicator-like windows: non-negative, float64, [T, N, D] or [R, T, N, D]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand((rounds or 1, T, N, D), generator=g, dtype=torch.float64) ** 2
    return x if rounds else x[0]


@pytest.mark.parametrize("rounds", [None, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_round_matches_the_frozen_autograd_round(one_thread, case, rounds):
    strategy = FedTSA(server_steps=STEPS, lr=1e-2, seed=3, **CASES[case])
    if rounds and not strategy.batched_rounds:
        pytest.skip("this variant trains its rounds one at a time")
    frozen = frozen_round(strategy)
    x = windows(rounds)
    gens = {side: [torch_generator(3, "fedtsa", step) for step in range(rounds or 1)] for side in ("new", "old")}
    new_block = TSBlock(D, temporal=strategy.temporal, bias=strategy.bias, rounds=rounds).double()
    old_block = v1.TSBlock(D, temporal=strategy.temporal, bias=strategy.bias, rounds=rounds).double()
    new = strategy._train(x, gens["new"], new_block)
    old = frozen._train(x, gens["old"], old_block)
    close(new_block.qk_weight.detach(), old_block.qk_weight.detach())
    close(None if new_block.qk_bias is None else new_block.qk_bias.detach(),
          None if old_block.qk_bias is None else old_block.qk_bias.detach())
    assert len(new) == len(old)
    for a, b in zip(new, old):
        close(a.weights, b.weights)
        close(a.spatial_attention, b.spatial_attention)
        close(a.temporal_attention, b.temporal_attention)
        for name in ("loss", "loss_regularization", "loss_robustness"):
            close(torch.from_numpy(getattr(a, name)), torch.from_numpy(getattr(b, name)))
        for name in ("current_mask", "spatial_mask", "temporal_mask"):  # the same draws: equal exactly
            ma, mb = getattr(a, name), getattr(b, name)
            assert (ma is None) == (mb is None) and (ma is None or torch.equal(ma, mb)), name
        assert a.selected_iteration == b.selected_iteration
    for ga, gb in zip(gens["new"], gens["old"]):  # as many draws, in the same order
        assert torch.equal(ga.get_state(), gb.get_state())
    assert (new_block.qk_weight.detach() - torch.eye(D).repeat(len(new_block.heads), 1)).abs().max() > 1e-3


@pytest.mark.parametrize("temporal", [True, False])
@pytest.mark.parametrize("mask_mode", ["exclude", "hadamard"])
def test_hand_gradient_of_two_passes_is_autograds(one_thread, temporal, mask_mode):
    """``TSBlock.backward_passes`` on stacked passes vs the frozen block's forward and autograd, at random weights."""
    g = torch.Generator().manual_seed(1)
    x = windows(None, seed=1)
    weight = torch.eye(D, dtype=torch.float64).repeat(4 if temporal else 2, 1)
    weight += 0.3 * torch.randn(weight.shape, generator=g, dtype=torch.float64)
    bias = 0.1 * torch.randn(weight.shape[0], generator=g, dtype=torch.float64)
    tmask = (torch.rand((N, T, T), generator=g) < 0.5) | torch.eye(T, dtype=torch.bool)
    smask = (torch.rand((N, N), generator=g) < 0.5) | torch.eye(N, dtype=torch.bool)
    out_grad = torch.randn((2 * T, N, D), generator=g, dtype=torch.float64)

    class Fixed:  # the augmented pass's masks, given
        def temporal(self, attention):
            return tmask

        def spatial(self, attention, temporal_output):
            return smask

    new = TSBlock(D, temporal=temporal, bias=True).double()
    old = v1.TSBlock(D, temporal=temporal, bias=True).double()
    with torch.no_grad():
        for block in (new, old):
            block.qk_weight.copy_(weight)
            block.qk_bias.copy_(bias)
        passes = new.forward_passes(x, mask_mode=mask_mode, augment=Fixed())
        new.backward_passes(passes, out_grad)
    plain = old(x)
    aug = old(x, tmask if temporal else None, smask, mask_mode, temporal_scores=plain.temporal_scores,
              projections=plain.projections)
    close(passes.output, torch.cat([plain.output, aug.output]).detach())
    ((torch.cat([plain.output, aug.output]) * out_grad).sum()).backward()
    close(new.qk_weight.grad, old.qk_weight.grad)
    close(new.qk_bias.grad, old.qk_bias.grad)
    single = new(x, tmask if temporal else None, smask, mask_mode)  # ``forward``: one pass under given masks
    reference = old(x, tmask if temporal else None, smask, mask_mode)
    for name in ("output", "temporal_output", "temporal_attention", "spatial_attention", "temporal_scores"):
        close(None if getattr(single, name) is None else getattr(single, name).detach(),
              None if getattr(reference, name) is None else getattr(reference, name).detach())


COMPILED_CASES = {  # every option that changes the compiled graph: its shape of heads, its masks, its outputs
    "paper": {},
    "w/o time, hadamard, bias": {"variant": "w/o time", "mask_mode": "hadamard", "bias": True},
    "graph on temporal, best": {"graph_on": "temporal", "select": "best", "bias": True},
    "w/o aug": {"variant": "w/o aug"},
}


def needs_compiler() -> None:
    import shutil

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler: AOTInductor cannot build the iteration (a run then iterates eagerly)")


@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c == "paper" else pytest.mark.slow)
                                  for c in COMPILED_CASES])
def test_compiled_round_matches_the_frozen_autograd_round(one_thread, case):
    """``FedTSA.compiled`` (the iterations and their Adam steps through the package of ``fedtsa_compiled``; a CPU
    run's default from ``COMPILE_MIN_ROUNDS`` rounds): the same round as the frozen autograd implementation up to
    float64 rounding, the same masks exactly, for windows of the full length and shorter ones (T is dynamic)."""
    from ftta_core.strategies import fedtsa_compiled

    needs_compiler()
    strategy = FedTSA(server_steps=STEPS, lr=1e-2, seed=3, **COMPILED_CASES[case])
    strategy.compiled = True
    for t in (T, 3):
        x = windows(None)[-t:].contiguous()
        block = TSBlock(D, temporal=strategy.temporal, bias=strategy.bias).double()
        old_block = v1.TSBlock(D, temporal=strategy.temporal, bias=strategy.bias).double()
        assert fedtsa_compiled.compilable(strategy, x)
        new = strategy._train(x, [torch_generator(3, "fedtsa", 0)], block)[0]
        old = frozen_round(strategy)._train(x, [torch_generator(3, "fedtsa", 0)], old_block)[0]
        assert fedtsa_compiled.package_key(strategy, N, D, torch.float64) in fedtsa_compiled._loaded, "not compiled"
        close(block.qk_weight.detach(), old_block.qk_weight.detach())
        close(None if block.qk_bias is None else block.qk_bias.detach(),
              None if old_block.qk_bias is None else old_block.qk_bias.detach())
        close(new.weights, old.weights)
        close(new.spatial_attention, old.spatial_attention)
        for name in ("loss", "loss_regularization", "loss_robustness"):
            close(torch.from_numpy(getattr(new, name)), torch.from_numpy(getattr(old, name)))
        for name in ("current_mask", "spatial_mask", "temporal_mask"):
            ma, mb = getattr(new, name), getattr(old, name)
            assert (ma is None) == (mb is None) and (ma is None or torch.equal(ma, mb)), name
        assert new.selected_iteration == old.selected_iteration


def test_what_does_not_compile_runs_eagerly(one_thread):
    """A one-step window, a block of rounds and the code's counted masks (drawn inside the iteration) have no
    compiled form: ``compilable`` says so, and such a round with ``compiled`` on is the eager round exactly."""
    from ftta_core.strategies import fedtsa_compiled

    paper, counted = FedTSA(server_steps=3, lr=1e-2), FedTSA(server_steps=3, lr=1e-2, augmentation="count")
    assert not fedtsa_compiled.compilable(paper, windows(None)[-1:])
    assert not fedtsa_compiled.compilable(paper, windows(2))
    assert not fedtsa_compiled.compilable(counted, windows(None))
    results = []
    for compiled in (False, True):
        counted.compiled = compiled
        results.append(counted._train(windows(None), [torch_generator(3, "fedtsa", 0)], TSBlock(D).double())[0])
    assert torch.equal(results[0].weights, results[1].weights)


def test_a_package_is_keyed_by_everything_the_graph_bakes_in(monkeypatch, tmp_path):
    """The package's name changes with every option the exported graph holds as a constant, with N, D, the window,
    the dtype, torch's version, the processor and the source of the modules the iteration runs; not with what it
    takes as an input (the learning rate, the seed)."""
    from ftta_core.strategies import fedtsa_compiled as fc

    base = fc.package_key(FedTSA(), 20, 256, torch.float32)
    assert fc.package_key(FedTSA(seed=5, lr=1e-4, server_steps=7), 20, 256, torch.float32) == base
    others = [fc.package_key(FedTSA(**kw), 20, 256, torch.float32)
              for kw in ({"lam": 0.5}, {"variant": "w/o time"}, {"mask_mode": "hadamard"}, {"bias": True},
                         {"graph_on": "temporal"}, {"window": 5}, {"edge_drop": 0.5})]
    others += [fc.package_key(FedTSA(), 21, 256, torch.float32), fc.package_key(FedTSA(), 20, 128, torch.float32),
               fc.package_key(FedTSA(), 20, 256, torch.float64)]
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    others.append(fc.package_key(FedTSA(), 20, 256, torch.float32))
    monkeypatch.undo()
    monkeypatch.setattr(fc, "cpu_signature", lambda: "x86_64/AVX2/another-cpu")
    others.append(fc.package_key(FedTSA(), 20, 256, torch.float32))
    monkeypatch.undo()
    copy = tmp_path / "ts_block.py"
    copy.write_text(fc.SOURCES[0].read_text() + "\n# changed\n")
    monkeypatch.setattr(fc, "SOURCES", (copy, *fc.SOURCES[1:]))
    others.append(fc.package_key(FedTSA(), 20, 256, torch.float32))
    assert len({base, *others}) == len(others) + 1


def test_a_build_that_fails_falls_back_to_the_eager_iteration(one_thread, monkeypatch, caplog, tmp_path):
    """No compiler, an operator export does not know...: the round runs eagerly (the same W), the log says so once
    per package, and no package is left behind."""
    from ftta_core.strategies import fedtsa_compiled as fc

    def broken(*args, **kwargs):
        raise RuntimeError("no working C++ compiler found")

    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fc, "_loaded", {})
    monkeypatch.setattr(fc, "_failed", {})
    monkeypatch.setattr(fc, "build", broken)
    results = []
    for compiled in (False, True, True):
        strategy = FedTSA(server_steps=3, lr=1e-2, seed=3)
        strategy.compiled = compiled
        results.append(strategy._train(windows(None), [torch_generator(3, "fedtsa", 0)], TSBlock(D).double())[0])
    assert torch.equal(results[0].weights, results[1].weights) and torch.equal(results[0].weights, results[2].weights)
    assert caplog.text.count("did not compile") == 1
    assert not list(tmp_path.rglob("*.pt2"))


def test_compiling_is_chosen_by_the_run_length_unless_the_switch_says(monkeypatch):
    """'auto': a run of ``COMPILE_MIN_ROUNDS`` rounds or more compiles, a shorter one (tests, smoke runs) does not;
    FTTA_COMPILE=1/0 always/never; anything else is an error naming the variable."""
    from ftta_core.strategies import fedtsa

    monkeypatch.delenv(fedtsa.COMPILE_ENV, raising=False)
    strategy = FedTSA()
    assert not strategy.compiled
    strategy.expect_rounds(fedtsa.COMPILE_MIN_ROUNDS)
    assert strategy.compiled
    strategy.expect_rounds(fedtsa.COMPILE_MIN_ROUNDS - 1)
    assert not strategy.compiled
    monkeypatch.setenv(fedtsa.COMPILE_ENV, "1")
    assert FedTSA().compiled
    untrained = FedTSA(variant="S-sim")
    untrained.expect_rounds(750)
    assert not untrained.compiled
    monkeypatch.setenv(fedtsa.COMPILE_ENV, "0")
    strategy.expect_rounds(750)
    assert not strategy.compiled
    monkeypatch.setenv(fedtsa.COMPILE_ENV, "yes")
    with pytest.raises(ValueError, match=fedtsa.COMPILE_ENV):
        strategy.expect_rounds(750)


def test_a_package_is_built_single_threaded_whatever_the_callers_threads(monkeypatch, tmp_path):
    """Inductor bakes the thread count into its loops, so ``build`` compiles under one torch thread (a round is one
    single-threaded computation wherever it runs) and gives the caller its threads back, even when the build fails."""
    from ftta_core.strategies import fedtsa_compiled as fc

    seen = []

    def fake_build(*args):
        seen.append(torch.get_num_threads())
        raise RuntimeError("stop here")

    monkeypatch.setattr(fc, "_build", fake_build)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="stop here"):
            fc.build(FedTSA(), N, D, torch.float64, tmp_path / "p.pt2")
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
