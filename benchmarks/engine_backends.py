"""Steps/second of the loop and vectorized client banks in one run, on the FedTSA protocol shape.

20 clients, batch 10, ResNet-8, 32x32 inputs; FedAvg; local methods TTA-bn, Tent on BN affine parameters and Tent on
all parameters (SGD 1e-4, as in the FedTSA/FedCTTA TTA-grad setting). One full engine step each: source forward,
local adaptation, uploads, W, mixing, prediction after mixing. Reports the speed ratio vectorized / loop, which is
what we compare; absolute numbers depend on the machine and its load.

    python benchmarks/engine_backends.py [--device cpu|cuda] [--steps 20] [--clients 20] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch

from ftta_core.loop import Engine
from ftta_core.models import build_model
from ftta_core.stream import StreamBatch
from ftta_core.strategies import build_strategy
from ftta_core.tta import build_local
from results_io import device_name, write_results

CASES = {
    "TTA-bn": ("bn", {}),
    "Tent (BN affine)": ("tent", {"params": "bn_affine", "optimizer": "sgd", "lr": 1e-4}),
    "Tent (all params)": ("tent", {"params": "all", "optimizer": "sgd", "lr": 1e-4}),
}
# --all-locals: every other registered local method at its defaults, and the reference clients' TTA-grad
MORE_CASES = {
    "Tent (all params, running BN, Adam)": ("tent", {"params": "all", "optimizer": "adam", "lr": 1e-5,
                                                     "bn": "running"}),
    "PL": ("pl", {}), "EATA": ("eata", {"fisher_source": "resnet8_cifar10"}), "CoTTA": ("cotta", {}), "RoTTA": ("rotta", {}), "ROID": ("roid", {}),
    "BBN": ("bbn", {}),
}


def batches(n_clients: int, batch: int, steps: int, device: str) -> list:
    """Synthetic [N,B,3,32,32] batches from a seeded generator (speed does not depend on pixel content)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for t in range(steps):
        x = torch.rand(n_clients, batch, 3, 32, 32, generator=gen).to(device)
        y = torch.randint(0, 10, (n_clients, batch), generator=gen).to(device)
        out.append(StreamBatch(t, x, y, np.zeros(n_clients, dtype=np.int64), np.zeros((n_clients, batch), dtype=np.int64)))
    return out


def steps_per_second(local: str, params: dict, backend: str, data: list, device: str, warmup: int = 3) -> float:
    """Engine steps per second after ``warmup`` steps."""
    torch.manual_seed(0)
    model = build_model("resnet8").eval()
    engine = Engine(model, build_local(local, **params), build_strategy("fedavg"), data[0].images.shape[0], backend,
                    device)
    for b in data[:warmup]:
        engine.step(b)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for b in data[warmup:]:
        engine.step(b)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (len(data) - warmup) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--all-locals", action="store_true", help="also every other local method (MORE_CASES)")
    args = ap.parse_args()
    data = batches(args.clients, args.batch, args.steps + 3, args.device)
    rows = []
    for name, (local, params) in {**CASES, **(MORE_CASES if args.all_locals else {})}.items():
        loop = steps_per_second(local, params, "loop", data, args.device)
        vec = steps_per_second(local, params, "vectorized", data, args.device)
        rows.append({"case": name, "loop_steps_per_s": round(loop, 2), "vectorized_steps_per_s": round(vec, 2),
                     "ratio": round(vec / loop, 2)})
        print(f"{name:20s} loop {loop:7.2f} steps/s   vectorized {vec:7.2f} steps/s   ratio {vec / loop:5.2f}x",
              flush=True)
    name = device_name(args.device)
    result = {"device": args.device, "device_name": name, "threads": torch.get_num_threads(),
              "clients": args.clients, "batch": args.batch, "steps": args.steps, "torch": torch.__version__,
              "rows": rows}
    flags = " --all-locals" if args.all_locals else ""
    md = [f"Measured with `python benchmarks/engine_backends.py --device {args.device} --steps {args.steps}{flags}` "
          f"on {name} ({result['threads']} threads), torch {torch.__version__}, load average at the end "
          f"{[round(v, 2) for v in os.getloadavg()]}; {args.clients} clients x batch {args.batch}, ResNet-8, FedAvg.",
          "", "| case | loop steps/s | vectorized steps/s | vectorized / loop |",
          "|---|---|---|---|"]
    md += [f"| {r['case']} | {r['loop_steps_per_s']} | {r['vectorized_steps_per_s']} | {r['ratio']}x |" for r in rows]
    write_results(result, "engine_backends", args.device, "\n".join(md) + "\n", args.out)


if __name__ == "__main__":
    main()
