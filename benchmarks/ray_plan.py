"""Throughput of run-plan's executors on one small plan, in one run: local workers (1 and 2) and Ray tasks on a
throw-away cluster started on 127.0.0.1 (1 CPU: a head; 2 CPUs: a head and a worker node, 1 CPU each).

Every executor runs the same plan (``--jobs`` FedAvg runs on the embedded digits, one seed each) into its own
results folder, one torch thread per job; jobs/minute counts from the first job submitted to the last stored, so it
includes starting the worker processes (spawned local workers, Ray's workers) but not starting the Ray nodes
(reported apart). The stored summaries of all executors are checked to be equal (wall time and thread count
aside). Ratios are what to read; absolute numbers depend on the machine and its load.

    python benchmarks/ray_plan.py [--jobs 8] [--clients 10] [--images 100] [--out FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

from ftta_core.experiment import ExperimentConfig
from ftta_core.plan import REPO_DIR, PlannedJob
from ftta_core.plan_runner import run_plan
from ftta_core.ray_plan import LocalCluster, run_plan_ray
from results_io import device_name, write_results


def plan(n: int, clients: int, images: int, results: Path) -> List[PlannedJob]:
    """``n`` FedAvg runs (seeds 0..n-1) of a small TTA-bn config on the embedded digits, stored under ``results``."""
    base = ExperimentConfig(dataset="embedded_digits", scenario="fedtsa_niid", clients=clients, batch_size=10,
                            images_per_client=images, corruptions=["fog", "contrast", "frost", "glass_blur"],
                            local="bn", strategy="fedavg", device="cpu")
    return [PlannedJob(dataclasses.replace(base, seed=s).to_dict(), str(results)) for s in range(n)]


def stored(results: Path) -> Dict[str, Dict[str, Any]]:
    """The summaries under ``results`` by file name, without the fields that may differ between executors."""
    out = {}
    for f in sorted(results.glob("*.json")):
        summary = json.loads(f.read_text())
        for key in ("wall_time_s", "threads"):
            summary.pop(key, None)
        out[f.name] = summary
    return out


def differences(a: Any, b: Any, path: str = "") -> List[str]:
    """The paths (``file.key.key``) where two nested summaries differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}.{k}".strip("."))]
    return [] if a == b else [path]


def timed(name: str, n: int, run: Callable[[], List[Dict[str, Any]]], **extra: Any) -> Dict[str, Any]:
    """Run one executor over the plan; its row: seconds, jobs/minute, failures."""
    t0 = time.perf_counter()
    done = run()
    seconds = time.perf_counter() - t0
    job_s = [d["seconds"] for d in done if "error" not in d]
    row = {"executor": name, "seconds": round(seconds, 1), "jobs_per_min": round(60 * n / seconds, 2),
           "mean_job_s": round(sum(job_s) / max(1, len(job_s)), 1), "failed": sum(1 for d in done if "error" in d),
           **extra}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--images", type=int, default=100, help="images per client")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    load_before = os.getloadavg()
    quiet = lambda line: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="ray-plan-bench-") as tmp:
        root = Path(tmp)
        os.environ["FTTA_PARTIAL_DIR"] = str(root / "partial")  # never the checkout's runs/partial
        rows, folders = [], {}
        for workers in (1, 2):
            name = f"local --workers {workers}"
            folders[name] = root / f"local{workers}"
            jobs = plan(args.jobs, args.clients, args.images, folders[name])
            rows.append(timed(name, args.jobs, lambda: run_plan(jobs, workers=workers, threads=1, log=quiet)))
        for cpus in (1, 2):
            name = f"ray, {cpus} CPU" + ("s (head + worker node)" if cpus == 2 else " (head)")
            folders[name] = root / f"ray{cpus}"
            jobs = plan(args.jobs, args.clients, args.images, folders[name])
            with LocalCluster(nodes=cpus, cpus_per_node=1) as cluster:
                rows.append(timed(name, args.jobs, lambda: run_plan_ray(jobs, address=cluster.address, log=quiet),
                                  nodes_started_s=cluster.started_s))
            assert not cluster.leftovers(), cluster.leftovers()
        reference = stored(folders["local --workers 1"])
        diffs = {name: differences(reference, stored(f)) for name, f in folders.items()}
        same = not any(diffs.values()) and len(reference) == args.jobs
    by = {r["executor"].split(" (")[0]: r["jobs_per_min"] for r in rows}
    ratios = {"local 2 workers / 1": by["local --workers 2"] / by["local --workers 1"],
              "ray 2 CPUs / 1 CPU": by["ray, 2 CPUs"] / by["ray, 1 CPU"],
              "ray 1 CPU / local 1 worker": by["ray, 1 CPU"] / by["local --workers 1"],
              "ray 2 CPUs / local 2 workers": by["ray, 2 CPUs"] / by["local --workers 2"]}
    ratios = {k: round(v, 2) for k, v in ratios.items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_DIR, capture_output=True,
                            text=True).stdout.strip()
    command = " ".join(["python", "benchmarks/ray_plan.py", *sys.argv[1:]])
    result = {"command": command, "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "commit": commit, "machine": {"processor": device_name("cpu"), "cpus": os.cpu_count(),
                                            "platform": platform.platform()},
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average_after": [round(x, 2) for x in os.getloadavg()],
              "plan": {"jobs": args.jobs, "clients": args.clients, "images_per_client": args.images,
                       "local": "bn", "strategy": "fedavg", "dataset": "embedded_digits"},
              "same_summaries": same, "differences": diffs, "rows": rows, "ratios": ratios}
    md = [f"Measured with `{command}` on {result['date']} (commit {commit}), {result['machine']['processor']}, "
          f"{os.cpu_count()} CPUs, load average {load_before[0]:.1f} before / {os.getloadavg()[0]:.1f} after "
          f"(other processes on the machine). Plan: {args.jobs} FedAvg TTA-bn runs, {args.clients} clients x "
          f"{args.images} embedded-digit images; one torch thread per job. Stored summaries equal across "
          f"executors: {same}.", "",
          "| executor | seconds | jobs/min | mean s per job | Ray nodes started in (s, apart) |",
          "|---|---|---|---|---|"]
    md += [f"| {r['executor']} | {r['seconds']} | {r['jobs_per_min']} | {r['mean_job_s']} | "
           f"{', '.join(f'{k} {v}' for k, v in r.get('nodes_started_s', {}).items())} |" for r in rows]
    md += ["", "| ratio | value |", "|---|---|"] + [f"| {k} | {v}x |" for k, v in ratios.items()]
    write_results(result, "ray_plan", "cpu", "\n".join(md) + "\n", args.out)
    if not same:
        raise SystemExit(f"the executors stored different summaries: {diffs}")


if __name__ == "__main__":
    main()
