"""FedTSA's study on the command line (``python -m ftta_core study fedtsa ACTION``; ``studies.commands`` registers it)."""
from __future__ import annotations

import argparse
from pathlib import Path

from typing import Callable

from ftta_core.study_registry import StudyAction
from studies.common import TTA_CHOICES, passthrough, shared_options, write_markdown


def _table_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tta", choices=list(TTA_CHOICES), required=True,
                   help="TTA-bn, TTA-grad (Tent, all params, SGD 1e-4) or a cell of the TTA-grad 2x2: grad-adam "
                        "(Adam 1e-5), grad-running (running BN statistics as the reference clients), grad-running-adam")
    p.add_argument("--strategies", nargs="+", required=True)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--settings", nargs="+", choices=["niid", "iid"], default=["niid", "iid"])
    p.add_argument("--lr", type=float, default=None,
                   help="the TTA-grad cell's step size instead of its own (the step-size axis of grad-cells)")
    shared_options(p, ("dataset", "model", "device", "backend", "max_steps"))
    p.add_argument("--results", type=Path, required=True, help="folder of per-run summaries (cache)")
    p.add_argument("--table", type=Path, required=True, help="output stem: writes STEM.csv and STEM.md")
    p.add_argument("--only-cached", action="store_true", dest="only_cached",
                   help="run nothing: tabulate the runs already stored under --results")


def _table(args: argparse.Namespace) -> int:
    import pandas as pd

    from ftta_core.plan import PLAN_ENV, plan_file
    from ftta_core.workbook import strategy_comparison
    from studies.fedtsa.table1 import beside_fedtsa_table1, table1_config, to_markdown

    frames = []
    for setting in args.settings:
        base = table1_config(args.dataset, setting, args.tta, device=args.device, model=args.model,
                             backend=args.backend, max_steps=args.max_steps, lr=args.lr)
        # under TTA-bn (a stateless local phase) the strategies of a seed share one pass
        g = strategy_comparison(base, args.strategies, args.seeds, results_dir=args.results,
                                only_cached=args.only_cached, progress=True)
        frames.append(g.rename(columns={"variant": "strategy"}).assign(setting=setting))
    grid = pd.concat(frames, ignore_index=True)
    if plan_file() is not None:
        print(f"planned the missing runs in {plan_file()} (${PLAN_ENV}); run them with: "
              f"python -m ftta_core run-plan {plan_file()} --workers N, then re-run this command")
        return 0
    table = beside_fedtsa_table1(grid, args.dataset, args.tta, args.strategies)
    args.table.parent.mkdir(parents=True, exist_ok=True)
    grid.to_csv(args.table.with_suffix(".runs.csv"), index=False)
    table.to_csv(args.table.with_suffix(".csv"), index=False)
    write_markdown(args.table.with_suffix(".md"), to_markdown(table))
    return 0


def _cells_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", type=Path, default=Path("figures/fedtsa_table1/runs"))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--settings", nargs="+", choices=["niid", "iid"], default=["niid", "iid"])
    p.add_argument("--cells", nargs="+", choices=list(TTA_CHOICES[1:]), default=list(TTA_CHOICES[1:]))
    p.add_argument("--lrs", nargs="+", type=float, default=None,
                   help="step sizes to read in each cell (runs made with `table --lr`; default: each cell's own)")
    p.add_argument("--model", default=None, help="source model of the runs (default: the shipped one)")
    p.add_argument("--table", type=Path, required=True, help="output stem: writes STEM.csv and STEM.md")


def _cells(args: argparse.Namespace) -> int:
    from ftta_core.workbook import markdown_table
    from studies.fedtsa.table1 import tta_grad_cells, tta_grad_cells_reading

    table = tta_grad_cells(results_dir=args.results, seeds=args.seeds, settings=args.settings, cells=args.cells,
                           lrs=args.lrs or (None,), model=args.model)
    args.table.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.table.with_suffix(".csv"), index=False)
    write_markdown(args.table.with_suffix(".md"),
                   # the step size is in "optimizer"; "lr" (kept in the CSV) would print as 0.00 at two digits
                   markdown_table(table.drop(columns="lr").set_index(["cell", "setting"])) + "\n"
                   + tta_grad_cells_reading(table) + "\n")
    return 0


