"""Where the time of a protocol step goes: the engine's phases and the top operators, from torch.profiler.

Runs the FedTSA CIFAR-10-C protocol (20 clients, batch 10, ResNet-8, NIID) for ``--steps`` steps per case under
``torch.profiler`` after one un-profiled warm-up run of the same steps (so the corrupted images are cached and the
numbers are steady state), and reads the engine's ``record_function`` labels (``ftta.stream``, ``ftta.source``,
``ftta.adapt``, ``ftta.uploads``, ``ftta.server``, ``ftta.mix``, ``ftta.predict``; see ``ftta_core/loop.py``).
Shares are of the time inside ``ftta.step`` (set-up and summaries excluded); "other" is what a step spends outside
the labelled phases (recording, checks). Absolute numbers depend on the machine and its load.

    python benchmarks/where_time_goes.py [--device cpu|cuda] [--steps 20] [--cases bn+fedavg bn+fedtsa ...] [--top 8]

The ``drift-<client>+<strategy>`` cases profile the anchored-clients study's drift cell (``studies.anchored``):
``python benchmarks/where_time_goes.py --steps 10 --cases drift-prox+local drift-prox+fedctta --out
benchmarks/results/where_time_goes_drift_cpu.json``.

Also the protocol's wall time per strategy: ms per step of an un-profiled run of the same steps x 750 (one strategy
per run; ``study fedtsa table --tta bn`` shares the local phase between baselines and is faster than their sum).
"""
from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from ftta_core.experiment import ExperimentConfig, run_experiment
from studies.paper import TTA_SETTINGS

STEP = "ftta.step"  # the whole step (stream, engine, recording): the denominator of the shares
PHASES = ("ftta.stream", "ftta.source", "ftta.adapt", "ftta.uploads", "ftta.server", "ftta.mix", "ftta.predict")
BN_STRATEGIES = ("local", "fedavg", "fedavg_ft", "fedprox", "fedavgm", "fedamp", "moon", "pfedsd", "pfedgraph",
                 "ldawa", "fedtsa", "fedctta")
CASES = {f"bn+{s}": ("bn", s) for s in BN_STRATEGIES}  # name -> (TTA setting of Table 1, strategy)
CASES.update({"grad+local": ("grad", "local"), "grad+fedavg": ("grad", "fedavg"), "grad+fedtsa": ("grad", "fedtsa")})
# the anchored-clients study's drift cell (running BN, Adam 3e-4, all parameters): "drift-<client>+<strategy>"
DRIFT_CLIENTS = ("plain", "prox", "restore", "fisher", "reset")
DRIFT_STRATEGIES = ("local", "fedavg", "fedtsa", "fedctta", "pfedgraph")
CASES.update({f"drift-{c}+{s}": (f"drift-{c}", s) for c in DRIFT_CLIENTS for s in DRIFT_STRATEGIES})
PROTOCOL_STEPS = 750  # the FedTSA CIFAR-10-C protocol: 15 corruptions x 50 steps
DEFAULT_CASES = [*(f"bn+{s}" for s in BN_STRATEGIES), "grad+local", "grad+fedavg"]


def protocol_config(case: str, steps: int, device: str) -> ExperimentConfig:
    """Table 1's NIID protocol config for ``case``, truncated to ``steps``."""
    tta, strategy = CASES[case]
    if tta.startswith("drift-"):  # the study's own config: its anchor strengths and the reset period it chose
        import dataclasses

        from studies import anchored

        period = anchored.chosen_reset(anchored.reset_selection()) if tta == "drift-reset" else None
        cfg = anchored.client_config(tta.removeprefix("drift-"), "niid", reset_every=period)
        return dataclasses.replace(cfg, strategy=strategy, device=device, max_steps=steps)
    return ExperimentConfig(dataset="cifar10", scenario="fedtsa_niid", clients=20, batch_size=10,
                            images_per_client=500, severity=5, strategy=strategy, device=device, max_steps=steps,
                            **TTA_SETTINGS[tta])


def profile_case(case: str, steps: int, device: str, top: int = 8) -> dict:
    """Phase times and the ``top`` operators by self time for ``steps`` steps of ``case``."""
    cfg = protocol_config(case, steps, device)
    run_experiment(cfg)  # warm-up: caches the corrupted images, first-call allocations
    plain = run_experiment(cfg).summary["wall_time_s"]  # the same steps without the profiler
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        run_experiment(cfg)
    events = prof.key_averages()
    totals = {e.key: e.cpu_time_total / 1e6 for e in events if e.key in PHASES or e.key == STEP}
    wall, phases = totals[STEP], totals
    ops = sorted((e for e in events if e.key.startswith("aten::")), key=lambda e: e.self_cpu_time_total,
                 reverse=True)[:top]
    return {"case": case, "steps": steps, "wall_s": wall, "ms_per_step": 1000 * wall / steps,
            "ms_per_step_unprofiled": 1000 * plain / steps,
            "protocol_minutes": plain / steps * PROTOCOL_STEPS / 60,
            "phases_s": {p: phases.get(p, 0.0) for p in PHASES},
            "top_ops": [{"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "calls": e.count} for e in ops]}


def markdown(results: list, command: str) -> str:
    """The phase-share table and each case's top operators."""
    lines = [f"Made by: `{command}`", "",
             "ms per step without the profiler, the full protocol's projected wall time (that x 750 steps), and the "
             "share of the (profiled) step time per engine phase (%):", "",
             "| case | ms/step | protocol (min) | " + " | ".join(p.removeprefix("ftta.") for p in PHASES)
             + " | other |", "|---|---|---|" + "---|" * (len(PHASES) + 1)]
    for r in results:
        shares = [100 * r["phases_s"][p] / r["wall_s"] for p in PHASES]
        lines.append(f"| {r['case']} | {r['ms_per_step_unprofiled']:.0f} | {r['protocol_minutes']:.1f} | "
                     + " | ".join(f"{s:.1f}" for s in shares) + f" | {100 - sum(shares):.1f} |")
    for r in results:
        lines += ["", f"Top operators by self time, {r['case']}:", "", "| operator | self s | calls | % of step time |",
                  "|---|---|---|---|"]
        lines += [f"| `{o['op']}` | {o['self_s']:.2f} | {o['calls']} | {100 * o['self_s'] / r['wall_s']:.1f} |"
                  for o in r["top_ops"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cases", nargs="+", default=DEFAULT_CASES, choices=list(CASES))
    parser.add_argument("--top", type=int, default=8, help="operators listed per case")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/where_time_goes_DEVICE.json)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's; run-plan uses 1)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from ftta_core.allocator import keep_freed_memory

    keep_freed_memory()  # as `python -m ftta_core run` and run-plan's workers do
    device_kind = "cuda" if args.device.startswith("cuda") else "cpu"
    out = Path(args.out or Path(__file__).parent / "results" / f"where_time_goes_{device_kind}.json")
    results = []
    for case in args.cases:
        results.append(profile_case(case, args.steps, args.device, args.top))
        print(f"{case}: {results[-1]['ms_per_step_unprofiled']:.0f} ms/step", flush=True)
    command = "python benchmarks/where_time_goes.py " + " ".join(
        [f"--device {args.device}", f"--steps {args.steps}", f"--top {args.top}", "--cases " + " ".join(args.cases)]
        + ([f"--threads {args.threads}"] if args.threads is not None else [])
        + ([f"--out {args.out}"] if args.out else []))
    meta = {"command": command, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(), "device": args.device}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    text = markdown(results, command)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
