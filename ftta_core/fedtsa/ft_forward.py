"""FedAvg+FT as the reference clients' code reports it, measured on our stored FedAvg+FT runs.

In the reference code (rajibrhasan/FedCTTA, the Fling clients' ``adapt``, e.g. ``fedpl_client``) FedAvg+FT's accuracy
is what the second ``adapt`` call of a step reports: the mixed model's outputs in train mode (each BN layer
normalising with the batch's own statistics), computed *before* that call's optimiser step. FedAvg's accuracy comes
from ``inference()`` in eval mode (running statistics), as ours does. Our FedAvg+FT predicts after the extra step, in
eval mode (``Engine.server_phase``).

``ft_forward_run`` re-runs one stored FedAvg+FT run unchanged, with the local method wrapped so that the logits of
every ``adapt`` call are kept (``AdaptOutputs``; the engine sees the same method and draws nothing more), and records
per step and client both readings: ``correct_mixed`` (ours, which must equal the stored run's) and
``correct_ft_forward`` (the reference code's). A run folder is written slot by slot (``experiment.RunWriter``), so a
crash leaves a resumable run; the finished summary is stored beside the stored runs it re-ran (``ft_forward_table``
reads them)::

    python -m ftta_core.fedtsa.ft_forward --setting niid --seeds 0 1 2
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pandas as pd
import torch

from ..build import build_run, code_record
from ..experiment import ExperimentConfig, RunWriter, summarize
from ..paper import METHOD_LABELS, paper_table
from ..runstore import RunLock, atomic_write_text, code_record_of, read_summary, run_status
from ..units import merge_records
from .table1 import _matches_column, stored_table1_runs, table1_config

RESULTS_DIR = Path(__file__).resolve().parents[2] / "figures" / "fedtsa_table1"
MODULE = "ftta_core.fedtsa.ft_forward"  # recorded by name: run as a script, ``__name__`` is "__main__"
READING = "correct_ft_forward"  # the column of the reference code's reading
SEEDS = (0, 1, 2, 3, 4)  # the seeds a reading is looked for
# the definitions of this module that compute a reading (recorded with the run's units; the rest finds and tabulates)
RECORDED = ("READING", "AdaptOutputs", "ft_forward_run")


class AdaptOutputs:
    """A local method as it is, keeping the argmax of each ``adapt`` call's logits (``calls``, cleared by the
    caller); every other attribute is the wrapped method's."""

    def __init__(self, local) -> None:
        self.__dict__["_local"] = local
        self.__dict__["calls"] = []

    def __getattr__(self, name: str):
        return getattr(self._local, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self._local, name, value)

    def adapt(self, bank, x, regularizer=None):
        out = self._local.adapt(bank, x, regularizer)
        self.calls.append(out.logits.detach().argmax(-1).cpu())
        return out


def ft_forward_run(cfg: ExperimentConfig, out: Path | str, data_root: Optional[str] = None,
                   progress: bool = False) -> dict:
    """Run FedAvg+FT config ``cfg`` in folder ``out`` (resumed if interrupted, read back if finished) keeping the
    reference code's reading of each step: its summary, with ``accuracy_ft_forward`` beside ``accuracy``."""
    if cfg.strategy != "fedavg_ft":
        raise ValueError(f"ft_forward_run: strategy must be fedavg_ft, got {cfg.strategy!r}")
    out = Path(out)
    with RunLock(out):
        writer = RunWriter(out, cfg)
        if writer.finished():
            return read_summary(writer.summary_json)
        code = record_scope(cfg)
        with build_run(cfg, data_root=data_root) as run:
            engine, recorder = run.engine, run.recorder()
            probe = AdaptOutputs(engine.local)
            engine.local = probe
            start, recorder.rows, recorder.weights = writer.resume(engine)
            recorder.classes, recorder.upload_bytes = writer.classes, writer.upload_bytes
            t0 = time.perf_counter()
            for t in run.steps(start, progress=progress):
                batch = run.stream.batch(t)
                probe.calls.clear()
                recorder.add(engine.step(batch))
                if len(probe.calls) != 2:
                    raise RuntimeError(f"step {t}: expected 2 adapt calls (local, after mixing), saw {len(probe.calls)}")
                correct = (probe.calls[1] == batch.labels.cpu()).sum(1)
                for row in recorder.slot_rows[-engine.n_clients:]:
                    row[READING] = int(correct[row["client"]])
                if recorder.slot_done(t, run.n_steps):
                    writer.commit(engine, t + 1, recorder.slot_rows, recorder.slot_weights, recorder.classes,
                                  recorder.upload_bytes)
                    recorder.close_slot()
        table = recorder.table()
        summary = summarize(table, cfg, time.perf_counter() - t0, run.device, recorder.upload_bytes,
                            recorder.classes, engine.rounds_ahead_threads, code)
        summary["accuracy_ft_forward"] = 100.0 * float(table[READING].sum()) / float(table["n"].sum())
        writer.finish(table, recorder.collaboration(), summary)
    return summary


