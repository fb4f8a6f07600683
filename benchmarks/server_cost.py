"""Server cost of FedCTTA vs FedTSA (FedAvg as the floor): time per round, memory, bytes uploaded per client.

The strategies are driven directly with synthetic uploads of the shapes the ResNet-8 protocol produces (BN
statistics for the TTA-bn mixing, FedTSA's 256-float indicator, FedCTTA's 10 mean logits on the probes); no images
and no client models, except for FedCTTA's probe forward, which is measured on a real ResNet-8 client bank at a few
client counts. FedTSA's memory bank is prefilled to its window T (steady state) before the timed rounds.

    python benchmarks/server_cost.py [--device cpu|cuda] [--clients 10 20 ... 1000] [--out FILE]

Writes benchmarks/results/server_cost_<device>.{json,md}.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import Dict, List

import torch

from ftta_core.models import build_model
from studies.fedctta.server_cost import (bn_state_shapes, extrapolate_linear, fill_indicator_memory, measure_rounds,
                                           model_dims, peak_allocation, probe_forward_cost, server_round,
                                           summarize_rounds, synthetic_inputs, upload_bytes, upload_shapes)
from ftta_core.strategies import Strategy, build_strategy
from results_io import device_name, write_results

# label -> (registry name, parameters); FedTSA at its defaults (T = 10, 100 server steps per round)
STRATEGIES = {"FedAvg": ("fedavg", {}), "FedCTTA": ("fedctta", {}), "FedCTTA (EMA 0.9)": ("fedctta", {"ema": 0.9}),
              "FedTSA": ("fedtsa", {})}
CLIENTS = (10, 20, 50, 100, 200, 500, 1000)


def rounds_for(label: str, n: int) -> int:
    """Timed rounds per (strategy, N): fewer for FedTSA at large N, where one round takes tens of seconds."""
    if label != "FedTSA":
        return 20 if n <= 200 else 10
    return 5 if n <= 20 else 3 if n <= 50 else 2 if n <= 100 else 1


def build(label: str, **overrides) -> Strategy:
    """The strategy named ``label`` in ``STRATEGIES`` (``overrides`` replace its parameters)."""
    name, params = STRATEGIES[label]
    return build_strategy(name, **{**params, **overrides})


def scaling_row(label: str, n: int, dims: Dict[str, int], state, device: str, large_steps: int, large_from: int,
                peak_steps: int) -> dict:
    """Timed steady-state rounds, memory held and the peak allocation of one round for (strategy, N)."""
    default_steps = build(label).server_steps if label == "FedTSA" else None
    steps = default_steps if default_steps is None or n < large_from else large_steps
    strategy = build(label, server_steps=steps) if label == "FedTSA" else build(label)
    strategy.reset(n)
    uploads = upload_shapes(strategy, dims)
    window = getattr(strategy, "window", 1)
    start = fill_indicator_memory(strategy, n, window - 1, dims["feature_dim"], device=device)
    row = {"strategy": label, "clients": n, "server_steps": steps,
           **summarize_rounds(measure_rounds(strategy, n, rounds_for(label, n), state, uploads, device=device,
                                             start=start))}
    if steps:
        row["per_server_step_s"] = row["collaboration_s"] / steps
        row["collaboration_s_at_default_steps"] = row["per_server_step_s"] * default_steps
        row["round_s_at_default_steps"] = row["collaboration_s_at_default_steps"] + row["mix_s"]
        row["extrapolated"] = steps != default_steps
    probe = build(label, server_steps=peak_steps) if label == "FedTSA" else build(label)
    probe.reset(n)
    fill_indicator_memory(probe, n, window - 1, dims["feature_dim"], device=device)
    inputs = synthetic_inputs(10_000, n, state, uploads, device=device)
    row.update(peak_allocation(lambda: server_round(probe, inputs), device))
    row["peak_server_steps"] = peak_steps if label == "FedTSA" else None
    return row


def over_rounds(n: int, rounds: int, dims: Dict[str, int], state, device: str, server_steps: int) -> List[dict]:
    """Memory held after every round and round time, from an empty server (FedTSA's bank fills up to T)."""
    rows = []
    for label in STRATEGIES:
        strategy = build(label, server_steps=server_steps) if label == "FedTSA" else build(label)
        strategy.reset(n)
        for cost in measure_rounds(strategy, n, rounds, state, upload_shapes(strategy, dims), device=device):
            rows.append({"strategy": label, "clients": n, "round": cost.step + 1, "round_s": cost.round_s,
                         "state_dict_bytes": cost.state_dict_bytes, "retained_bytes": cost.retained_bytes})
    return rows


def upload_rows(dims: Dict[str, int], state) -> List[dict]:
    """Bytes per client and round: what is mixed (TTA-bn / TTA-grad) and what each strategy uploads beside it."""
    rows = [{"what": "BN statistics (TTA-bn mixing, every strategy)", "floats": upload_bytes(state) // 4,
             "bytes": upload_bytes(state)},
            {"what": "all parameters (TTA-grad mixing, every strategy)", "floats": dims["parameters"],
             "bytes": 4 * dims["parameters"]}]
    for label, extra in (("FedTSA indicator", {}), ("FedCTTA probe statistic (logits)", {"on": "logits"}),
                         ("FedCTTA probe statistic (features, Table IV)", {"on": "features"})):
        strategy = build_strategy("fedtsa") if label.startswith("FedTSA") else build_strategy("fedctta", **extra)
        shapes = upload_shapes(strategy, dims)
        rows.append({"what": label, "floats": upload_bytes(shapes) // 4, "bytes": upload_bytes(shapes)})
    return rows


def fmt_bytes(b: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(b) < 1024 or unit == "GB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GB"


def markdown(result: dict) -> str:
    """The result tables as markdown."""
    md = [f"Measured with `{result['command']}` on {result['device_name']} ({result['threads']} thread(s)), torch "
          f"{result['torch']}, {result['date']}. Synthetic uploads shaped like ResNet-8 (D = "
          f"{result['model']['feature_dim']}, K = {result['model']['classes']}, {result['model']['bn_channels']} BN "
          f"channels); FedTSA at T = 10 with its window prefilled (steady state). Seconds are medians over the timed "
          "rounds; one thread while other jobs shared the CPU, so compare ratios, not absolute times.", "",
          "## Server time per round and memory held between rounds", "",
          "| clients | strategy | rounds timed | server steps | s / round (W + mix) | s / server step | "
          "held between rounds | peak allocated in a round |", "|---|---|---|---|---|---|---|---|"]
    for r in result["scaling"]:
        steps = "–" if r["server_steps"] is None else str(r["server_steps"])
        round_s = r.get("round_s_at_default_steps", r["round_s"])
        mark = " (extrapolated from the steps timed)" if r.get("extrapolated") else ""
        per_step = f"{r['per_server_step_s']:.4f}" if "per_server_step_s" in r else "–"
        peak = r.get("cuda_peak_bytes", r["torch_cpu_peak_bytes"])
        md.append(f"| {r['clients']} | {r['strategy']} | {r['rounds']} | {steps} | {round_s:.4f}{mark} | {per_step} | "
                  f"{fmt_bytes(r['retained_bytes'])} | {fmt_bytes(peak)} |")
    md += ["", "Held between rounds = distinct tensor storages reachable from the strategy object (FedTSA: the memory "
           "bank T x N x D and the last round's diagnostics, whose attention is T x N x N). Peak allocated = torch "
           "allocations during one round above its start (profiler memory events"
           + (f"; FedTSA profiled with {result['peak_server_steps']} server steps, the peak of one step repeats"
              " every step)." if result.get("peak_server_steps") else ")."), "",
           "## Memory and time over rounds (from an empty server)", "",
           f"{result['over_rounds_clients']} clients, {result['over_rounds_rounds']} rounds, FedTSA with "
           f"{result['over_rounds_server_steps']} server steps per round.", "",
           "| strategy | held after round 1 | after round 10 | after the last round | s / round (first, last) |",
           "|---|---|---|---|---|"]
    by = {}
    for r in result["over_rounds"]:
        by.setdefault(r["strategy"], []).append(r)
    for label, rows in by.items():
        tenth = rows[min(9, len(rows) - 1)]
        md.append(f"| {label} | {fmt_bytes(rows[0]['retained_bytes'])} | {fmt_bytes(tenth['retained_bytes'])} | "
                  f"{fmt_bytes(rows[-1]['retained_bytes'])} | {rows[0]['round_s']:.4f}, {rows[-1]['round_s']:.4f} |")
    md += ["", "## Bytes uploaded per client per round", "", "| what | floats | bytes |", "|---|---|---|"]
    md += [f"| {r['what']} | {r['floats']} | {r['bytes']} |" for r in result["uploads"]]
    md += ["", "## FedCTTA's probe forward (client side, or server side if the server holds the client models)", "",
           f"TTA-bn ResNet-8 client bank ({result['probe_backend']} backend), M = 64 uniform-noise probes per client, "
           "timed after one batch-statistics pass.", "",
           "| clients | s (all clients) | s per client | peak allocated |", "|---|---|---|---|"]
    for r in result["probe_forward"]:
        peak = r.get("cuda_peak_bytes", r["torch_cpu_peak_bytes"])
        md.append(f"| {r['clients']} | {r['seconds']:.3f} | {r['seconds_per_client']:.4f} | {fmt_bytes(peak)} |")
    ex = result["probe_forward_extrapolated"]
    md += ["", "Linear in N (N x M images through ResNet-8). Extrapolated (least-squares line through the rows above): "
           + ", ".join(f"{k} clients {v:.1f} s" for k, v in ex.items()) + "."]
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--clients", nargs="+", type=int, default=list(CLIENTS))
    ap.add_argument("--large-steps", type=int, default=10, dest="large_steps",
                    help="FedTSA server steps timed at N >= --large-from (the per-step cost is extrapolated to 100)")
    ap.add_argument("--large-from", type=int, default=500, dest="large_from")
    ap.add_argument("--peak-steps", type=int, default=2, dest="peak_steps",
                    help="FedTSA server steps in the profiled round (peak memory)")
    ap.add_argument("--rounds", type=int, default=25, help="rounds of the memory-over-rounds run")
    ap.add_argument("--rounds-clients", type=int, default=20, dest="rounds_clients")
    ap.add_argument("--rounds-server-steps", type=int, default=20, dest="rounds_server_steps",
                    help="FedTSA server steps per round in the memory-over-rounds run (memory does not depend on it)")
    ap.add_argument("--probe-clients", nargs="+", type=int, default=None, dest="probe_clients",
                    help="client counts of the probe-forward measurement (default 10 20 50 on CPU, up to 200 on CUDA)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    device = args.device
    probe_clients = args.probe_clients or ([10, 20, 50, 100, 200] if device.startswith("cuda") else [10, 20, 50])
    model = build_model("resnet8")
    dims = model_dims(model)
    state = bn_state_shapes(model)
    peak_allocation(lambda: torch.ones(1), device)  # first profiler start loads its machinery: not a round's cost
    t_start = time.perf_counter()
    scaling = []
    for n in args.clients:
        for label in STRATEGIES:
            row = scaling_row(label, n, dims, state, device, args.large_steps, args.large_from, args.peak_steps)
            scaling.append(row)
            print(f"N={n:5d} {label:18s} {row.get('round_s_at_default_steps', row['round_s']):9.4f} s/round  "
                  f"held {row['retained_bytes']:>11d} B  peak {row['torch_cpu_peak_bytes']:>11d} B", flush=True)
    rounds = over_rounds(args.rounds_clients, args.rounds, dims, state, device, args.rounds_server_steps)
    print("over rounds done", flush=True)
    probes = [probe_forward_cost(model, n, device=device) for n in probe_clients]
    for r in probes:
        print(f"probe forward N={r['clients']}: {r['seconds']:.3f} s", flush=True)
    points = {r["clients"]: r["seconds"] for r in probes}
    result = {"command": "python benchmarks/server_cost.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
              "device": device, "device_name": device_name(device), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "model": dims,
              "peak_server_steps": args.peak_steps, "large_steps": args.large_steps, "large_from": args.large_from,
              "scaling": scaling, "over_rounds_clients": args.rounds_clients, "over_rounds_rounds": args.rounds,
              "over_rounds_server_steps": args.rounds_server_steps, "over_rounds": rounds,
              "uploads": upload_rows(dims, state), "probe_backend": "vectorized", "probe_forward": probes,
              "probe_forward_extrapolated": {str(n): extrapolate_linear(points, n) for n in (100, 1000)
                                             if n > max(points)},
              "wall_s": round(time.perf_counter() - t_start, 1)}
    write_results(result, "server_cost", device, markdown(result), args.out, indent=1)
    print(f"({result['wall_s']} s)")


if __name__ == "__main__":
    main()
