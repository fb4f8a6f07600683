"""Where one steady-state FedTSA server round spends its time, part by part (no profiler overhead).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedtsa_round_parts.py --clients 20 --rounds 3 --threads 1

Synthetic indicators (memory bank full, T = 10, D = 256 as ResNet-8), the paper's defaults (100 Adam steps, Bernoulli
masks); each part of ``FedTSA._iteration`` (the projection, both passes stacked with their masks, the losses and
their gradient, the hand-derived backward) and the optimiser step is timed with ``perf_counter`` and summed over a
round. Prints seconds per round per part (mean over ``--rounds``).
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from ftta_core.rng import torch_generator
from studies.fedctta.server_cost import fill_indicator_memory
from ftta_core.strategies.fedtsa import FedTSA, _IterationMasks, round_mse
from ftta_core.strategies.ts_block import bernoulli_uniforms, similarity_mask


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    strategy = FedTSA()
    strategy.reset(args.clients)
    fill_indicator_memory(strategy, args.clients, strategy.window, args.dim)
    x = strategy.memory.ordered()
    seconds: dict = defaultdict(float)

    def tick(part: str, start: float) -> float:
        now = time.perf_counter()
        seconds[part] += now - start
        return now

    for r in range(args.rounds):
        generator = torch_generator(0, "fedtsa-parts", r)
        block = strategy._new_block(args.dim, x.device)
        optimizer = torch.optim.Adam(block.parameters(), lr=strategy.lr, fused=True)
        current = similarity_mask(x[-1])
        temporal_u, spatial_u = bernoulli_uniforms(strategy.server_steps, args.clients, x.shape[0], True, generator)
        for it in range(strategy.server_steps):
            with torch.no_grad():
                t = time.perf_counter()
                projections = block.project(x)
                t = tick("projection", t)
                masks = _IterationMasks(strategy, current, None, (temporal_u[it], spatial_u[it]))
                passes = block.forward_passes(x, mask_mode=strategy.mask_mode, augment=masks,
                                              projections=projections)
                t = tick("passes + masks", t)
                out, aug = passes.output[:x.shape[0]], passes.output[x.shape[0]:]
                loss = round_mse(out, x) + strategy.lam * round_mse(out, aug)
                c = 2.0 / x.numel()
                grad = torch.cat([c * (out - x) + strategy.lam * c * (out - aug), -strategy.lam * c * (out - aug)])
                t = tick("losses + dL/dX_TSA", t)
                block.backward_passes(passes, grad)
                t = tick("backward", t)
                optimizer.step()
                tick("adam", t)
    per_round = {k: v / args.rounds for k, v in seconds.items()}
    for part, s in per_round.items():
        print(f"{part:>15}: {s:.3f} s per round")
    print(f"{'total':>15}: {sum(per_round.values()):.3f} s per round ({args.clients} clients, {args.threads} threads)")


if __name__ == "__main__":
    main()
