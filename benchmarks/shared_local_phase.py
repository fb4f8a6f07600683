"""TTA-bn grids: S strategies run separately vs sharing one stateless local phase, in one run.

Under TTA-bn a client's local pass (batch statistics) does not depend on the strategy, so S strategies can share
the source pass and the batch-statistics pass: 2 + S forwards per step instead of 3S (`Engine.step_strategies`,
equal to separate runs by test). 20 clients x batch 10, ResNet-8, synthetic 32x32 batches.

    python benchmarks/shared_local_phase.py [--device cpu|cuda] [--steps 8]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ftta_core.loop import Engine
from ftta_core.models import build_model
from ftta_core.strategies import build_strategy
from ftta_core.tta import build_local

from engine_backends import batches

STRATEGIES = ["local", "fedavg", "fedavg_ft", "fedprox", "fedavgm", "fedamp", "moon", "pfedsd", "pfedgraph", "ldawa"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = build_model("resnet8").eval()
    data = batches(20, 10, args.steps, args.device)

    t0 = time.perf_counter()
    for name in STRATEGIES:
        engine = Engine(model, build_local("bn"), build_strategy(name), 20, "vectorized", args.device)
        for b in data:
            engine.step(b)
    separate = time.perf_counter() - t0

    t0 = time.perf_counter()
    strategies = {name: build_strategy(name) for name in STRATEGIES}
    engine = Engine(model, build_local("bn"), strategies["local"], 20, "vectorized", args.device)
    for s in strategies.values():
        s.reset(20)
    for b in data:
        engine.step_strategies(b, strategies)
    shared = time.perf_counter() - t0

    result = {"device": args.device, "threads": torch.get_num_threads(), "strategies": len(STRATEGIES),
              "steps": args.steps, "separate_s": round(separate, 2), "shared_s": round(shared, 2),
              "speedup": round(separate / shared, 2)}
    print(json.dumps(result))
    out = Path(__file__).parent / "results" / f"shared_local_phase_{args.device.split(':')[0]}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