def record_scope(cfg: ExperimentConfig) -> Dict[str, object]:
    """The code record of a reading of ``cfg`` (the run's units and this module's), as ``ft_forward_run`` writes
    it; ``python -m ftta_core runs --migrate`` re-scopes older readings to it (``record_migration.study_scope``)."""
    return merge_records(code_record(cfg.local, cfg.strategy, cfg),
                         code_record_of([], [f"{MODULE}:{name}" for name in RECORDED]))


def is_record(data: object) -> bool:
    """Whether a stored JSON document is a reading ``ft_forward_run`` wrote (a run summary with the reference
    code's reading beside its accuracy)."""
    return isinstance(data, dict) and {"config", "code", "accuracy_ft_forward"} <= data.keys()


def stored_ft_runs(results_dir: Path | str, setting: str, seeds: Sequence[int], tta: str = "grad-running-adam",
                   lr: Optional[float] = 3e-4, dataset: str = "cifar10") -> Dict[int, Path]:
    """The stored FedAvg+FT runs of one Table 1 column (``tta`` at step ``lr``) by seed: the runs to re-run."""
    base = table1_config(dataset, setting, tta, lr=lr).to_dict()
    found = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        config = read_summary(path).get("config", {})
        if _matches_column(config, base, ["fedavg_ft"], list(seeds)):
            found[config["seed"]] = path
    return found


def ft_forward_table(results_dir: Path | str = RESULTS_DIR / "runs", readings_dir: Path | str = RESULTS_DIR / "ft_forward",
                     settings: Sequence[str] = ("niid", "iid"), tta: str = "grad-running-adam",
                     lr: Optional[float] = 3e-4) -> pd.DataFrame:
    """Per (setting, seed) with a stored reading: the stored FedAvg+FT and FedAvg accuracies, our re-run's (equal to
    the stored FedAvg+FT's when nothing changed), the reference code's reading and both differences from FedAvg."""
    rows: List[dict] = []
    for setting in settings:
        grid = stored_table1_runs(results_dir, ["fedavg"], list(SEEDS), "cifar10", (tta,), (setting,), lr=lr)
        fedavg = grid.set_index("seed")["accuracy"] if len(grid) else pd.Series(dtype=float)
        for seed, path in stored_ft_runs(results_dir, setting, SEEDS, tta, lr).items():
            reading = Path(readings_dir) / path.name
            if not reading.exists():
                continue
            stored, again = read_summary(path), read_summary(reading)
            rows.append({"setting": setting, "seed": seed, "FedAvg": fedavg.get(seed),
                         "FedAvg+FT (stored)": stored["accuracy"], "FedAvg+FT (re-run)": again["accuracy"],
                         "FedAvg+FT (reference reading)": again["accuracy_ft_forward"],
                         "code": run_status(again)})
    table = pd.DataFrame(rows, columns=["setting", "seed", "FedAvg", "FedAvg+FT (stored)", "FedAvg+FT (re-run)",
                                        "FedAvg+FT (reference reading)", "code"])
    table["ours - FedAvg"] = table["FedAvg+FT (re-run)"] - table["FedAvg"]
    table["reference reading - FedAvg"] = table["FedAvg+FT (reference reading)"] - table["FedAvg"]
    return table


