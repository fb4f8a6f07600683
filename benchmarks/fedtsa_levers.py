"""FedTSA server-round levers, kernel by kernel, and a roofline of the round and of the clients' passes (CPU).

Measured in one process with one torch thread (as a round runs on its server thread), in CPU seconds of the
calling thread (``time.thread_time``: the machine is shared, and CPU time moves less with the load than wall time),
alternating the variants and keeping each one's minimum over ``--repeats``:

- the steady-state round (T = 10, N = 20, D = 256 as ResNet-8, 100 Adam steps, Bernoulli masks): the frozen autograd
  round of c9857d8 (``tests/frozen/ts_block_v1.py``) against this tree's (hand-derived gradient, both passes
  stacked), one round and a block of 4 rounds (``rounds_per_batch``), and this tree's round compiled ahead of time;
- single kernels: ``torch.optim.Adam(fused=True).step()`` against the fused kernel called directly, and
  ``torch.softmax`` against exp / sum on a short last dimension (the temporal attention's T = 10);
- the roofline: FLOPs and achieved FLOP/s per kernel class of a round, and of one ResNet-8 pass of the clients
  (200 images), against the peak of this CPU measured with a 2048^3 matmul.

    .venv/bin/python benchmarks/fedtsa_levers.py [--repeats 5]    (also called by fedtsa_speed_target.py --kernels)
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from frozen import ts_block_v1 as v1  # noqa: E402
from results_io import run_metadata, write_results  # noqa: E402
from studies.fedctta.server_cost import fill_indicator_memory  # noqa: E402
from ftta_core.rng import torch_generator  # noqa: E402
from ftta_core.strategies.fedtsa import FedTSA  # noqa: E402
from ftta_core.strategies.ts_block import TSBlock  # noqa: E402

CLIENTS, WINDOW, DIM = 20, 10, 256

# levers tried during the work whose code was not kept, measured then (thread CPU s per round, same protocol)


def best_of(fns: Dict[str, Callable[[], object]], repeats: int, inner: int = 1) -> Dict[str, float]:
    """Minimum thread CPU seconds per call of each function, alternating them ``repeats`` times."""
    for f in fns.values():
        f()
    best = {k: float("inf") for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t = time.thread_time()
            for _ in range(inner):
                f()
            best[k] = min(best[k], (time.thread_time() - t) / inner)
    return best


def round_levers(repeats: int) -> List[dict]:
    """Old vs new server round, one round and a block of 4 (seconds per round)."""
    strategy = FedTSA()
    strategy.reset(CLIENTS)
    fill_indicator_memory(strategy, CLIENTS, WINDOW, DIM)
    x = strategy.memory.ordered()
    frozen = v1.FrozenRound()

    def rounds(code: str, r: int) -> Callable[[], object]:
        xs = x.expand(r, *x.shape).contiguous() if r > 1 else x
        make, train = (TSBlock, strategy._train) if code == "new" else (v1.TSBlock, frozen._train)
        return lambda: train(xs, [torch_generator(0, "fedtsa", i) for i in range(r)],
                             make(DIM, rounds=r if r > 1 else None))

    compiled = copy.copy(strategy)
    compiled.compiled = True

    def compiled_round() -> object:
        return compiled._train(x, [torch_generator(0, "fedtsa", 0)], TSBlock(DIM))

    t = best_of({"old": rounds("old", 1), "new": rounds("new", 1), "old4": rounds("old", 4),
                 "new4": rounds("new", 4), "compiled": compiled_round}, repeats)
    return [{"lever": "hand gradient + plain and augmented passes stacked (kept): one round", "base_s": t["old"],
             "new_s": t["new"], "note": "W equal up to float rounding (tests/test_oracle_ts_block.py)"},
            {"lever": "the same, a block of 4 rounds (rounds_per_batch=4), per round", "base_s": t["old4"] / 4,
             "new_s": t["new4"] / 4, "note": "not the CPU default: no faster than one round"},
            {"lever": "the kept round's iterations and Adam steps compiled ahead of time (torch.export + "
                      "AOTInductor, ``strategies/fedtsa_compiled.py``), after the package's one build",
             "base_s": t["new"], "new_s": t["compiled"],
             "note": "kept for runs of >= 50 rounds (FTTA_COMPILE: auto/1/0); W equal up to float rounding "
                     "(tests/test_oracle_ts_block.py); loads in ms, where torch.compile re-traced for ~4 s a process"}]


def package_costs() -> Dict[str, float]:
    """Wall seconds to build the compiled iteration's package (export + AOTInductor, into a temporary folder: what a
    machine's first run pays once) and to load it (what every later run pays), for the steady-state round's shapes."""
    import tempfile

    from ftta_core.strategies import fedtsa_compiled

    strategy = FedTSA()
    with tempfile.TemporaryDirectory(prefix="fedtsa_package_") as tmp:
        path = Path(tmp) / "iteration.pt2"
        start = time.perf_counter()
        fedtsa_compiled.build(strategy, CLIENTS, DIM, torch.float32, path)
        built = time.perf_counter()
        fedtsa_compiled.load(path)
        return {"build_s": built - start, "load_s": time.perf_counter() - built}


def kernel_levers(repeats: int) -> List[dict]:
    """Adam's step through torch.optim vs its fused kernel; softmax over a short last dimension."""
    p = torch.nn.Parameter(torch.randn(4 * DIM, DIM))
    p.grad = torch.randn_like(p)
    opt = torch.optim.Adam([p], lr=1e-3, fused=True)
    m, v, step = torch.zeros_like(p), torch.zeros_like(p), torch.zeros(())

    def raw() -> None:
        step.add_(1)
        torch._fused_adam_([p.data], [p.grad], [m], [v], [], [step], lr=1e-3, beta1=0.9, beta2=0.999,
                           weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)

    scores = torch.randn(CLIENTS, 2 * WINDOW, WINDOW)

    def manual() -> torch.Tensor:
        e = (scores - scores.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)

    t = best_of({"step": opt.step, "raw": raw}, repeats, 100)
    s = best_of({"softmax": lambda: torch.softmax(scores, -1), "manual": manual}, repeats, 200)
    return [{"lever": "Adam: optimizer.step() -> torch._fused_adam_ directly (x100 = one round)",
             "base_s": 100 * t["step"], "new_s": 100 * t["raw"],
             "note": "not kept: a private op; a compiled round runs Adam inside its graph instead"},
            {"lever": "softmax [20, 20, 10] -> exp/sum (x100 = one round)", "base_s": 100 * s["softmax"],
             "new_s": 100 * s["manual"], "note": "not kept: under 1% of a round"}]


