"""The anchored clients' quadratic penalties: the library's autograd formula against a fused autograd node (a
rejected alternative, defined here), in one run.

``tentprox``'s proximal term (``tentprox.proximal_term``) and EATA's Fisher term (``eata.ewc_penalty``) run over
every trained parameter of every client: with all of ResNet-8's parameters and 20 clients, tensors of ~1.2M x 20
floats. Their autograd graph (sub, pow, [mul], sum, then the backward of each) makes about twice as many passes over
those tensors as ``_Quadratic`` below (one subtraction and a batched dot product forward, one multiplication
backward), which computes the same penalty and gradient up to float rounding.

1. The penalty alone: forward + backward at the ResNet-8 x 20 clients' stacked shapes, both forms, timed in
   alternation (median of ``--repeats``), without and with a weight (the Fisher).
2. Whole steps: the anchored study's drift-cell configs (``studies.anchored.client_config``: all parameters, running
   BN, Adam 3e-4, Table 1's NIID protocol, seed 0), the prox and Fisher clients with Local, ``--steps`` steps, the
   penalty the library's ("formula") or patched to the fused node ("fused"), alternated for ``--runs`` pairs in
   this process; ms per step (the run's own ``wall_time_s``) and the accuracies.

    python benchmarks/anchored_penalty.py [--steps 15] [--runs 2] [--repeats 7] [--threads 1]

The node stays here, not in the library, while the whole-step ratio (``results/anchored_penalty_cpu.md``) is near
1: the steps' time goes to memory traffic elsewhere. Ratios only: other processes share the CPU (the load average
is reported); absolute times move with them.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional, Tuple

import torch

import ftta_core.tta.eata as eata_module
import ftta_core.tta.tentprox as tentprox_module
from ftta_core.experiment import run_experiment
from ftta_core.models import build_model
from results_io import run_metadata, write_results
from studies.anchored import client_config

N_CLIENTS = 20
Params = Dict[str, torch.Tensor]
CLIENTS = {"prox": "tentprox", "fisher": "eata"}


class _Quadratic(torch.autograd.Function):
    """``sum w * (p - a)^2`` per client row of one stacked tensor [N, ...] (``w`` None: 1), gradient ``2 w (p - a)``
    w.r.t. ``p`` only (``a`` and ``w`` constants)."""

    @staticmethod
    def forward(ctx: Any, p: torch.Tensor, anchor: torch.Tensor, weight: Optional[torch.Tensor]) -> torch.Tensor:
        d = p - anchor
        wd = d if weight is None else weight * d
        ctx.save_for_backward(wd)
        n = p.shape[0]
        return torch.bmm(wd.reshape(n, 1, -1), d.reshape(n, -1, 1)).view(n)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None, None]:
        (wd,) = ctx.saved_tensors
        return (2 * grad).view(-1, *[1] * (wd.dim() - 1)) * wd, None, None


def fused_penalty(params: Params, anchor: Params, weight: Optional[Params] = None) -> torch.Tensor:
    """Per-client ``sum_k sum w_k (theta_k - anchor_k)^2`` [n] through ``_Quadratic``."""
    terms = [_Quadratic.apply(p, anchor[k].to(p.dtype), None if weight is None else weight[k].to(p.dtype))
             for k, p in params.items()]
    return torch.stack(terms).sum(0)


def fused_proximal_term(params: Params, anchor: Params, mu: float) -> torch.Tensor:
    """``tentprox.proximal_term`` through the fused node."""
    return 0.5 * mu * fused_penalty(params, anchor)


def fused_ewc_penalty(params: Params, anchor: Params, fisher: Params, clients: slice) -> torch.Tensor:
    """``eata.ewc_penalty`` through the fused node."""
    return fused_penalty(params, {k: anchor[k][clients] for k in params}, {k: fisher[k][clients] for k in params})


def lever_times(repeats: int) -> Dict[str, float]:
    """Median ms of forward + backward of each form, at the stacked shapes of ResNet-8's parameters x 20 clients."""
    gen = torch.Generator().manual_seed(0)
    shapes = {k: (N_CLIENTS, *v.shape) for k, v in build_model("resnet8").named_parameters()}
    params = {k: torch.randn(s, generator=gen).requires_grad_(True) for k, s in shapes.items()}
    anchor = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
    fisher = {k: torch.rand(s, generator=gen) for k, s in shapes.items()}
    everyone = slice(None)
    cases = {"formula proximal": lambda: tentprox_module.proximal_term(params, anchor, 1.0),
             "fused proximal": lambda: fused_proximal_term(params, anchor, 1.0),
             "formula fisher": lambda: eata_module.ewc_penalty(params, anchor, fisher, everyone),
             "fused fisher": lambda: fused_ewc_penalty(params, anchor, fisher, everyone)}
    times: Dict[str, list] = {k: [] for k in cases}
    for r in range(repeats + 1):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn().sum().backward()
            if r:  # the first round warms up
                times[name].append(1e3 * (time.perf_counter() - t0))
            for p in params.values():
                p.grad = None
    return {k: round(statistics.median(v), 2) for k, v in times.items()}


