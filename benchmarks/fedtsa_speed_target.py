"""FedTSA TTA-bn speed target: this tree against the code at a base commit on the first steps of Table 1's NIID run.

The issue's target: ``configs/fedtsa/table1_niid_bn.yaml`` (CIFAR-10-C, fedtsa_niid, 20 clients, batch 10, 15
corruptions at severity 5), first 60 steps, 2 torch threads: >= 1.5x faster than the base commit, accuracy within
0.2 points. Each run is the CLI (``python -m ftta_core run --config ... --max-steps N``) in a subprocess, the base
commit's from its worktree (``git worktree add /tmp/ftta_base c9857d8``) with ``PYTHONPATH`` pointing there (the
script checks which ``ftta_core`` each side imports). The two alternate ``--repeats`` times (base first, then new,
then base, ...) so that they see the same load; the machine is shared, so the load average is recorded around every
run and the ratio is taken of medians, of minima and of CPU seconds (user + system of the child), the least
load-sensitive. ``--kernels`` adds per-lever ratios on the server round in one process (``fedtsa_levers``).

    .venv/bin/python benchmarks/fedtsa_speed_target.py [--repeats 3] [--steps 60] [--base /tmp/ftta_base]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Dict, List, Optional

from results_io import run_metadata, write_results

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/fedtsa/table1_niid_bn.yaml"
TARGET = 1.5


def child_env(tree: Path, threads: int, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a run of ``tree``'s code with ``threads`` torch threads (and ``extra`` variables)."""
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               **(extra or {}))
    env.setdefault("FTTA_DATA_ROOT", "/work/shared/data")
    return env


def imported_from(tree: Path, python: str, threads: int) -> str:
    """Where ``ftta_core`` comes from under ``child_env(tree)`` (must be inside ``tree``)."""
    out = subprocess.run([python, "-c", "import ftta_core; print(ftta_core.__file__)"], env=child_env(tree, threads),
                         cwd=tree, capture_output=True, text=True, check=True).stdout.strip()
    if not Path(out).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{tree}: ftta_core is imported from {out}, not from the tree")
    return out


