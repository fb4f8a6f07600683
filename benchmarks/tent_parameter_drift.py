"""How far all-parameter Tent moves the clients' parameters on the FedTSA protocol (why TTA-grad FedAvg = Local).

Runs Table 1's TTA-grad local method (Tent on all parameters, SGD lr 1e-4, batch-statistics BN) with the Local
strategy on the first ``--steps`` steps of the NIID protocol and reports, over all trainable parameters, the
relative change ||theta_t - theta_0|| / ||theta_0|| and the spread of the clients around their mean
||theta_i - mean_j theta_j|| / ||theta_0|| (what FedAvg would average away).

    python benchmarks/tent_parameter_drift.py [--steps 150] [--seed 0] [--device cpu]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ftta_core.loop import Engine
from ftta_core.experiment import ExperimentConfig, build_stream, local_params
from studies.paper import TTA_SETTINGS
from ftta_core.rng import derive_seed
from ftta_core.strategies import build_strategy
from ftta_core.training import load_source_model
from ftta_core.tta import build_local


def norm(tensors) -> float:
    """Euclidean norm over a collection of tensors."""
    return float(sum((t.double() ** 2).sum() for t in tensors).sqrt())


def drift(steps: int, seed: int, device: str) -> dict:
    """Relative parameter change and client spread after each of a few checkpoints up to ``steps``."""
    cfg = ExperimentConfig(dataset="cifar10", scenario="fedtsa_niid", clients=20, batch_size=10,
                           images_per_client=500, severity=5, strategy="local", seed=seed, device=device,
                           **TTA_SETTINGS["grad"])
    stream = build_stream(cfg, device, None)
    torch.manual_seed(derive_seed(seed, "engine"))
    engine = Engine(load_source_model(cfg.model_name, device=device), build_local(cfg.local, **local_params(cfg)),
                    build_strategy("local"), cfg.clients, cfg.backend, device, seed=seed)
    start = {k: v.clone() for k, v in engine.bank.get_params().items()}
    scale = norm(start.values())
    rows = []
    for t in range(steps):
        engine.step(stream.batch(t))
        if (t + 1) % 50 == 0 or t + 1 == steps:
            now = engine.bank.get_params()
            rows.append({"step": t + 1, "relative_change": norm(now[k] - start[k] for k in now) / scale,
                         "client_spread": norm(now[k] - now[k].mean(0, keepdim=True) for k in now) / scale})
    return {"config": cfg.to_dict(), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    result = drift(args.steps, args.seed, args.device)
    out = Path(__file__).parent / "results" / "tent_parameter_drift.json"
    out.write_text(json.dumps(result, indent=2))
    command = f"python benchmarks/tent_parameter_drift.py --steps {args.steps} --seed {args.seed} --device {args.device}"
    lines = [f"Made by: `{command}`", "", "All-parameter Tent (SGD lr 1e-4), Local strategy, NIID protocol, 20 clients; "
             "norms over all trainable parameters, relative to the source model's.", "",
             "| step | relative change | client spread |", "|---|---|---|"]
    lines += [f"| {r['step']} | {r['relative_change']:.2e} | {r['client_spread']:.2e} |" for r in result["rows"]]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
