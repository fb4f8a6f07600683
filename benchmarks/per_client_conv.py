"""Per-client convolutions (all-parameter Tent, issue 26 target 2): three kernels per ResNet-8 layer, then whole steps.

The vectorized bank runs a convolution whose weight differs per client either as one grouped convolution
('grouped', the default) or one convolution per client ('split', what the loop bank computes). A third kernel is
measured here before it is landed in ``ftta_core/engine/layers.py``: 'unfold', the convolution as im2col
(``F.unfold``) and one batched matmul per client (``torch.bmm``; a strided 1x1 convolution as a strided slice and
bmm), whose backward is two batched matmuls. And 'hybrid': per layer the kernel this script's per-layer table found
fastest on this machine's shapes (a static rule by layer shape, so a run is reproducible).

1. Per layer of the ResNet-8 at the protocol's shape (20 clients x 10 images): forward + backward of each kernel,
   timed in alternation (median of ``--repeats``), outputs and gradients checked against 'split' (1e-4).
2. Whole engine steps of all-parameter Tent (SGD 1e-4) + FedAvg: the loop bank and the vectorized bank with
   'grouped', 'unfold' and 'hybrid' per-client convolutions (the two new ones patched in by this script), in
   alternation; predictions of one step compared with the loop bank.

    python benchmarks/per_client_conv.py [--device cpu] [--repeats 9] [--steps 3] [--rounds 2]
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F

from engine_backends import batches
from ftta_core.engine.layers import ClientConv2d
from ftta_core.loop import Engine
from ftta_core.models import build_model
from ftta_core.strategies import build_strategy
from ftta_core.tta import build_local
from results_io import device_name, write_results

TENT_ALL = ("tent", {"params": "all", "optimizer": "sgd", "lr": 1e-4})


def conv_unfold(x: torch.Tensor, w: torch.Tensor, stride, padding) -> torch.Tensor:
    """im2col and one batched matmul per client: [N, B*L, C*k*k] @ [N, C*k*k, C_out]."""
    n, co, c, kh, kw = w.shape
    nb, _, h, ww = x.shape
    b = nb // n
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    ph, pw = (padding, padding) if isinstance(padding, int) else padding
    ho, wo = (h + 2 * ph - kh) // sh + 1, (ww + 2 * pw - kw) // sw + 1
    if (kh, kw) == (1, 1) and (ph, pw) == (0, 0):  # a 1x1 convolution: a strided slice, no im2col
        cols = x[:, :, ::sh, ::sw].reshape(n, b, c, ho * wo).transpose(2, 3).reshape(n, b * ho * wo, c)
    else:
        cols = F.unfold(x, (kh, kw), 1, (ph, pw), (sh, sw))  # [NB, C*k*k, L]
        cols = cols.view(n, b, c * kh * kw, ho * wo).transpose(2, 3).reshape(n, b * ho * wo, c * kh * kw)
    out = torch.bmm(cols, w.reshape(n, co, -1).transpose(1, 2))  # [N, B*L, C_out]
    return out.view(n, b, ho * wo, co).permute(0, 1, 3, 2).reshape(nb, co, ho, wo)


def hybrid_kernel(in_channels: int, out_positions: int, kernel: int) -> str:
    """The per-layer rule 'hybrid' uses (from the per-layer table of a CPU run): im2col + bmm for 1x1 kernels and
    for small outputs (<= 16 positions, i.e. 4x4 maps and below), one convolution per client for the image stem
    (3 input channels, no input gradient), the grouped convolution otherwise."""
    if kernel == 1 or out_positions <= 16:
        return "unfold"
    return "split" if in_channels <= 4 else "grouped"


KERNELS = ("split", "grouped", "unfold")  # 'split' and 'grouped' are ClientConv2d's own; 'unfold' is patched in


def patched_forward(self: ClientConv2d, x: torch.Tensor) -> torch.Tensor:
    """``ClientConv2d.forward`` with 'unfold' and 'hybrid' added (bias-free per-client convolutions, as ResNet-8's);
    'grouped' and 'split' (and a 'hybrid' layer that resolves to them) run the engine's own code."""
    kernel = self.kernel
    if not self.per_client or kernel not in ("unfold", "hybrid") or self.bias is not None:
        return ORIGINAL_FORWARD(self, x)
    if kernel == "hybrid":
        k = self.weight.shape[-1]
        h = (x.shape[-1] + 2 * self.padding[0] - k) // self.stride[0] + 1
        kernel = hybrid_kernel(x.shape[1], h * h, k)
    if kernel == "unfold":
        return conv_unfold(x, self.weight, self.stride, self.padding)
    self.kernel = kernel
    try:
        return ORIGINAL_FORWARD(self, x)
    finally:
        self.kernel = "hybrid"


ORIGINAL_FORWARD = ClientConv2d.forward


def layer_table(device: str, n: int, b: int, repeats: int) -> List[dict]:
    """Forward + backward ms of each kernel on every convolution shape of the ResNet-8 (per-client weights)."""
    model = build_model("resnet8")
    shapes = []
    x = torch.rand(b, 3, 32, 32)
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: shapes.append((name, m, i[0].shape)))
             for name, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)]
    model(x)
    for h in hooks:
        h.remove()
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, conv, in_shape in shapes:
        c, hw = in_shape[1], in_shape[-1]
        x = torch.rand(n * b, c, hw, hw, generator=gen).to(device).requires_grad_(c != 3)  # images need no gradient
        w = (0.1 * torch.randn(n, *conv.weight.shape, generator=gen)).to(device).requires_grad_(True)
        layer = ClientConv2d(conv, n, per_client=True).to(device)
        del layer.weight
        layer.weight = w  # the benchmark's weights: gradients flow to ``w``

        def run(kernel: str) -> torch.Tensor:
            layer.kernel = kernel
            return layer(x)

        wrt = [t for t in (x, w) if t.requires_grad]
        ref = run("split")
        g = torch.randn(ref.shape, generator=gen).to(device)
        ref_grads = torch.autograd.grad(ref, wrt, g)
        times: Dict[str, list] = {k: [] for k in KERNELS}
        for k in KERNELS:  # agreement with the per-client convolution
            out = run(k)
            grads = torch.autograd.grad(out, wrt, g)
            assert torch.allclose(out, ref, atol=1e-4, rtol=1e-4), (name, k)
            assert all(torch.allclose(a, r, atol=1e-3, rtol=1e-4) for a, r in zip(grads, ref_grads)), (name, k)
        for _ in range(repeats):
            for k in KERNELS:
                t0 = time.perf_counter()
                out = run(k)
                torch.autograd.grad(out, wrt, g)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                times[k].append(1e3 * (time.perf_counter() - t0))
        ho = out.shape[-1]
        row = {"layer": name, "in": f"{c}x{hw}x{hw}", "weight": "x".join(map(str, conv.weight.shape)),
               "out_positions": ho * ho, **{f"{k}_ms": round(statistics.median(v), 2) for k, v in times.items()}}
        row["fastest"] = min(KERNELS, key=lambda k: row[f"{k}_ms"])
        row["hybrid_rule"] = hybrid_kernel(c, ho * ho, conv.weight.shape[-1])
        rows.append(row)
        print(row, flush=True)
    return rows


