"""The TTA-grad step size chosen by a rule stated before its runs, and the claims read at it on unseen seeds.

The drift cell (running BN, Adam 3e-4, ``POST_HOC_STEP``) was picked from four step sizes on seed-0 evidence
about the very claims it then reproduced, so its verdicts are post hoc. This module replaces that choice by a rule
that looks at Local alone, on a stream no claim reads, and was committed before any of its runs existed
(docs/statistics.md, "The step-size rule"):

- **Rule.** In the reference clients' cell (``CELL``: Tent on all parameters, running BN statistics, Adam), on the
  NIID protocol at the held-out seed ``HELD_OUT_SEED``, take the largest step of ``GRID`` at which Local's accuracy
  stays within ``stats.MARGIN`` of Local under TTA-bn at the same seed (``Local(grad) >= Local(bn) - MARGIN``):
  the largest step that does not make a client worse than adapting its BN statistics alone. No strategy's run and
  no paper number enters it.
- **Then** the claims of FedTSA Table 1 and FedCTTA Table I that involve ``REPLICATION_STRATEGIES`` are read at the
  chosen step on ``REPLICATION_SEEDS`` (seeds none of the stored protocol runs used), NIID and IID; the post-hoc
  drift step is run on the same seeds when the rule picks another step, so its verdicts are tested on seeds it was
  not chosen on.

The rule forbids Local from drifting more than ``MARGIN`` below TTA-bn, so the paper's row "Local(grad) below
Local(bn)" at the chosen step is decided by the rule and is not counted as a reproduction.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import pandas as pd

from ftta_core.stats import MARGIN
from studies.fedtsa.table1 import stored_table1_runs

CELL = "grad-running-adam"
# the drift step, chosen after seeing seed 0's claims (post hoc): ``fidelity.DRIFT_STEP`` is (CELL, POST_HOC_STEP)
POST_HOC_STEP = 3e-4
GRID = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
HELD_OUT_SEED = 200
SETTING = "niid"
REPLICATION_SEEDS = (5, 6, 7)
REPLICATION_STRATEGIES = ("local", "fedavg", "fedtsa")
RESULTS_DIR = Path(__file__).resolve().parents[2] / "figures" / "fedtsa_table1" / "runs"


def _accuracy(results_dir: Path | str, tta: str, seed: int, setting: str, strategy: str = "local",
              lr: Optional[float] = None) -> float:
    grid = stored_table1_runs(results_dir, [strategy], [seed], ttas=(tta,), settings=(setting,), lr=lr)
    return float(grid["accuracy"].iloc[0]) if len(grid) else float("nan")


def selection_table(results_dir: Path | str = RESULTS_DIR) -> pd.DataFrame:
    """Local at each step of ``GRID`` on the held-out seed, beside Local under TTA-bn there, and whether the step
    passes the rule (NaN / None where a run is missing)."""
    bn = _accuracy(results_dir, "bn", HELD_OUT_SEED, SETTING)
    rows: List[Dict[str, Any]] = []
    for lr in GRID:
        acc = _accuracy(results_dir, CELL, HELD_OUT_SEED, SETTING, lr=lr)
        ran = not (pd.isna(acc) or pd.isna(bn))
        rows.append({"step": lr, "local (grad)": acc, "local (bn)": bn, "grad - bn": acc - bn,
                     "passes": (acc >= bn - MARGIN) if ran else None})
    return pd.DataFrame(rows)


def chosen_step(results_dir: Path | str = RESULTS_DIR) -> Optional[float]:
    """The step the rule picks, or None while a selection run is missing (the rule needs the whole grid)."""
    table = selection_table(results_dir)
    if table["passes"].isna().any():
        return None
    passing = table.loc[table["passes"].astype(bool), "step"]
    return float(passing.max()) if len(passing) else None


def selection_reading(table: pd.DataFrame) -> str:
    """The rule's outcome in one sentence (computed)."""
    missing = table[table["passes"].isna()]
    if len(missing):
        return (f"The step-size rule has {len(table) - len(missing)} of {len(table)} selection runs (seed "
                f"{HELD_OUT_SEED}, {SETTING.upper()}); it picks no step until all are stored.")
    passing = table[table["passes"].astype(bool)]
    said = ", ".join(f"{r['step']:g}: {r['grad - bn']:+.2f}" for r in table.to_dict("records"))
    if passing.empty:
        return f"No step of the grid keeps Local within {MARGIN:g} points of TTA-bn (Local(grad) - Local(bn): {said})."
    return (f"Local(grad) - Local(bn) on the held-out seed {HELD_OUT_SEED} ({SETTING.upper()}) by step: {said}; the "
            f"largest step within {MARGIN:g} points of TTA-bn is {passing['step'].max():g}.")