def add_case_study_arguments(orders: str) -> Callable[[argparse.ArgumentParser], None]:
    """The case study's options, with the groups' corruption orders of paper ``orders`` ('fedtsa' or 'fedctta') as
    the default."""
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("--tta", choices=["bn", "grad"], default="bn",
                       help="TTA-bn or TTA-grad (Tent, all params, SGD 1e-4)")
        p.add_argument("--strategies", nargs="+",
                       default=["local", "fedavg", "fedamp", "pfedgraph", "fedtsa", "fedctta"],
                       help="names, or name@key=value[,key=value] for a strategy with parameters (e.g. "
                            "fedctta@probe_bn=eval); each run is kept under OUT/<that text>/")
        p.add_argument("--orders", choices=["fedtsa", "fedctta"], default=orders,
                       help="the groups' corruption orders: FedTSA Table 4 (clients 5-7 one corruption ahead) or "
                            "FedCTTA Table III (four ahead)")
        shared_options(p, ("seed", "dataset", "device", "max_steps"))
        p.add_argument("--out", type=Path, required=True, help="folder of the stored runs and the table")
    return add


def run_case_study(args: argparse.Namespace) -> int:
    """Run (or read back) the case study's strategies and write OUT/table.{csv,md}."""
    from ftta_core.experiment import ExperimentConfig
    from ftta_core.workbook import markdown_table, run_stored
    from studies.fedtsa.case_study import case_study_domains, case_study_table
    from studies.paper import TTA_SETTINGS

    scenario = "case_study" if args.orders == "fedtsa" else "case_study_fedctta"
    base = ExperimentConfig(dataset=args.dataset, scenario=scenario, clients=10, batch_size=10,
                            images_per_client=500, severity=5, device=args.device, max_steps=args.max_steps,
                            seed=args.seed, **TTA_SETTINGS[args.tta])
    runs = run_stored(base, args.strategies, args.out)
    table = case_study_table(runs)
    table.to_csv(args.out / "table.csv")
    domains = case_study_domains(next(iter(runs.values())))
    write_markdown(args.out / "table.md", f"Domains per group and slot:\n\n{markdown_table(domains)}\n"
                   f"Accuracy after mixing (%) per group and slot:\n\n{markdown_table(table)}")
    return 0


SUMMARY = "FedTSA (Zhang et al.): Table 1 on CIFAR-10-C, the TTA-grad cells, the case study of Table 4"
ACTIONS = {
    "table": StudyAction(
        "run the Table 1 protocol for some strategies and seeds", _table_arguments, _table,
        "Runs the FedTSA CIFAR-10-C protocol (20 clients, batch 10, 500 images per client and corruption, severity "
        "5, NIID 4-area map and IID) for each strategy and seed, caching every finished run under --results "
        "(resumable), and writes the table beside the paper's numbers (CSV and markdown)."),
    "grad-cells": StudyAction(
        "the TTA-grad 2x2 (BN batch/running x SGD/Adam) from stored runs", _cells_arguments, _cells,
        "Reads the stored Table 1 runs of the four TTA-grad cells (grad, grad-adam, grad-running, "
        "grad-running-adam; run them with `study fedtsa table --tta CELL`) and writes Local(grad) - Local(bn) and "
        "each strategy's gain over Local beside the paper's, with the computed reading (CSV and markdown). Runs "
        "nothing."),
    "case-study": StudyAction(
        "the 10-client, 3-group case study (Table 4)", add_case_study_arguments("fedtsa"), run_case_study,
        "Runs the case study (clients 1-4 walk the corruptions in order, 5-7 one slot ahead, 8-10 in reverse; 500 "
        "images per client and corruption, batch 10, severity 5) for each strategy, keeps each run under "
        "OUT/<strategy>/ (summary, W over time, per-slot accuracies; stored runs are reused) and writes "
        "OUT/table.{csv,md}: accuracy per group and slot."),
    "step-rule": passthrough("studies.fedtsa.step_rule",
                             "the pre-registered TTA-grad step-size rule: its selection runs, then the claims at the "
                             "step it picks on unseen seeds (planned, resumable)"),
    "ft-forward": passthrough("studies.fedtsa.ft_forward",
                              "FedAvg+FT as the reference code reads it, re-run from the stored Table 1 runs"),
}
