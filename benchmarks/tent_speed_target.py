"""Tent TTA-grad in the reference clients' semantics, the code at a base commit against this tree, in one run.

The target (issue): all-parameter Tent with running BatchNorm and Adam 3e-4 (the drift cell's step size, as the
stored runs set it in ``local_params``), FedAvg, FedTSA's CIFAR-10-C NIID protocol (20 clients x batch 10,
ResNet-8), the first ``--steps`` steps: ``python -m ftta_core run --config configs/fedtsa/
table1_niid_grad-running-adam.yaml --strategy fedavg --local-param lr=3e-4 --max-steps 30``.

1. Whole runs: the base commit (a git worktree, ``--base``, run with ``PYTHONPATH`` on it) and this tree, each in
   a fresh process with ``OMP_NUM_THREADS=--threads``, alternated (which goes first alternates too) for
   ``--repeats`` pairs; the run's own step-loop time (``summary.json``'s ``wall_time_s``) and the process time;
   the ratio old / new per pair, its median, and the ratio of the fastest runs (the least disturbed by other
   processes); the accuracies of both.
2. The levers, each timed in alternation in this process (median of ``--lever-repeats``): per per-client
   convolution shape of the ResNet-8, forward + backward of 'grouped', 'unfold' and channels-last grouped, and the
   kernel ``client_conv.auto_kernel`` picks; FedAvg's mixing (W @ theta vs the common row); Adam over the stacked
   clients' parameters (torch's reference loop vs fused).

    python benchmarks/tent_speed_target.py [--base /tmp/ftta_base] [--repeats 4] [--steps 30] [--threads 2]
    python benchmarks/tent_speed_target.py --levers-only   # the levers again (a quieter moment), runs kept

Ratios only: other processes share the CPU (the load average is reported); absolute times move with them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

from ftta_core.engine.client_conv import auto_kernel, grouped_conv, unfold_conv
from ftta_core.engine.mixing import mix_state
from ftta_core.models import build_model
from results_io import RESULTS, run_metadata, write_results

REPO = Path(__file__).resolve().parents[1]
CONFIG = "configs/fedtsa/table1_niid_grad-running-adam.yaml"
RUN_ARGS = ["--strategy", "fedavg", "--local-param", "lr=3e-4"]
N_CLIENTS, BATCH = 20, 10


def run_once(tree: Path, steps: int, threads: int) -> dict:
    """One target run of the code in ``tree`` in a fresh process: step-loop and process seconds, accuracies."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    where = subprocess.run([sys.executable, "-c", "import ftta_core; print(ftta_core.__file__)"], env=env, cwd=tree,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not where.startswith(str(tree)):
        raise RuntimeError(f"{tree}: imported ftta_core from {where}")
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ftta_core", "run", "--config", CONFIG, *RUN_ARGS, "--max-steps",
                        str(steps), "--out", out], env=env, cwd=tree, check=True, capture_output=True)
        process_s = time.perf_counter() - t0
        summary = json.loads((Path(out) / "summary.json").read_text())
    return {"loop_s": summary["wall_time_s"], "process_s": round(process_s, 2), "accuracy": summary["accuracy"],
            "accuracy_local": summary["accuracy_local"], "threads": summary["threads"]}


def whole_runs(base: Path, steps: int, threads: int, repeats: int) -> Dict[str, List[dict]]:
    """``repeats`` pairs of runs, old and new alternated (the first of a pair alternates)."""
    runs: Dict[str, List[dict]] = {"old": [], "new": []}
    for r in range(repeats):
        for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
            runs[side].append(run_once(base if side == "old" else REPO, steps, threads))
            print(side, runs[side][-1], os.getloadavg(), flush=True)
    return runs


def alternated(fns: Dict[str, Callable[[], object]], repeats: int) -> Dict[str, float]:
    """Median ms of each function, timed in alternation after one warm-up call each."""
    for f in fns.values():
        f()
    times: Dict[str, list] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(1e3 * (time.perf_counter() - t0))
    return {k: round(statistics.median(v), 2) for k, v in times.items()}


def conv_shapes() -> list:
    """(name, conv, input shape of one client's batch) of every convolution of the ResNet-8 at 32x32."""
    model, shapes = build_model("resnet8"), []
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: shapes.append((name, m, tuple(i[0].shape))))
             for name, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)]
    model(torch.rand(BATCH, 3, 32, 32))
    for h in hooks:
        h.remove()
    return shapes


