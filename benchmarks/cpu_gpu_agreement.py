"""Do CPU and GPU runs of one Table 1 config agree? Re-runs stored GPU runs on this machine's CPU and compares.

The Table 1 tables mix seeds run on the CPU and on a GPU (same configs, same cache keys; each summary records its
device). This script takes the stored GPU summaries of one (setting, seed), re-runs those strategies on the CPU in one
shared TTA-bn pass, and writes the accuracies side by side to ``results/cpu_gpu_agreement.{json,md}``.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/cpu_gpu_agreement.py --setting niid --seed 3 --strategies local fedavg
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from ftta_core.experiment import run_strategies
from studies.fedtsa.table1 import table1_config
from ftta_core.workbook import config_key

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setting", choices=["niid", "iid"], default="niid")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--strategies", nargs="+", default=["local", "fedavg"])
    ap.add_argument("--results", type=Path, default=HERE.parent / "figures" / "fedtsa_table1" / "runs")
    args = ap.parse_args()

    base = dataclasses.replace(table1_config("cifar10", args.setting, "bn"), seed=args.seed)
    stored = {}
    for s in args.strategies:
        path = args.results / f"{config_key(dataclasses.replace(base, strategy=s))}.json"
        if not path.exists():
            raise SystemExit(f"no stored run for {s} ({path}); run it first with `python -m ftta_core study fedtsa table`")
        stored[s] = json.loads(path.read_text())
    cpu = run_strategies(dataclasses.replace(base, device="cpu"), args.strategies)
    rows = []
    for s in args.strategies:
        ours = cpu[s].summary
        rows.append({"strategy": s, "stored_device": stored[s].get("device"),
                     "stored_accuracy": stored[s]["accuracy"], "cpu_accuracy": ours["accuracy"],
                     "stored_source": stored[s]["accuracy_source"], "cpu_source": ours["accuracy_source"],
                     "n_predictions": ours["n_predictions"]})
    out = {"command": f"python benchmarks/cpu_gpu_agreement.py --setting {args.setting} --seed {args.seed} "
                      f"--strategies {' '.join(args.strategies)}", "rows": rows}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "cpu_gpu_agreement.json").write_text(json.dumps(out, indent=1))
    lines = [f"Made by: `{out['command']}`", "",
             f"Table 1 config, TTA-bn, {args.setting.upper()}, seed {args.seed}: the stored run vs the same config "
             "re-run on this CPU (accuracy %, all predictions of all clients).", "",
             "| strategy | stored on | stored | CPU | difference | source stored | source CPU | predictions |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['strategy']} | {r['stored_device']} | {r['stored_accuracy']:.4f} | {r['cpu_accuracy']:.4f} "
                     f"| {r['cpu_accuracy'] - r['stored_accuracy']:+.4f} | {r['stored_source']:.4f} | "
                     f"{r['cpu_source']:.4f} | {r['n_predictions']} |")
    text = "\n".join(lines) + "\n"
    (HERE / "results" / "cpu_gpu_agreement.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
