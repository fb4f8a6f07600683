"""Freed memory kept for the next step (``ftta_core/allocator.py``) against glibc's defaults, in one run.

Each case is a drift-cell run of FedTSA's CIFAR-10-C NIID protocol (20 clients x batch 10, ResNet-8, Tent on all
parameters, running BN, Adam 3e-4: ``studies.anchored.client_config``), truncated to ``--steps`` steps, in a fresh
process with ``OMP_NUM_THREADS=1`` and ``FTTA_KEEP_MEMORY`` 0 (glibc's defaults) or 1 (kept), the two alternated
(which goes first alternates too) for ``--pairs`` pairs after one warm-up run of each case (the corrupted images
and the source cache on disk). Per run: ms per step (the run's own ``wall_time_s``), minor page faults per step
during the run, the process's peak resident memory, and the accuracy (identical: the allocator does not change
numbers).

    python benchmarks/allocator.py [--steps 15] [--pairs 2]

Ratios only: other processes share the CPU (the load average is reported); absolute times move with them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

from results_io import run_metadata, write_results

REPO = Path(__file__).resolve().parents[1]
CASES = {"plain client + FedAvg": ("plain", "fedavg"), "prox client + Local": ("prox", "local")}
CHILD = """
import json, resource, sys
from ftta_core.allocator import keep_freed_memory
keep_freed_memory()
import dataclasses, torch
torch.set_num_threads(1)
from ftta_core.experiment import run_experiment
from studies.anchored import client_config
client, strategy, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = dataclasses.replace(client_config(client, "niid"), strategy=strategy, max_steps=steps)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
s = run_experiment(cfg).summary
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"ms_per_step": round(1e3 * s["wall_time_s"] / steps, 1),
                  "faults_per_step": (use.ru_minflt - f0) // steps, "peak_rss_mb": round(use.ru_maxrss / 1024),
                  "accuracy": s["accuracy"]}))
"""


def run_once(case: str, keep: bool, steps: int) -> dict:
    """One run of ``case`` in a fresh process, freed memory kept or not."""
    client, strategy = CASES[case]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "FTTA_KEEP_MEMORY": "1" if keep else "0",
           "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", CHILD, client, strategy, str(steps)], env=env, cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(steps: int, pairs: int) -> Dict[str, dict]:
    out: Dict[str, dict] = {}
    for case in CASES:
        for keep in (False, True):
            run_once(case, keep, steps)  # warm-up
        runs: Dict[str, List[dict]] = {"default": [], "kept": []}
        for p in range(pairs):
            for keep in ((False, True) if p % 2 == 0 else (True, False)):
                runs["kept" if keep else "default"].append(run_once(case, keep, steps))
                print(case, "kept" if keep else "default", runs["kept" if keep else "default"][-1], flush=True)
        med = {k: statistics.median(r["ms_per_step"] for r in v) for k, v in runs.items()}
        out[case] = {"runs": runs, "median_ms_per_step": med,
                     "default_over_kept": round(med["default"] / med["kept"], 3),
                     "same_accuracy": len({r["accuracy"] for v in runs.values() for r in v}) == 1}
    return out


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [f"Measured with `{meta['command']}` on {meta['device_name']} (1 thread per run), {meta['date']}, "
             f"commit {meta['commit']}, torch {meta['torch']}, load average {meta['load_average']}.", "",
             f"Drift cell, NIID, seed 0, {result['steps']} steps per run, median of {result['pairs']} runs each "
             "(alternated, fresh processes):", "",
             "| case | glibc defaults ms/step | kept ms/step | defaults / kept | page faults per step (defaults -> "
             "kept) | peak RSS MB (defaults -> kept) | same accuracy |", "|---|---|---|---|---|---|---|"]
    for case, row in result["cases"].items():
        d, k = row["runs"]["default"], row["runs"]["kept"]
        faults = f"{statistics.median(r['faults_per_step'] for r in d):.0f} -> " \
                 f"{statistics.median(r['faults_per_step'] for r in k):.0f}"
        rss = f"{max(r['peak_rss_mb'] for r in d)} -> {max(r['peak_rss_mb'] for r in k)}"
        med = row["median_ms_per_step"]
        lines.append(f"| {case} | {med['default']} | {med['kept']} | {row['default_over_kept']}x | {faults} | {rss} | "
                     f"{'yes' if row['same_accuracy'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    result = {"steps": args.steps, "pairs": args.pairs, "cases": measure(args.steps, args.pairs)}
    result["meta"] = run_metadata("cpu")
    write_results(result, "allocator", "cpu", markdown(result))


if __name__ == "__main__":
    main()
