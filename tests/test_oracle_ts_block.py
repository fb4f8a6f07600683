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


@pytest.mark.parametrize("case", ["paper", "code"])
def test_compiled_iteration_matches_the_eager_round(one_thread, case):
    """``FedTSA.compiled`` (``run_iteration`` through ``torch.compile``; a long CPU run's default): the same round
    as the eager iteration up to float64 rounding, the same masks exactly. Skipped where inductor cannot compile
    (no C++ compiler), where the run itself would fall back to the eager iteration."""
    import shutil

    from ftta_core.strategies import fedtsa

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler: torch.compile's CPU backend cannot build the iteration")
    rounds = {}
    for compiled in (False, True):
        strategy = FedTSA(server_steps=STEPS, lr=1e-2, seed=3, **CASES[case])
        strategy.compiled = compiled
        block = TSBlock(D, temporal=strategy.temporal, bias=strategy.bias).double()
        rounds[compiled] = (strategy._train(windows(None), [torch_generator(3, "fedtsa", 0)], block)[0], block)
    assert not fedtsa._compiled.get("failed"), "the iteration did not compile"
    (eager, eager_block), (comp, comp_block) = rounds[False], rounds[True]
    close(comp_block.qk_weight.detach(), eager_block.qk_weight.detach())
    close(comp.weights, eager.weights)
    for name in ("loss", "loss_regularization", "loss_robustness"):
        close(torch.from_numpy(getattr(comp, name)), torch.from_numpy(getattr(eager, name)))
    for name in ("current_mask", "spatial_mask", "temporal_mask"):
        ma, mb = getattr(comp, name), getattr(eager, name)
        assert (ma is None) == (mb is None) and (ma is None or torch.equal(ma, mb)), name


def test_a_compile_that_fails_falls_back_to_the_eager_iteration(one_thread, monkeypatch, caplog):
    """No compiler, an unsupported operator...: the round runs eagerly (the same W) and the log says so once."""
    from ftta_core.strategies import fedtsa

    def broken(fn, **kwargs):
        def call(*args, **kw):
            raise RuntimeError("no working C++ compiler found")
        return call

    monkeypatch.setattr(fedtsa, "_compiled", {})
    monkeypatch.setattr(torch, "compile", broken)
    results = []
    for compiled in (False, True):
        strategy = FedTSA(server_steps=3, lr=1e-2, seed=3)
        strategy.compiled = compiled
        results.append(strategy._train(windows(None), [torch_generator(3, "fedtsa", 0)], TSBlock(D).double())[0])
    assert torch.equal(results[0].weights, results[1].weights)
    assert fedtsa._compiled["failed"] and caplog.text.count("did not compile") == 1


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
