"""Every study of this repository on the command line (``python -m ftta_core study PAPER ACTION``), registered by
``ftta.studies`` entry points in ``pyproject.toml`` that name the ``Study`` objects here: each paper's actions (its
folder's ``commands``) with its claims, the continual single-client benchmark (``centralized``) and the README's
generated results block (``results``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict

from ftta_core.cli_config import key_values
from ftta_core.study_registry import Study, StudyAction
from studies.anchored import commands as anchored
from studies.common import passthrough, shared_options, write_markdown
from studies.fedacross import commands as fedacross
from studies.fedctta import commands as fedctta
from studies.fedicon import commands as fedicon
from studies.fedtsa import commands as fedtsa
from studies.pfedbbn import commands as pfedbbn


def _centralized_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", nargs="+", help="local methods (default: those of the benchmark that are registered: "
                                                "source bn tent eata cotta rotta roid)")
    p.add_argument("--images", type=int, default=10000, help="images per corruption")
    shared_options(p, ("dataset", "batch_size", "severity", "corruptions", "seed", "device", "backend"),
                   batch_size=200)
    p.add_argument("--param", action="append", metavar="METHOD.K=V", help="a method parameter (repeatable)")
    p.add_argument("--table", type=Path, required=True, help="output stem: writes STEM.csv and STEM.md")


def _centralized(args: argparse.Namespace) -> int:
    from ftta_core.tta import LOCAL_METHODS
    from ftta_core.workbook import markdown_table
    from studies.centralized import BENCHMARK_METHODS, beside_reference, per_corruption_beside, run_centralized

    methods = args.methods or [m for m in BENCHMARK_METHODS if m in LOCAL_METHODS]
    skipped = [] if args.methods else [m for m in BENCHMARK_METHODS if m not in LOCAL_METHODS]
    overrides: Dict[str, Dict[str, Any]] = {}
    for key, value in key_values(args.param, "--param").items():
        if "." not in key:
            raise SystemExit(f"--param expects METHOD.KEY=VALUE, got {key!r}")
        method, name = key.split(".", 1)
        overrides.setdefault(method, {})[name] = value
    try:
        table = run_centralized(methods, args.dataset, args.images, args.batch_size, args.severity, args.corruptions,
                                args.seed, args.device, args.backend, overrides, progress=True)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.table.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.table.with_suffix(".csv"), index=False)
    write_markdown(args.table.with_suffix(".md"), (
          "Error (%) of the prediction made while adapting, one client, continual, "
          f"severity {args.severity}, batch {args.batch_size}, {args.images} images per corruption, seed {args.seed}. "
          "Reference: WRN-28 continual benchmark (data/paper_numbers/tta_benchmark_cifar10c.csv)."
          + (f" Not registered, skipped: {', '.join(skipped)}." if skipped else "") + "\n\n"
          + markdown_table(beside_reference(table)) + "\nPer corruption (reference: Tent README, WRN-28):\n\n"
          + markdown_table(per_corruption_beside(table))))
    return 0


CENTRALIZED = Study("centralized", "local TTA methods as one client over the corruptions in sequence (the continual "
                                   "benchmark's protocol)", {
    "table": StudyAction(
        "run the local methods as one continual client and tabulate their errors", _centralized_arguments,
        _centralized,
        "Continual single-client sanity check (the test-time-adaptation benchmark's protocol: corruptions in order "
        "at one severity, batch 200, no reset): runs each method with strategy 'local' and writes STEM.csv (error "
        "per method and corruption) and STEM.md (mean errors beside the published WRN-28 numbers)."),
})

RESULTS = Study("results", "the README's results block, generated from the stored runs", {
    "readme": passthrough("studies.results_summary", "regenerate (or --check) the README's results block"),
})


def claims_action(paper: str) -> StudyAction:
    """Print the workbook's claims whose source names ``paper`` (``results_summary.workbook_claims``: the verdicts of
    ``ftta_core.stats``), with the counts per cell class. Reads stored runs; runs nothing."""
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("--csv", type=Path, help="also write the rows to this CSV file")

    def run(args: argparse.Namespace) -> int:
        from ftta_core import stats
        from studies.results_summary import workbook_claims

        table = workbook_claims()
        mine = table[table["source"].astype(str).str.contains(paper, regex=False)]
        if args.csv:
            mine.to_csv(args.csv, index=False)
        columns = ["claim", "cell", "cell class", "paper", "ours", "low", "high", "seeds", "verdict"]
        print(mine[[c for c in columns if c in mine]].to_string(index=False))
        print()
        print(stats.count_by_class(mine).to_string())
        return 0

    return StudyAction(f"{paper}'s claims beside ours, with the statistics module's verdicts (stored runs)", add, run)


def _paper(commands, claims: str = "") -> Study:
    """A paper's ``Study``: its folder's actions, and its claims' (``claims``: the claim rows' source prefix)."""
    name = commands.__name__.split(".")[1]
    return Study(name, commands.SUMMARY, {**commands.ACTIONS, **({"claims": claims_action(claims)} if claims else {})})


FEDTSA = _paper(fedtsa, "FedTSA")
FEDCTTA = _paper(fedctta, "FedCTTA")
PFEDBBN = _paper(pfedbbn, "pFedBBN")
FEDICON = _paper(fedicon)
FEDACROSS = _paper(fedacross)
ANCHORED = _paper(anchored)
