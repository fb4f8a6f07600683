"""FedICON's study on the command line (``python -m ftta_core study fedicon ACTION``; ``studies.commands`` registers it)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ftta_core.study_registry import StudyAction
from studies.common import write_markdown


def _table_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", nargs="+", help="methods of ftta_core.fedicon.METHODS (default: Table 1's)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--local-epochs", type=int, default=1, dest="local_epochs")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--tau", type=float, default=0.1)
    p.add_argument("--n-train", type=int, default=300, dest="n_train", help="training images per domain")
    p.add_argument("--n-test", type=int, default=200, dest="n_test", help="test images per domain")
    p.add_argument("--out", type=Path, default=Path("figures/fedicon"))


def _table(args: argparse.Namespace) -> int:
    from ftta_core.fedicon import TABLE1_METHODS, TrainConfig, TTAConfig, digit_covariate_clients, method_table, run_methods
    from ftta_core.fedicon.data import DIGIT_CLIENT_DOMAINS
    from ftta_core.workbook import markdown_table

    try:
        cfg = TrainConfig(rounds=args.rounds, local_epochs=args.local_epochs, lr=args.lr, tau=args.tau,
                          cls_rounds=args.rounds)
        setting = {"name": "digits-covariate", "n_train": args.n_train, "n_test": args.n_test, "severity": 5,
                   "corruptions": "all 15"}
        methods = args.methods or list(TABLE1_METHODS)
        rows = run_methods(args.out / "cache", setting, methods, args.seeds,
                           lambda seed: digit_covariate_clients(args.n_train, args.n_test, seed), "cnn2", cfg,
                           TTAConfig(tau=args.tau))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_markdown(args.out / "table.md", "Accuracy (%) per client (its own digit domain, corrupted), seeds "
                   f"{args.seeds}, {args.rounds} rounds x {args.local_epochs} local epochs.\n\n"
                   + markdown_table(method_table(rows, methods, list(DIGIT_CLIENT_DOMAINS))))
    return 0


SUMMARY = "FedICON (Tan et al.): Table 1's shape on the digit domains under covariate shift"
ACTIONS = {
    "table": StudyAction(
        "FedICON and its baselines on the digit domains under covariate shift", _table_arguments, _table,
        "Train FedICON and the FL/TTA baselines on the digit domains (one client per domain, test sets corrupted at "
        "severity 5) and write the Table 1 shape as OUT/table.md; per-run results are cached under OUT/cache."),
}
