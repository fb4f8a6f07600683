"""Issue 26's CPU speed levers as ratios in one run, on the FedTSA protocol shape (20 clients x batch 10, ResNet-8).

1. Source-output cache (``ftta_core.engine.source_cache``): engine steps with the frozen source model's forward
   recomputed vs read from a cache filled by an earlier run over the same batches (the second and later runs of a
   grid over one stream), for TTA-bn + FedAvg and TTA-bn + FedTSA (rounds computed ahead, the protocol's default).
2. All-parameter Tent (SGD 1e-4): the loop bank vs the vectorized bank with per-client convolutions as one grouped
   convolution ('grouped', before) or one convolution per client ('split', now the CPU default).
3. FedCTTA's probe pass (TTA-bn, its defaults: 64 shared noise probes, ``probe_bn='client'``): the probes expanded to
   N copies through the whole model ('reference', before) vs ``ClientBank.forward_shared`` ('shared': the layers
   before the first BatchNorm once on the 64 probes).

Variants are timed in alternation (``--rounds`` rounds of ``--steps`` steps each, after a warm-up) so that load from
other processes falls on all of them alike; the ratios compare within one run.

    python benchmarks/speed_levers.py [--device cpu] [--steps 4] [--rounds 3] [--clients 20]
"""
from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

from engine_backends import batches
from ftta_core.loop import Engine
from ftta_core.engine.source_cache import SourceCache
from ftta_core.models import build_model
from ftta_core.strategies import build_strategy
from ftta_core.tta import build_local
from results_io import device_name, write_results

TENT_ALL = ("tent", {"params": "all", "optimizer": "sgd", "lr": 1e-4})


def resnet8():
    """The benchmark's source model (seeded: every engine and cache holds the same one)."""
    torch.manual_seed(0)
    return build_model("resnet8").eval()


def make_engine(local: tuple, strategy: str, backend: str, device: str, n_clients: int,
                cache: SourceCache | None = None, conv: str | None = None, shared_probes: bool = True) -> Engine:
    """An engine on the ResNet-8 (seeded) with ``local`` = (name, params), ``strategy`` at its defaults; FedTSA
    computes its rounds ahead on one server thread (every engine alike, whatever torch's thread count)."""
    engine = Engine(resnet8(), build_local(local[0], **local[1]), build_strategy(strategy),
                    n_clients, backend, device, source_cache=cache, server_threads=1 if strategy == "fedtsa" else 0)
    if conv is not None:
        engine.bank.set_per_client_conv(conv)
    if strategy == "fedctta":
        engine.strategy._shared_pass = shared_probes
    return engine


def timed_in_alternation(engines: Dict[str, Engine], data: list, steps: int, rounds: int) -> Dict[str, float]:
    """Steps/s of each engine: one warm-up step each, then ``rounds`` rounds in which every engine runs the next
    ``steps`` steps (the same batches for all)."""
    total = {k: 0.0 for k in engines}

    def run(engine: Engine, chunk: list) -> float:
        t0 = time.perf_counter()
        for b in chunk:
            engine.prefetch(_Batches(data), b.step, len(data))
            engine.step(b)
        if str(engine.device).startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for e in engines.values():
        run(e, data[:1])
    for r in range(rounds):
        chunk = data[1 + r * steps: 1 + (r + 1) * steps]
        for k, e in engines.items():
            total[k] += run(e, chunk)
    for e in engines.values():
        e.close()
    return {k: rounds * steps / v for k, v in total.items()}


class _Batches:
    """The benchmark's batches as the stream ``Engine.prefetch`` reads (``batch(t)``)."""

    def __init__(self, data: list) -> None:
        self.data = data

    def batch(self, t: int):
        return self.data[t]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    n, dev = args.clients, args.device
    data = batches(n, 10, 1 + args.steps * args.rounds, dev)
    rows: List[dict] = []

    def record(lever: str, case: str, speeds: Dict[str, float], base: str, fast: str) -> None:
        ratio = speeds[fast] / speeds[base]
        rows.append({"lever": lever, "case": case, **{f"{k}_steps_per_s": round(v, 3) for k, v in speeds.items()},
                     "ratio": round(ratio, 2), "ratio_of": f"{fast} / {base}"})
        print(f"{lever:14s} {case:22s} " + "  ".join(f"{k} {v:.3f}/s" for k, v in speeds.items())
              + f"   {fast}/{base} {ratio:.2f}x", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        for strategy in ("fedavg", "fedtsa"):
            warm = SourceCache(resnet8(), Path(tmp) / f"{strategy}.pt")
            filler = make_engine(("bn", {}), strategy, "vectorized", dev, n, warm)
            for b in data:  # an earlier run of the grid over the same batches fills the cache
                filler.step(b)
            filler.close()
            engines = {"recomputed": make_engine(("bn", {}), strategy, "vectorized", dev, n),
                       "cached": make_engine(("bn", {}), strategy, "vectorized", dev, n, SourceCache(resnet8(), warm.path))}
            record("source cache", f"TTA-bn + {strategy}", timed_in_alternation(engines, data, args.steps, args.rounds),
                   "recomputed", "cached")
    engines = {"loop": make_engine(TENT_ALL, "fedavg", "loop", dev, n),
               "grouped": make_engine(TENT_ALL, "fedavg", "vectorized", dev, n, conv="grouped"),
               "split": make_engine(TENT_ALL, "fedavg", "vectorized", dev, n, conv="split")}
    speeds = timed_in_alternation(engines, data, args.steps, args.rounds)
    record("per-client conv", "Tent (all params)", speeds, "grouped", "split")
    rows[-1]["split_over_loop"] = round(speeds["split"] / speeds["loop"], 2)
    rows[-1]["grouped_over_loop"] = round(speeds["grouped"] / speeds["loop"], 2)
    engines = {"reference": make_engine(("bn", {}), "fedctta", "vectorized", dev, n, shared_probes=False),
               "shared": make_engine(("bn", {}), "fedctta", "vectorized", dev, n)}
    record("probe pass", "TTA-bn + fedctta", timed_in_alternation(engines, data, args.steps, args.rounds),
           "reference", "shared")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = "python benchmarks/speed_levers.py " + " ".join(sys.argv[1:])
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    result = {"command": command, "date": datetime.date.today().isoformat(), "commit": commit, "device": dev,
              "device_name": device_name(dev), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "load_average_at_end": load, "clients": n, "batch": 10, "steps": args.steps, "rounds": args.rounds,
              "rows": rows}
    md = [f"Measured with `{command}` on {result['device_name']} ({result['threads']} threads), torch "
          f"{torch.__version__}, {result['date']}, commit {commit} (uncommitted changes), load average at the end "
          f"{' '.join(load)} (other processes on the cores); {n} clients x batch 10, ResNet-8.", "",
          "| lever | case | steps/s | ratio |", "|---|---|---|---|"]
    for r in rows:
        speeds_md = ", ".join(f"{k.removesuffix('_steps_per_s')} {v}" for k, v in r.items() if k.endswith("_steps_per_s"))
        md.append(f"| {r['lever']} | {r['case']} | {speeds_md} | {r['ratio']}x ({r['ratio_of']}) |")
    write_results(result, "speed_levers", dev, "\n".join(md) + "\n", args.out)


if __name__ == "__main__":
    main()