def _table_command(tta: str, strategies: Sequence[str], seeds: Sequence[int], setting: str,
                   lr: Optional[float] = None) -> List[str]:
    """A ``study fedtsa table`` command line (as argv) over the stored Table 1 runs."""
    stem = f"runs/step_rule/{tta}{'' if lr is None else f'_{lr:g}'}_{setting}"
    return (["study", "fedtsa", "table", "--tta", tta, "--strategies", *strategies, "--seeds", *map(str, seeds),
             "--settings", setting, "--results", "figures/fedtsa_table1/runs", "--table", stem]
            + ([] if lr is None else ["--lr", f"{lr:g}"]))


def selection_commands() -> List[List[str]]:
    """The runs the rule reads: Local under TTA-bn and at each step of ``GRID`` on the held-out seed."""
    return ([_table_command("bn", ["local"], [HELD_OUT_SEED], SETTING)]
            + [_table_command(CELL, ["local"], [HELD_OUT_SEED], SETTING, lr) for lr in GRID])


def replication_commands(step: float, seeds: Sequence[int] = REPLICATION_SEEDS,
                         strategies: Sequence[str] = REPLICATION_STRATEGIES) -> List[List[str]]:
    """The replication runs, in the order that settles claims soonest on two cores: per setting (NIID first) Local
    under TTA-bn and the cheaper strategies at ``step`` (every one but FedTSA, whose server round makes its runs the
    slowest), then FedTSA, then the same at the post-hoc drift step when the rule picked another one."""
    steps = [step] + ([POST_HOC_STEP] if abs(step - POST_HOC_STEP) > 1e-12 else [])
    cheap = [s for s in strategies if s != "fedtsa"]
    last = [s for s in strategies if s == "fedtsa"]
    out: List[List[str]] = []
    for lr in steps:
        for s in ("niid", "iid"):
            out += ([_table_command("bn", ["local"], seeds, s)] if lr == step else [])
            out.append(_table_command(CELL, cheap, seeds, s, lr))
        out += [_table_command(CELL, last, seeds, s, lr) for s in ("niid", "iid")] if last else []
    return out


def _plan_and_run(commands: Sequence[Sequence[str]], plan: Path, workers: int) -> int:
    """Plan ``commands`` into ``plan`` (``FTTA_PLAN``: nothing runs) and run the plan, ``workers`` processes of one
    thread each (resumable: stored runs are skipped)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "FTTA_PLAN": str(plan)}
    for argv in commands:
        subprocess.run([sys.executable, "-m", "ftta_core", *argv], env=env, check=True, stdout=subprocess.DEVNULL)
    return subprocess.run([sys.executable, "-m", "ftta_core", "run-plan", str(plan), "--workers", str(workers),
                           "--threads", "1"]).returncode


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m studies.fedtsa.step_rule [--workers N]``: the selection runs, the rule, then the replication
    runs at the step it picks (each stage resumable; rerun to continue)."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--plan-dir", type=Path, default=Path("figures/fedtsa_table1"))
    args = p.parse_args(argv)
    rc = _plan_and_run(selection_commands(), args.plan_dir / "step_rule_selection.plan.jsonl", args.workers)
    table = selection_table()
    print(selection_reading(table), flush=True)
    step = chosen_step()
    if rc or step is None:
        return rc or 1
    return _plan_and_run(replication_commands(step), args.plan_dir / "step_rule_replication.plan.jsonl", args.workers)


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["CELL", "GRID", "HELD_OUT_SEED", "SETTING", "REPLICATION_SEEDS", "REPLICATION_STRATEGIES",
           "selection_table", "chosen_step", "selection_reading", "selection_commands",
           "replication_commands", "main"]