def make_engine(backend: str, device: str, n: int, kernel: str | None) -> Engine:
    torch.manual_seed(0)
    engine = Engine(build_model("resnet8").eval(), build_local(TENT_ALL[0], **TENT_ALL[1]), build_strategy("fedavg"),
                    n, backend, device)
    for m in engine.bank.module.modules() if backend == "vectorized" else []:
        if isinstance(m, ClientConv2d):
            m.kernel = kernel
    return engine


def step_table(device: str, n: int, steps: int, rounds: int) -> Tuple[Dict[str, float], Dict[str, bool]]:
    """Steps/s of the loop bank and of the vectorized bank with each per-client kernel, timed in alternation after
    one warm-up step; the first step's predictions of every engine compared with the loop bank's."""
    data = batches(n, 10, 1 + steps * rounds, device)
    engines = {"loop": make_engine("loop", device, n, None),
               **{k: make_engine("vectorized", device, n, k) for k in ("grouped", "unfold", "hybrid")}}
    first = {k: e.step(data[0]) for k, e in engines.items()}
    agreement = {}
    for k in engines:  # correct counts per client, before and after mixing, of the warm-up step
        same = [(first[k].correct_local == first["loop"].correct_local).all(),
                (first[k].correct_mixed == first["loop"].correct_mixed).all()]
        agreement[k] = bool(all(same))
    print(f"first step's correct counts equal to the loop bank's: {agreement}", flush=True)
    total = {k: 0.0 for k in engines}
    for r in range(rounds):
        chunk = data[1 + r * steps: 1 + (r + 1) * steps]
        for k, e in engines.items():
            t0 = time.perf_counter()
            for batch in chunk:
                e.step(batch)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            total[k] += time.perf_counter() - t0
    for e in engines.values():
        e.close()
    return {k: rounds * steps / v for k, v in total.items()}, agreement


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    ClientConv2d.forward = patched_forward
    layers = layer_table(args.device, args.clients, 10, args.repeats)
    speeds, agreement = step_table(args.device, args.clients, args.steps, args.rounds)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    command = "python benchmarks/per_client_conv.py " + " ".join(sys.argv[1:])
    result = {"command": command, "date": datetime.date.today().isoformat(), "commit": commit, "device": args.device,
              "device_name": device_name(args.device), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "load_average_at_end": load, "clients": args.clients, "layers": layers,
              "steps_per_s": {k: round(v, 4) for k, v in speeds.items()}, "first_step_counts_equal_loop": agreement,
              "ratios": {f"{k} / loop": round(v / speeds["loop"], 2) for k, v in speeds.items() if k != "loop"}}
    totals = {k: round(sum(r[f"{k}_ms"] for r in layers), 1) for k in KERNELS}
    totals["hybrid"] = round(sum(r[f"{r['hybrid_rule']}_ms"] for r in layers), 1)
    result["layer_totals_ms"] = totals
    md = [f"Measured with `{command}` on {result['device_name']} ({result['threads']} threads), torch "
          f"{torch.__version__}, {result['date']}, commit {commit}, load average at the end {' '.join(load)}; "
          f"{args.clients} clients x batch 10, ResNet-8, per-client weights (all-parameter Tent).", "",
          "Forward + backward per layer (ms, median of the alternated repeats):", "",
          "| layer | input | weight | output positions | split | grouped | unfold | fastest | hybrid uses |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in layers:
        md.append(f"| {r['layer']} | {r['in']} | {r['weight']} | {r['out_positions']} | {r['split_ms']} | "
                  f"{r['grouped_ms']} | {r['unfold_ms']} | {r['fastest']} | {r['hybrid_rule']} |")
    md.append(f"| all layers | | | | {totals['split']} | {totals['grouped']} | {totals['unfold']} | | "
              f"{totals['hybrid']} |")
    md += ["", "Whole steps (all-parameter Tent, SGD 1e-4, FedAvg; steps/s, alternated):", "",
           "| bank | steps/s | / loop | first step's correct counts equal the loop bank's |", "|---|---|---|---|"]
    for k, v in speeds.items():
        md.append(f"| {k if k == 'loop' else 'vectorized, ' + k} | {v:.3f} | {v / speeds['loop']:.2f}x | "
                  f"{agreement[k]} |")
    write_results(result, "per_client_conv", args.device, "\n".join(md) + "\n", args.out)


if __name__ == "__main__":
    main()
