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
crash leaves a resumable run. FedTSA's study finds the stored runs to re-run, stores the readings and tabulates them
(``studies.fedtsa.ft_forward``)::

    python -m studies.fedtsa.ft_forward --setting niid --seeds 0 1 2
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, Optional

from ..build import build_run, code_record
from ..experiment import ExperimentConfig, RunWriter, summarize
from ..runstore import RunLock, code_record_of, read_summary
from ..units import merge_records

MODULE = "ftta_core.fedtsa.ft_forward"  # recorded by name: run as a script, ``__name__`` is "__main__"
READING = "correct_ft_forward"  # the column of the reference code's reading
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
