"""FedTSA's server rounds computed ahead on server threads vs in their step, on Table 1's protocol, in one run.

FedTSA's W_t depends only on the frozen source model's indicators, so the engine can hand the server the next
steps' indicators and the rounds (100 Adam steps of the TS-Block each) run on ``--threads`` server threads while
the clients adapt (``Engine.prefetch``; by default every torch thread serves rounds and the clients run on half of
them). Both modes run the same config (Table 1 NIID, TTA-bn or ``--local tent``, seed 0) for
``--steps`` steps with ``--threads`` torch threads, alternately ``--repeats`` times; the script checks that every W
is identical (the accuracy may differ by float rounding, since the clients' thread count differs) and reports
seconds per step, the speed-up and the projected full protocol (750 steps). ``--steps 750 --repeats 1`` times the
full protocol itself. ``--splits 1:1 2:2`` adds modes with explicit server:client thread counts (written to
``results/fedtsa_rounds_ahead_<local>_splits_<device>.*``). ``--rounds-per-batch 1 16`` adds modes ahead with
that many rounds trained as one block (FedTSA's ``rounds_per_batch``; by default 1 on a CPU, 64 on a GPU), written
to ``..._batches_<device>.*``. Batched rounds equal separate ones up to float rounding (on a GPU the rounding can
flip a Bernoulli mask draw, so W moves a little more), so each mode's max |dW| from the in-step W is reported,
and the script fails only when accuracies differ by more than 0.5 points.

    OMP_NUM_THREADS=2 python benchmarks/fedtsa_rounds_ahead.py [--threads 2] [--steps 60] [--repeats 2] [--splits 1:1]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch

from ftta_core.experiment import ExperimentConfig, build_stream, run_experiment
from results_io import device_name, write_results

PROTOCOL_STEPS = 750


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (split between server and clients ahead)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--local", default="bn", choices=["bn", "tent"])
    ap.add_argument("--splits", nargs="*", default=[], metavar="S:C",
                    help="extra modes: S server threads ahead while the clients run on C torch threads")
    ap.add_argument("--rounds-per-batch", nargs="*", type=int, default=[], metavar="R",
                    help="extra modes: the default threads, R rounds trained as one block")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    local_params = {"params": "all", "optimizer": "sgd", "lr": 1e-4} if args.local == "tent" else {}
    cfg = ExperimentConfig(dataset="cifar10", scenario="fedtsa_niid", corruptions="all", severity=5, clients=20,
                           batch_size=10, images_per_client=500, sh=0.2, th=0.02, local=args.local,
                           local_params=local_params, strategy="fedtsa", seed=0, device=args.device,
                           max_steps=args.steps)
    stream = build_stream(cfg, args.device)
    # mode -> (server threads, client threads, rounds per batch); ahead: the default split (Engine.prefetch)
    modes = {"in step": (0, args.threads, 0), "ahead": (None, args.threads, 0)}
    for split in args.splits:
        server, clients = (int(v) for v in split.split(":"))
        modes[f"ahead {server}:{clients}"] = (server, clients, 0)
    for rounds in args.rounds_per_batch:
        modes[f"ahead, {rounds} rounds per batch"] = (None, args.threads, rounds)
    seconds = {mode: [] for mode in modes}
    results = {}
    for _ in range(args.repeats):
        for mode, (server_threads, client_threads, rounds) in modes.items():
            torch.set_num_threads(client_threads)
            mode_cfg = dataclasses.replace(cfg, strategy_params={"rounds_per_batch": rounds})
            t0 = time.perf_counter()
            results[mode] = run_experiment(mode_cfg, stream=stream, server_threads=server_threads)
            seconds[mode].append(time.perf_counter() - t0)
    reference = results["in step"].collaboration
    same_w = all(np.array_equal(reference, r.collaboration) for r in results.values())
    dw = {mode: float(np.abs(reference - r.collaboration).max()) for mode, r in results.items()}
    max_dw = max(dw.values())
    accuracy = {mode: float(r.summary["accuracy"]) for mode, r in results.items()}
    if max(abs(a - accuracy["in step"]) for a in accuracy.values()) > 0.5:  # rounding never moves it this far
        raise SystemExit(f"the modes disagree (max |dW| {dw}, accuracy {accuracy})")
    best = {mode: min(v) for mode, v in seconds.items()}
    result = {"device": args.device, "device_name": device_name(args.device), "threads": args.threads,
              "local": args.local, "steps": args.steps, "repeats": args.repeats,
              "seconds": {m: [round(s, 2) for s in v] for m, v in seconds.items()},
              "ms_per_step": {m: round(1000 * s / args.steps, 1) for m, s in best.items()},
              "projected_protocol_min": {m: round(s / args.steps * PROTOCOL_STEPS / 60, 2) for m, s in best.items()},
              "speedup": {m: round(best["in step"] / b, 2) for m, b in best.items() if m != "in step"},
              "identical_w": same_w, "max_abs_dw": dw, "accuracy": accuracy}
    rows = "\n".join(f"| {m} | {result['ms_per_step'][m]} | {result['projected_protocol_min'][m]} | "
                     f"{result['speedup'].get(m, 1.0)}x | {dw[m]:.1e} | {accuracy[m]:.3f} |" for m in modes)
    markdown = (f"# FedTSA rounds ahead vs in step ({args.device}, {result['device_name']}, {args.threads} threads, "
                f"TTA-{args.local}, {args.steps} steps, best of {args.repeats})\n\n"
                "| server rounds | ms per step | projected 750-step protocol (min) | speed-up | max abs dW vs in step | "
                "accuracy (%) |\n|---|---|---|---|---|---|\n"
                + rows + f"\n\nEvery W identical: {same_w} (max |dW| {max_dw:.2e}).\n")
    print(markdown)
    name = (f"fedtsa_rounds_ahead_{args.local}" + ("_splits" if args.splits else "")
            + ("_batches" if args.rounds_per_batch else ""))
    write_results(result, name, args.device, markdown)


if __name__ == "__main__":
    main()