@contextmanager
def penalty(form: str) -> Iterator[None]:
    """The anchored methods' penalties as ``form`` ('formula': the library's; 'fused') inside the block."""
    saved = tentprox_module.proximal_term, eata_module.ewc_penalty
    if form == "fused":
        tentprox_module.proximal_term, eata_module.ewc_penalty = fused_proximal_term, fused_ewc_penalty
    try:
        yield
    finally:
        tentprox_module.proximal_term, eata_module.ewc_penalty = saved


def whole_steps(steps: int, runs: int) -> Dict[str, dict]:
    """ms per step and accuracy of each client under each form, the forms alternated (the first alternates too)."""
    out: Dict[str, dict] = {}
    for client in CLIENTS:
        cfg = dataclasses.replace(client_config(client, "niid"), strategy="local", max_steps=steps)
        run_experiment(cfg)  # warm-up: the corrupted images, the source cache, the Fisher's images
        rows: Dict[str, list] = {"formula": [], "fused": []}
        for r in range(runs):
            for form in (("formula", "fused") if r % 2 == 0 else ("fused", "formula")):
                with penalty(form):
                    summary = run_experiment(cfg).summary
                rows[form].append({"ms_per_step": round(1e3 * summary["wall_time_s"] / steps, 1),
                                   "accuracy": summary["accuracy"]})
                print(client, form, rows[form][-1], flush=True)
        med = {f: statistics.median(r["ms_per_step"] for r in v) for f, v in rows.items()}
        out[client] = {"runs": rows, "median_ms_per_step": med,
                       "formula_over_fused": round(med["formula"] / med["fused"], 2)}
    return out


def markdown(result: dict) -> str:
    meta, lev = result["meta"], result["levers"]
    lines = [f"Measured with `{meta['command']}` on {meta['device_name']} ({meta['threads']} thread(s)), "
             f"{meta['date']}, commit {meta['commit']}, torch {meta['torch']}, load average {meta['load_average']}.",
             "", "Forward + backward of the penalty alone, ResNet-8's parameters x 20 clients (median ms):", "",
             "| penalty | formula (library) | fused node | formula / fused |", "|---|---|---|---|"]
    for kind in ("proximal", "fisher"):
        a, b = lev[f"formula {kind}"], lev[f"fused {kind}"]
        lines.append(f"| {kind} | {a} | {b} | {a / b:.2f}x |")
    lines += ["", f"Whole drift-cell steps with Local, NIID, seed 0, {result['steps']} steps (median of "
              f"{result['runs']} runs each, alternated):", "",
              "| client | formula ms/step | fused ms/step | formula / fused | accuracy formula | accuracy fused |",
              "|---|---|---|---|---|---|"]
    for client, row in result["whole"].items():
        med = row["median_ms_per_step"]
        acc = {f: row["runs"][f][0]["accuracy"] for f in ("formula", "fused")}
        lines.append(f"| {client} | {med['formula']} | {med['fused']} | {row['formula_over_fused']}x | "
                     f"{acc['formula']:.4f} | {acc['fused']:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = {"steps": args.steps, "runs": args.runs, "levers": lever_times(args.repeats),
              "whole": whole_steps(args.steps, args.runs)}
    result["meta"] = {**run_metadata("cpu"), "threads": args.threads}
    write_results(result, "anchored_penalty", "cpu", markdown(result))


if __name__ == "__main__":
    main()