def ft_forward_summary(table: pd.DataFrame) -> pd.DataFrame:
    """``ft_forward_table`` per setting: both differences from FedAvg (mean, sd, seeds) beside the paper's
    FedAvg+FT - FedAvg (FedTSA Table 1, TTA-grad)."""
    table1 = paper_table("fedtsa_table1")
    paper = table1[table1.dataset == "cifar10"].set_index(["method", "setting", "tta"])["mean"]
    ft, avg = METHOD_LABELS["fedavg_ft"], METHOD_LABELS["fedavg"]
    rows = []
    for setting, g in table.dropna(subset=["FedAvg"]).groupby("setting", sort=False):
        for column in ("ours - FedAvg", "reference reading - FedAvg"):
            rows.append({"setting": setting, "FedAvg+FT - FedAvg": column.split(" - ")[0], "mean": g[column].mean(),
                         "sd": g[column].std(ddof=1) if len(g) > 1 else float("nan"), "seeds": len(g),
                         "paper": paper[(ft, setting, "grad")] - paper[(avg, setting, "grad")]})
    return pd.DataFrame(rows, columns=["setting", "FedAvg+FT - FedAvg", "mean", "sd", "seeds", "paper"])


def ft_forward_reading(table: pd.DataFrame, summary: pd.DataFrame) -> str:
    """``ft_forward_table`` / ``ft_forward_summary`` in sentences: whether every re-run equals its stored run, and per
    setting both differences from FedAvg beside the paper's, with which of the two is nearer to it."""
    if table.empty:
        return "No FedAvg+FT run has its reference reading stored yet."
    same = int((table["FedAvg+FT (re-run)"] == table["FedAvg+FT (stored)"]).sum())
    parts = [f"{same} of {len(table)} re-runs give exactly the stored FedAvg+FT accuracy"
             + ("." if same == len(table) else "; the others differ from it (`code` says whether the code that made "
                                                    "them changed since).")]
    for setting, g in summary.groupby("setting", sort=False):
        ours, ref = (g[g["FedAvg+FT - FedAvg"] == k].iloc[0] for k in ("ours", "reference reading"))
        gap_ours, gap_ref = abs(ours["mean"] - ours["paper"]), abs(ref["mean"] - ref["paper"])
        nearer = "the reference reading" if gap_ref < gap_ours else "ours"
        parts.append(f"{setting.upper()} ({int(ours['seeds'])} seed(s)): FedAvg+FT - FedAvg is {ours['mean']:+.2f} "
                     f"as we predict and {ref['mean']:+.2f} as the reference code reports it, the paper "
                     f"{ours['paper']:+.2f}; {nearer} is nearer the paper's (by {abs(gap_ours - gap_ref):.2f} points).")
    return " ".join(parts)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ftta_core.fedtsa.ft_forward", description=__doc__.split("\n")[0])
    parser.add_argument("--setting", choices=("niid", "iid"), required=True)
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--results-dir", default=str(RESULTS_DIR / "runs"), help="the stored FedAvg+FT runs")
    parser.add_argument("--out-dir", default=str(RESULTS_DIR / "ft_forward"), help="where the readings go")
    parser.add_argument("--work-dir", default="runs/ft_forward", help="resumable run folders")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    runs = stored_ft_runs(args.results_dir, args.setting, args.seeds)
    missing = sorted(set(args.seeds) - set(runs))
    if missing:
        raise SystemExit(f"no stored FedAvg+FT run of {args.setting} seed(s) {missing} in {args.results_dir}")
    for seed, path in sorted(runs.items()):
        cfg = ExperimentConfig.from_dict(read_summary(path)["config"])
        summary = ft_forward_run(cfg, Path(args.work_dir) / path.stem)
        target = Path(args.out_dir) / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, json.dumps(summary, indent=1, default=float))
        print(f"{args.setting} seed {seed}: FedAvg+FT {summary['accuracy']:.3f} (stored "
              f"{read_summary(path)['accuracy']:.3f}), reference reading {summary['accuracy_ft_forward']:.3f}")


if __name__ == "__main__":
    main()