def channels_last_conv(x, weight, bias, stride, padding, dilation, groups):
    """The grouped convolution with inputs and weights in channels-last layout (a rejected alternative)."""
    n, co = weight.shape[:2]
    nb, c, h, w = x.shape
    xg = x.view(n, nb // n, c, h, w).transpose(0, 1).reshape(nb // n, n * c, h, w)
    out = F.conv2d(xg.contiguous(memory_format=torch.channels_last),
                   weight.reshape(n * co, *weight.shape[2:]).contiguous(memory_format=torch.channels_last),
                   None, stride, padding, dilation, groups * n)
    return out.view(nb // n, n, co, *out.shape[2:]).transpose(0, 1).reshape(nb, co, *out.shape[2:])


def conv_levers(repeats: int) -> List[dict]:
    """Forward + backward ms per convolution shape and kernel (20 clients' weights; images need no gradient)."""
    gen = torch.Generator().manual_seed(0)
    kernels = {"grouped": grouped_conv, "unfold": unfold_conv, "channels_last": channels_last_conv}
    rows = []
    for name, conv, shape in conv_shapes():
        x = torch.rand(N_CLIENTS * BATCH, *shape[1:], generator=gen).requires_grad_(shape[1] != 3)
        w = (0.1 * torch.randn(N_CLIENTS, *conv.weight.shape, generator=gen)).requires_grad_(True)
        args = (conv.stride, conv.padding, conv.dilation, conv.groups)
        wrt = [t for t in (x, w) if t.requires_grad]
        g = torch.randn(grouped_conv(x, w, None, *args).shape, generator=gen)

        def step(kernel=None):
            torch.autograd.grad(kernel(x, w, None, *args), wrt, g)

        ms = alternated({k: (lambda k=k: step(kernels[k])) for k in kernels}, repeats)
        chosen = auto_kernel(w, conv.stride, conv.padding, conv.dilation, conv.groups, x)
        rows.append({"layer": name, "input": "x".join(map(str, shape[1:])),
                     "weight": "x".join(map(str, conv.weight.shape)), "stride": conv.stride[0],
                     **{f"{k}_ms": v for k, v in ms.items()}, "fastest": min(ms, key=ms.get), "chosen": chosen})
        print(rows[-1], flush=True)
    return rows


def stacked_params() -> Dict[str, torch.Tensor]:
    """The ResNet-8's parameters stacked over the clients [N, ...] (what FedAvg mixes and Adam updates)."""
    return {k: v.detach().unsqueeze(0).repeat(N_CLIENTS, *[1] * v.dim())
            for k, v in build_model("resnet8").named_parameters()}


def mixing_lever(repeats: int) -> Dict[str, float]:
    """FedAvg's mixing: one [N, N] @ [N, M] per tensor (before) vs the common row [1, N] @ [N, M], broadcast."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mixing_v1", REPO / "tests" / "frozen" / "mixing_v1.py")
    frozen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(frozen)
    state = {k: v + 0.01 * torch.randn_like(v) for k, v in stacked_params().items()}
    w = torch.full((N_CLIENTS, N_CLIENTS), 1.0 / N_CLIENTS)
    return alternated({"matmul (before)": lambda: frozen.mix_state(state, w),
                       "common row (now)": lambda: mix_state(state, w)}, repeats)


def optimiser_lever(repeats: int) -> Dict[str, float]:
    """One Adam step over the stacked clients' parameters: torch's reference loop (before) vs fused (now)."""
    params = {k: [p.clone().requires_grad_(True) for p in stacked_params().values()] for k in ("loop", "fused")}
    opts = {"loop": torch.optim.Adam(params["loop"], lr=3e-4, foreach=False),
            "fused": torch.optim.Adam(params["fused"], lr=3e-4, fused=True)}
    for ps in params.values():
        for p in ps:
            p.grad = torch.randn_like(p)
    ms = alternated({k: opts[k].step for k in opts}, repeats)
    return {"reference loop (before)": ms["loop"], "fused (now)": ms["fused"]}


def summarize(runs: Dict[str, List[dict]]) -> dict:
    """Medians, the median of the per-pair ratios and the ratio of the fastest runs (the least disturbed by other
    processes: on a shared CPU a run only ever gets slower), and both sides' accuracies."""
    old_s = [r["loop_s"] for r in runs["old"]]
    new_s = [r["loop_s"] for r in runs["new"]]
    return {"old_s": statistics.median(old_s), "new_s": statistics.median(new_s),
            "ratio_median": statistics.median(o / n for o, n in zip(old_s, new_s)),
            "ratio_of_medians": statistics.median(old_s) / statistics.median(new_s),
            "old_min_s": min(old_s), "new_min_s": min(new_s), "ratio_of_minima": min(old_s) / min(new_s),
            "accuracy_old": runs["old"][0]["accuracy"], "accuracy_new": runs["new"][0]["accuracy"],
            "accuracies_seen": {k: sorted({r["accuracy"] for r in v}) for k, v in runs.items()}}


def markdown(result: dict) -> str:
    """The tables of ``result``."""
    old, new = result["runs"]["old"], result["runs"]["new"]
    lines = [f"Measured with `{result['command']}` on {result['device_name']} ({result['threads']} threads), torch "
             f"{result['torch']}, {result['date']}, commit {result['commit']} (plus the working tree) against "
             f"{result['base_commit']}; load average at the start {result['load_average']}, at the end "
             f"{result['load_average_at_end']}.", "",
             f"Target: `python -m ftta_core run --config {CONFIG} {' '.join(RUN_ARGS)} --max-steps {result['steps']}` "
             "(Tent, all parameters, running BN, Adam 3e-4, FedAvg, 20 clients x 10 images, ResNet-8, NIID), "
             "runs alternated; s = the run's step loop (summary.json's wall_time_s), process = the whole process.",
             "", "| pair | old s | new s | old / new | old process s | new process s | old acc | new acc |",
             "|---|---|---|---|---|---|---|---|"]
    for i, (o, n) in enumerate(zip(old, new)):
        lines.append(f"| {i + 1} | {o['loop_s']:.2f} | {n['loop_s']:.2f} | {o['loop_s'] / n['loop_s']:.2f}x | "
                     f"{o['process_s']:.1f} | {n['process_s']:.1f} | {o['accuracy']:.2f} | {n['accuracy']:.2f} |")
    s = result["summary"]
    lines += [f"| median | {s['old_s']:.2f} | {s['new_s']:.2f} | **{s['ratio_median']:.2f}x** (of the medians "
              f"{s['ratio_of_medians']:.2f}x) | | | {s['accuracy_old']:.2f} | {s['accuracy_new']:.2f} |",
              f"| fastest | {s['old_min_s']:.2f} | {s['new_min_s']:.2f} | **{s['ratio_of_minima']:.2f}x** | | | | |", "",
              f"Levers, each timed in alternation in one process (median ms; `{result.get('levers_command', '')}`, "
              f"{result.get('levers_date', '')}, load average {result.get('levers_load_average', '')} at the start, "
              f"{result.get('levers_load_average_at_end', '')} at the end):", "",
              "Per-client convolution, forward + backward (20 clients x 10 images):", "",
              "| layer | input | weight | stride | grouped | unfold | channels-last | fastest | chosen |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in result["conv"]:
        lines.append(f"| {r['layer']} | {r['input']} | {r['weight']} | {r['stride']} | {r['grouped_ms']} | "
                     f"{r['unfold_ms']} | {r['channels_last_ms']} | {r['fastest']} | {r['chosen']} |")
    tot = {k: round(sum(r[f"{k}_ms"] for r in result["conv"]), 1) for k in ("grouped", "unfold", "channels_last")}
    chosen = round(sum(r[f"{r['chosen']}_ms"] for r in result["conv"]), 1)
    lines.append(f"| all layers | | | | {tot['grouped']} | {tot['unfold']} | {tot['channels_last']} | | {chosen} "
                 f"({tot['grouped'] / chosen:.2f}x grouped) |")
    for title, key in (("FedAvg's mixing of the stacked parameters", "mixing"),
                       ("One Adam step over the stacked parameters", "optimiser")):
        (a, ta), (b, tb) = result[key].items()
        lines += ["", f"{title}: {a} {ta} ms, {b} {tb} ms ({ta / tb:.2f}x)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, default=Path("/tmp/ftta_base"), help="worktree of the code before")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=4, help="pairs of whole runs")
    ap.add_argument("--lever-repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levers-only", action="store_true",
                    help="measure the levers again, keep the whole runs (and their metadata) of the stored results")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--remake", type=Path, default=None, help="re-write the tables of a saved JSON, measure nothing")
    args = ap.parse_args()
    if args.remake is not None:
        result = json.loads(args.remake.read_text())
        result["summary"] = summarize(result["runs"])
        write_results(result, "tent_speed_target", "cpu", markdown(result), args.out or args.remake)
        return
    torch.set_num_threads(args.threads)
    out = args.out or RESULTS / "tent_speed_target_cpu.json"
    levers_meta = {"levers_" + k: v for k, v in run_metadata("cpu").items() if k in ("command", "date", "load_average")}
    if args.levers_only:
        result = json.loads(out.read_text())
    else:
        base_commit = subprocess.run(["git", "-C", str(args.base), "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True).stdout.strip()
        result = {**run_metadata("cpu"), "base_commit": base_commit, "threads": args.threads, "steps": args.steps,
                  "runs": whole_runs(args.base, args.steps, args.threads, args.repeats)}
        result["summary"] = summarize(result["runs"])
        result["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    result.update({**levers_meta, "conv": conv_levers(args.lever_repeats), "mixing": mixing_lever(args.lever_repeats),
                   "optimiser": optimiser_lever(args.lever_repeats),
                   "levers_load_average_at_end": [round(v, 2) for v in os.getloadavg()]})
    write_results(result, "tent_speed_target", "cpu", markdown(result), out)


if __name__ == "__main__":
    main()