def roofline(repeats: int) -> Dict[str, object]:
    """Achieved FLOP/s per kernel class of a round and of a client pass, against the 2048^3 matmul peak."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    peak = 2 * 2048 ** 3 / best_of({"mm": lambda: a @ b}, repeats)["mm"]
    nt, hd = CLIENTS * WINDOW, 4 * DIM
    v, w, dp = torch.randn(nt, DIM), torch.randn(hd, DIM), torch.randn(nt, hd)
    kt = 2 * WINDOW  # the two passes stacked
    att_s, xs = torch.randn(kt, CLIENTS, CLIENTS), torch.randn(kt, CLIENTS, DIM)
    att_t, vals, spat = torch.randn(CLIENTS, kt, WINDOW), torch.randn(CLIENTS, WINDOW, DIM), \
        torch.randn(CLIENTS, WINDOW, 2 * DIM)
    p = torch.nn.Parameter(w.clone())
    p.grad = torch.randn_like(p)
    opt = torch.optim.Adam([p], lr=1e-3, fused=True)
    # per iteration: (kernel, FLOPs, calls per iteration, function)
    kernels = [
        ("projection P = X W^T [200x256 @ 256x1024]", 2 * nt * DIM * hd, 1, lambda: v @ w.t()),
        ("weight gradient dP^T X [1024x200 @ 200x256]", 2 * nt * DIM * hd, 1, lambda: dp.t() @ v),
        ("spatial products [20 x (20x256 @ 256x20)]", 2 * kt * CLIENTS * CLIENTS * DIM, 2,
         lambda: xs @ xs.transpose(-1, -2)),
        ("spatial products [20 x (20x20 @ 20x256)]", 2 * kt * CLIENTS * CLIENTS * DIM, 4, lambda: att_s @ xs),
        ("temporal mixing, and its backward [20 x (20x10 @ 10x768)]", 2 * CLIENTS * kt * WINDOW * 3 * DIM, 2,
         lambda: (att_t @ vals, att_t @ spat)),
        ("Adam step (262k weights, ~12 FLOP each)", 12 * hd * DIM, 1, opt.step),
    ]
    times = best_of({name: f for name, _, _, f in kernels}, repeats, 20)
    rows = [{"kernel": name, "mflop_per_call": flops / 1e6, "calls_per_iteration": calls,
             "us_per_call": 1e6 * times[name], "gflops": flops / times[name] / 1e9, "peak_gflops": peak / 1e9,
             "share_of_peak": flops / times[name] / peak} for name, flops, calls, _ in kernels]
    floor_s = 100 * sum(r["us_per_call"] * r["calls_per_iteration"] for r in rows) / 1e6
    flops_round = 100 * sum(r["mflop_per_call"] * r["calls_per_iteration"] for r in rows) * 1e6
    # one ResNet-8 pass of the clients (200 images 32x32): conv FLOPs (stem 7x7/2, three basic blocks)
    convs = [(3, 64, 7, 16), (64, 64, 3, 8), (64, 64, 3, 8), (64, 128, 3, 4), (128, 128, 3, 4), (64, 128, 1, 4),
             (128, 256, 3, 2), (256, 256, 3, 2), (128, 256, 1, 2)]
    conv_flops = sum(2 * 200 * hw * hw * cout * cin * k * k for cin, cout, k, hw in convs)
    return {"peak_gflops": peak / 1e9, "rows": rows, "kernel_floor_s_per_round": floor_s,
            "round_flops": flops_round, "client_pass_conv_gflop": conv_flops / 1e9,
            "client_pass_floor_s": conv_flops / peak}


def lever_table(repeats: int = 5) -> Dict[str, object]:
    """The lever rows, the roofline and their markdown."""
    torch.set_num_threads(1)
    levers = round_levers(repeats) + kernel_levers(repeats)
    rows = levers
    roof = roofline(repeats)
    package = package_costs()
    md = ("## Levers on the server round (thread CPU s, one torch thread, min of "
          f"{repeats})\n\n"
          "| lever | before (s) | after (s) | ratio | note |\n|---|---|---|---|---|\n"
          + "\n".join(f"| {r['lever']} | {r['base_s']:.4f} | {r['new_s']:.4f} | {r['base_s'] / r['new_s']:.2f}x | "
                      f"{r['note']} |" for r in rows)
          + f"\n\nThe compiled round's package, once per machine and configuration: built in "
          f"{package['build_s']:.1f} s wall (export + AOTInductor's C++ compile), loaded in "
          f"{1e3 * package['load_s']:.1f} ms (every later run).\n"
          + f"\n## Roofline (fp32, one core; peak = 2048^3 matmul: {roof['peak_gflops']:.0f} GFLOP/s)\n\n"
          "| kernel (per server iteration) | MFLOP per call | calls | us per call | GFLOP/s | share of peak |\n"
          "|---|---|---|---|---|---|\n"
          + "\n".join(f"| {r['kernel']} | {r['mflop_per_call']:.1f} | {r['calls_per_iteration']} | "
                      f"{r['us_per_call']:.0f} | {r['gflops']:.0f} | {100 * r['share_of_peak']:.0f}% |"
                      for r in roof["rows"])
          + f"\n\nThese kernels alone, at the speed measured here, take {roof['kernel_floor_s_per_round']:.3f} s "
          f"per round ({roof['round_flops'] / 1e9:.1f} GFLOP; at peak "
          f"{roof['round_flops'] / 1e9 / roof['peak_gflops']:.3f} s). "
          f"A client pass (ResNet-8, 200 images) has {roof['client_pass_conv_gflop']:.2f} GFLOP of convolutions: "
          f"{roof['client_pass_floor_s'] * 1e3:.0f} ms at peak; a TTA-bn step makes three (source, adapt, predict). "
          f"The kept round is {levers[0]['base_s'] / levers[0]['new_s']:.2f}x the old one eager and "
          f"{levers[0]['base_s'] / levers[2]['new_s']:.2f}x compiled; a round made of these kernels and nothing "
          f"else would be {levers[0]['base_s'] / roof['kernel_floor_s_per_round']:.2f}x: what is left above that "
          "floor is the many small operations between them (masks, softmaxes, element-wise losses and gradients, "
          "concatenations, dispatch), which eager PyTorch runs one kernel each and the compiled round fuses.\n")
    return {"rows": rows, "roofline": roof, "package": package, "markdown": md}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    table = lever_table(args.repeats)
    meta = run_metadata("cpu")
    markdown = (f"# FedTSA server-round levers and roofline (CPU, one torch thread)\n\nMade by: `{meta['command']}` "
                f"on {meta['date']}, commit {meta['commit']} plus the working tree, torch {meta['torch']}; load "
                f"average after {meta['load_average']} (compare ratios within this run).\n\n" + table["markdown"])
    print(markdown)
    write_results({**meta, "levers": table["rows"], "roofline": table["roofline"], "package": table["package"]},
                  "fedtsa_levers", "cpu", markdown)


if __name__ == "__main__":
    main()