def one_run(tree: Path, python: str, steps: int, threads: int, out: Path,
            extra: Optional[Dict[str, str]] = None) -> dict:
    """One CLI run of ``tree``'s code: wall and CPU seconds of the process, the run's own loop time, accuracy."""
    cmd = [python, "-m", "ftta_core", "run", "--config", str(ROOT / CONFIG), "--max-steps", str(steps),
           "--out", str(out)]
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, env=child_env(tree, threads, extra), cwd=tree, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": round(wall, 2), "loop_s": summary["wall_time_s"],
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2),
            "accuracy": summary["accuracy"], "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, default=Path("/tmp/ftta_base"), help="worktree of the base commit")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kernels", action="store_true", help="also the per-lever kernel ratios (fedtsa_levers.py)")
    ap.add_argument("--new-env", action="append", default=[], metavar="KEY=VALUE",
                    help="a variable for the new tree's runs only (e.g. FTTA_SOURCE_CACHE=0, FTTA_COMPILE=1)")
    ap.add_argument("--warmup", action="store_true",
                    help="one untimed run of each side first (fills the new tree's source-output cache, the page "
                         "cache and FedTSA's compiled-iteration cache, so the timed runs are the steady state of a grid)")
    ap.add_argument("--name", default="fedtsa_speed_target", help="results file name (benchmarks/results/NAME_cpu)")
    args = ap.parse_args()
    extra = dict(item.split("=", 1) for item in args.new_env)
    python = sys.executable
    base_commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.base, capture_output=True,
                                 text=True, check=True).stdout.strip()
    sides = {"base": args.base, "new": ROOT}
    origin = {side: imported_from(tree, python, args.threads) for side, tree in sides.items()}
    runs: Dict[str, List[dict]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="fedtsa_speed_") as tmp:
        warmups: Dict[str, dict] = {}
        if args.warmup:
            for side, tree in sides.items():
                warmups[side] = one_run(tree, python, args.steps, args.threads, Path(tmp) / f"{side}_warm",
                                        extra if side == "new" else None)
                print("warm-up", side, warmups[side], flush=True)
        for rep in range(args.repeats):
            for side, tree in sides.items():
                runs[side].append(one_run(tree, python, args.steps, args.threads, Path(tmp) / f"{side}_{rep}",
                                          extra if side == "new" else None))
                print(side, rep, runs[side][-1], flush=True)
    stat = {side: {k: {"median": median(r[k] for r in rs), "min": min(r[k] for r in rs)}
                   for k in ("wall_s", "loop_s", "cpu_s")} for side, rs in runs.items()}
    ratio = {k: {s: round(stat["base"][k][s] / stat["new"][k][s], 3) for s in ("median", "min")}
             for k in ("wall_s", "loop_s", "cpu_s")}
    accuracy = {side: sorted({r["accuracy"] for r in rs}) for side, rs in runs.items()}
    gap = max(abs(a - b) for a in accuracy["base"] for b in accuracy["new"])
    result = {**run_metadata("cpu"), "base_commit": base_commit, "imported_from": origin, "config": CONFIG,
              "new_env": extra, "warmup": args.warmup,
              "steps": args.steps, "threads": args.threads, "repeats": args.repeats, "runs": runs,
              "warmup_runs": warmups, "stats": stat,
              "ratio_base_over_new": ratio, "accuracy": accuracy, "max_accuracy_gap": round(gap, 4),
              "target": {"speedup": TARGET, "accuracy_gap": 0.2,
                         "met": ratio["wall_s"]["median"] >= TARGET and gap <= 0.2}}
    rows = "\n".join(f"| {side} | {i} | {r['wall_s']} | {r['loop_s']} | {r['cpu_s']} | {r['accuracy']:.3f} | "
                     f"{r['load_before']} / {r['load_after']} |"
                     for i in range(args.repeats) for side, rs in runs.items() for r in [rs[i]])
    markdown = (f"# FedTSA TTA-bn speed target: this tree vs {base_commit} (CPU, {args.threads} threads, first "
                f"{args.steps} steps of `{CONFIG}`{', new side with ' + str(extra) if extra else ''})\n\n"
                f"Made by: `{result['command']}` on {result['date']}, commit {result['commit']} plus the working tree, "
                f"{result['device_name']}, torch {result['torch']}; "
                f"{'one untimed warm-up run per side first; ' if args.warmup else ''}load average after the runs "
                f"{result['load_average']} (the machine is shared: other jobs ran beside these runs).\n\n"
                "Alternating runs of the CLI (wall: the process; loop: the run's own step loop, `summary.json`; "
                "CPU: user + system seconds of the process):\n\n"
                "| code | repeat | wall (s) | loop (s) | CPU (s) | accuracy (%) | load before / after |\n"
                "|---|---|---|---|---|---|---|\n" + rows + "\n\n"
                "| ratio base / new | median | min |\n|---|---|---|\n"
                + "\n".join(f"| {k} | {v['median']}x | {v['min']}x |" for k, v in ratio.items())
                + "".join(f"\n\nUntimed warm-up runs (they fill the caches; the new side's first run on a machine "
                          f"also builds FedTSA's compiled iteration, once): base {warmups['base']['wall_s']} s, new "
                          f"{warmups['new']['wall_s']} s wall." for _ in [0] if warmups)
                + f"\n\nAccuracy: base {accuracy['base']}, new {accuracy['new']} (max gap {gap:.3f} points). "
                f"Target (>= {TARGET}x on the wall time's median, accuracy within 0.2): "
                f"{'met' if result['target']['met'] else 'not met'}.\n")
    if args.kernels:
        from fedtsa_levers import lever_table

        levers = lever_table()
        result["levers"] = levers["rows"]
        markdown += "\n" + levers["markdown"]
    print(markdown)
    write_results(result, args.name, "cpu", markdown)


if __name__ == "__main__":
    main()
