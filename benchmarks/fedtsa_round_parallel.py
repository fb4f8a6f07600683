"""FedTSA server rounds run two at a time: on two threads of one process (as ``Engine.prefetch`` runs them) or in two
processes, against one round at a time on one thread.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedtsa_round_parallel.py --rounds 6

Synthetic indicators (memory bank full, T = 10, D = 256 as ResNet-8, 20 clients), the paper's defaults (100 Adam
steps, Bernoulli masks); every round on one intra-op thread (``one_torch_thread``, as on a server thread). Reports
seconds per round for each way and the throughput of the two parallel ways relative to one round at a time, and
checks that every way gives the same W. Writes ``results/fedtsa_round_parallel_cpu.json`` / ``.md``.
"""
from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from typing import List, Tuple

import torch

from studies.fedctta.server_cost import fill_indicator_memory
from ftta_core.rng import torch_generator
from ftta_core.strategies.fedtsa import FedTSA, one_torch_thread
from results_io import run_metadata, write_results

CLIENTS, DIM = 20, 256


def _window() -> torch.Tensor:
    strategy = FedTSA()
    strategy.reset(CLIENTS)
    fill_indicator_memory(strategy, CLIENTS, strategy.window, DIM)
    return strategy.memory.ordered()


def rounds(steps: List[int]) -> Tuple[float, List[torch.Tensor]]:
    """Rounds of ``steps`` one after the other on one thread (a fresh strategy: nothing shared with another caller);
    returns (seconds, the W of each)."""
    torch.set_num_threads(1)
    strategy, x = FedTSA(), _window()
    start = time.perf_counter()
    with one_torch_thread():
        weights = [strategy._rounds(x[None], [step])[0].weights for step in steps]
    return time.perf_counter() - start, weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds per worker (each way runs 2 x this many)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    steps = list(range(2 * args.rounds))
    halves = [steps[0::2], steps[1::2]]
    rounds(steps[:1])  # warm-up
    alone_s, alone_w = rounds(steps)
    start = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        thread_out = list(pool.map(rounds, halves))
    thread_s = time.perf_counter() - start
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        list(pool.map(rounds, [steps[:1], steps[:1]]))  # start-up and warm-up outside the timing
        start = time.perf_counter()
        process_out = list(pool.map(rounds, halves))
        process_s = time.perf_counter() - start
    n = len(steps)

    def same(out) -> bool:
        got = {step: w for half, (_, ws) in zip(halves, out) for step, w in zip(half, ws)}
        return all(torch.equal(got[step], alone_w[i]) for i, step in enumerate(steps))

    rows = [
        {"way": "one at a time, 1 thread", "seconds": round(alone_s, 2), "s_per_round": round(alone_s / n, 3),
         "throughput_vs_alone": 1.0, "w_identical": True},
        {"way": "two threads of one process", "seconds": round(thread_s, 2), "s_per_round": round(thread_s / n, 3),
         "throughput_vs_alone": round(alone_s / thread_s, 2), "w_identical": same(thread_out),
         "s_per_round_per_worker": [round(s / len(h), 3) for (s, _), h in zip(thread_out, halves)]},
        {"way": "two processes", "seconds": round(process_s, 2), "s_per_round": round(process_s / n, 3),
         "throughput_vs_alone": round(alone_s / process_s, 2), "w_identical": same(process_out),
         "s_per_round_per_worker": [round(s / len(h), 3) for (s, _), h in zip(process_out, halves)]},
    ]
    meta = run_metadata("cpu")
    md = [f"Measured with `{meta['command']}` on {meta['device_name']}, torch {meta['torch']}, {meta['date']}, "
          f"commit {meta['commit']}, load average before the call {meta['load_average']}; {n} rounds per way "
          f"({CLIENTS} clients, D = {DIM}, 100 Adam steps each, one intra-op thread per round).", "",
          "| way | seconds | s per round | throughput vs one at a time | W identical |", "|---|---|---|---|---|"]
    md += [f"| {r['way']} | {r['seconds']} | {r['s_per_round']} | {r['throughput_vs_alone']}x | {r['w_identical']} |"
           for r in rows]
    write_results({**meta, "rounds": n, "clients": CLIENTS, "dim": DIM, "rows": rows}, "fedtsa_round_parallel",
                  "cpu", "\n".join(md) + "\n")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
