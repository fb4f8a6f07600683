"""Engine throughput and peak memory as the number of clients grows (10 ... 1,000), vectorized vs loop bank.

One engine step on the FedTSA protocol shape per client (batch 10, ResNet-8, 32x32; source forward, local
adaptation, uploads, W, mixing, prediction after mixing), FedAvg as the strategy so the server is the floor (the
collaboration cost of FedTSA/FedCTTA as N grows is `server_cost.py`). For each N it reports steps/s, images/s,
the peak memory of the run (CUDA: `torch.cuda.max_memory_allocated` from before the engine is built, so the client
bank's states are included; CPU: the tensors the engine holds plus the peak torch allocation of one step) and, up to
``--loop-max`` clients, the same for the loop bank (the specification), so the ratio vectorized / loop is read within
one run. Absolute numbers depend on the machine and its load; compare ratios and slopes.

    python benchmarks/client_scaling.py [--device cpu|cuda] [--clients 10 20 ... 1000] [--steps 5] [--out FILE]
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch

from ftta_core.loop import Engine
from ftta_core.models import build_model
from studies.fedctta.server_cost import peak_allocation, tensor_bytes
from ftta_core.stream import StreamBatch
from ftta_core.strategies import build_strategy
from ftta_core.tta import build_local
from results_io import device_name, write_results

CASES = {
    "TTA-bn": ("bn", {}),
    "Tent (BN affine)": ("tent", {"params": "bn_affine", "optimizer": "sgd", "lr": 1e-4}),
    "Tent (all params)": ("tent", {"params": "all", "optimizer": "sgd", "lr": 1e-4}),
}
CLIENTS = (10, 20, 50, 100, 200, 500, 1000)


def synthetic_batches(n_clients: int, batch: int, count: int, device: str, seed: int = 0) -> List[StreamBatch]:
    """``count`` distinct [N,B,3,32,32] batches from a seeded generator (speed does not depend on pixel content)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in range(count):
        x = torch.rand(n_clients, batch, 3, 32, 32, generator=gen).to(device)
        y = torch.randint(0, 10, (n_clients, batch), generator=gen).to(device)
        zeros = np.zeros(n_clients, dtype=np.int64)
        out.append(StreamBatch(t, x, y, zeros, np.zeros((n_clients, batch), dtype=np.int64)))
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(local: str, params: dict, backend: str, n_clients: int, batch: int, steps: int, device: str,
            warmup: int = 2) -> Dict[str, float]:
    """Steps/s over ``steps`` timed steps after ``warmup``, and the run's peak memory, for one (case, backend, N)."""
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    data = synthetic_batches(n_clients, batch, 3, device)
    torch.manual_seed(0)
    engine = Engine(build_model("resnet8").eval(), build_local(local, **params), build_strategy("fedavg"), n_clients,
                    backend, device)
    for t in range(warmup):
        engine.step(data[t % len(data)])
    _sync(device)
    t0 = time.perf_counter()
    for t in range(steps):
        engine.step(data[t % len(data)])
    _sync(device)
    seconds = time.perf_counter() - t0
    row = {"steps_per_s": steps / seconds, "images_per_s": steps * n_clients * batch / seconds}
    if cuda:
        row["peak_bytes"] = int(torch.cuda.max_memory_allocated() - base)
    else:
        step_peak = peak_allocation(lambda: engine.step(data[0]), device)["torch_cpu_peak_bytes"]
        row["peak_bytes"] = int(tensor_bytes(engine) + step_peak)
    del engine, data
    return row


def markdown(result: dict) -> str:
    """The measured table as markdown."""
    md = [f"Measured with `{result['command']}` on {result['device_name']} ({result['threads']} thread(s)), torch "
          f"{result['torch']}, {result['date']}. Batch {result['batch']} per client, ResNet-8, FedAvg; "
          f"{result['steps']} timed steps after 2 warm-up steps. Peak memory: "
          + ("CUDA `max_memory_allocated` over the whole run (client bank included)." if result["device"] == "cuda"
             else "tensors the engine holds + the peak torch allocation of one step.")
          + " Loop bank measured up to "
          f"{result['loop_max']} clients.", "",
          "| case | clients | vectorized steps/s | vectorized images/s | vectorized peak MB | loop steps/s | "
          "loop peak MB | vectorized / loop |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        vec, loop = r["vectorized"], r.get("loop")
        loop_cells = (f"{loop['steps_per_s']:.2f} | {loop['peak_bytes'] / 2**20:.1f} | "
                      f"{vec['steps_per_s'] / loop['steps_per_s']:.2f}x") if loop else "– | – | –"
        md.append(f"| {r['case']} | {r['clients']} | {vec['steps_per_s']:.2f} | {vec['images_per_s']:.0f} | "
                  f"{vec['peak_bytes'] / 2**20:.1f} | {loop_cells} |")
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--clients", nargs="+", type=int, default=list(CLIENTS))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--loop-max", type=int, default=200, dest="loop_max",
                    help="largest N at which the loop bank is also measured")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    device = args.device
    rows = []
    for case in args.cases:
        local, params = CASES[case]
        for n in args.clients:
            row = {"case": case, "clients": n,
                   "vectorized": measure(local, params, "vectorized", n, args.batch, args.steps, device)}
            if n <= args.loop_max:
                row["loop"] = measure(local, params, "loop", n, args.batch, args.steps, device)
            rows.append(row)
            loop = row.get("loop")
            print(f"{case:18s} N={n:5d} vectorized {row['vectorized']['steps_per_s']:8.2f} steps/s "
                  f"{row['vectorized']['peak_bytes'] / 2**20:9.1f} MB"
                  + (f"  loop {loop['steps_per_s']:8.2f} steps/s" if loop else ""), flush=True)
    kind = device.split(":")[0]
    result = {"command": "python benchmarks/client_scaling.py " + shlex.join(sys.argv[1:]), "device": kind,
              "device_name": device_name(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "batch": args.batch, "steps": args.steps, "loop_max": args.loop_max,
              "rows": rows}
    write_results(result, "client_scaling", device, markdown(result), args.out)


if __name__ == "__main__":
    main()
