"""What the server could infer from uploads: how well a client's current corruption can be guessed from them.

Every strategy learns something about its clients from what they upload. Here the question is measured directly:
run a stream, keep each client's upload of every kind at every step together with the corruption the client was
seeing, and train a simple classifier (standardised multinomial logistic regression) to guess the corruption from
one upload. Folds are whole (client, slot) stretches (``GroupKFold``), so a guess is never scored on a step whose
neighbours of the same client and slot were in training; other clients seeing the same corruption may be. This is
a probing measure of how much an upload says about the corruption, not an attack the server could run unlabelled.
The chance level is the most frequent corruption's share.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pandas as pd
import torch

from .build import build_run
from .experiment import ExperimentConfig

# what each kind of upload is, and which strategies send it
UPLOAD_KINDS = {
    "bn_stats": "per-layer BN mean and variance (TTA-bn: every strategy mixes them)",
    "indicator": "batch mean of the source model's penultimate features (FedTSA)",
    "feature_mean": "batch mean of the adapted model's penultimate features",
    "logits_mean": "batch mean of the adapted model's logits",
    "probe_logits": "mean logits on the noise probes (FedCTTA)",
}


@dataclass
class CollectedUploads:
    """Uploads of every kind [M, dim] (M = steps x clients) with the domain, client, step and slot of each row."""

    uploads: Dict[str, np.ndarray]
    domains: np.ndarray
    clients: np.ndarray
    steps: np.ndarray
    slots: np.ndarray
    domain_names: tuple


def collect_uploads(cfg: ExperimentConfig, max_steps: Optional[int] = None,
                    data_root: Optional[str] = None) -> CollectedUploads:
    """Run ``cfg`` (on CPU; built by ``build_run``, so the run proceeds as ``run_experiment``'s) and keep the uploads
    that reach the server: every present client's at every step (``max_steps``: at most that many steps).
    An absent client's upload never leaves it (``participation``) and is not collected."""
    from .strategies.base import probe_uploads

    rows: Dict[str, list] = {}
    meta: Dict[str, list] = {"domains": [], "clients": [], "steps": [], "slots": []}
    with build_run(cfg, data_root=data_root, device="cpu", server_threads=0) as run:  # no rounds ahead
        engine, stream, strategy = run.engine, run.stream, run.engine.strategy
        for t in run.steps(stop=min(run.n_steps, max_steps or run.n_steps)):
            batch = stream.batch(t)
            phase = engine.local_phase(batch, strategy)
            kinds = {k: phase.context[k] for k in ("indicator", "feature_mean", "logits_mean")}
            if phase.state and engine.local.shares == "bn_stats":
                kinds["bn_stats"] = torch.cat([v.reshape(cfg.clients, -1) for v in phase.state.values()], 1)
            probes = probe_uploads(strategy, engine.bank, engine.local, phase.x, t)
            kinds.update({"probe_logits": v for v in probes.values()})
            present = engine.present(t).numpy()
            for k, v in kinds.items():
                rows.setdefault(k, []).append(v.detach().double().cpu().reshape(cfg.clients, -1).numpy()[present])
            meta["domains"].append(np.asarray(batch.domains)[present])
            meta["clients"].append(np.arange(cfg.clients)[present])
            meta["steps"].append(np.full(cfg.clients, t)[present])
            meta["slots"].append(np.full(cfg.clients, stream.scenario.slot_of(t))[present])
            engine.server_phase(phase, strategy)
    return CollectedUploads({k: np.concatenate(v) for k, v in rows.items()},
                            *(np.concatenate(meta[k]) for k in ("domains", "clients", "steps", "slots")),
                            stream.scenario.domain_names)


def guess_accuracy(x: np.ndarray, y: np.ndarray, groups: np.ndarray, folds: int = 5) -> float:
    """Accuracy (%) of a logistic-regression guess of ``y`` from ``x``, cross-validated over ``groups``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GroupKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    folds = min(folds, len(np.unique(groups)))
    if folds < 2 or len(np.unique(y)) < 2:
        raise ValueError("need at least two slots and two domains to cross-validate a guess")
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    return float(100 * cross_val_score(model, x, y, groups=groups, cv=GroupKFold(folds)).mean())


def leakage_table(collected: CollectedUploads, folds: int = 5) -> pd.DataFrame:
    """Per upload kind: its size and how well the server can guess the client's corruption from one upload."""
    y = collected.domains
    groups = collected.clients * (collected.slots.max() + 1) + collected.slots
    chance = 100 * np.bincount(y).max() / len(y)
    rows = []
    for kind, x in collected.uploads.items():
        rows.append({"upload": kind, "what": UPLOAD_KINDS.get(kind, ""), "values": x.shape[1],
                     "bytes (float32)": 4 * x.shape[1], "guess accuracy (%)": guess_accuracy(x, y, groups, folds),
                     "chance (%)": chance})
    return pd.DataFrame(rows).set_index("upload")


def stored_leakage_table(cfg: ExperimentConfig, max_steps: Optional[int], folder: Path | str,
                         data_root: Optional[str] = None) -> pd.DataFrame:
    """``leakage_table(collect_uploads(cfg, max_steps))``, stored as ``<folder>/leakage/<config hash>_<steps>.json``
    with the code record of the run and of this module's computing definitions (``record_scope``), and read back
    while that code is unchanged (a 150-step FedCTTA probe takes minutes); computed and stored when missing or
    stale."""
    from .runstore import read_summary, run_status, store_summary
    from .workbook import config_key

    path = Path(folder) / "leakage" / f"{config_key(cfg)}_{max_steps}.json"
    if path.is_file():
        stored = read_summary(path)
        if run_status(stored) == "current":
            return pd.DataFrame(stored["table"]).set_index("upload")
    table = leakage_table(collect_uploads(cfg, max_steps, data_root))
    store_summary(path, {"config": cfg.to_dict(), "max_steps": max_steps,
                         "table": table.reset_index().to_dict("records"), "code": record_scope(cfg)})
    return table


# the definitions of this module that compute a stored leakage table (the rest describes or reads it)
RECORDED = ("UPLOAD_KINDS", "CollectedUploads", "collect_uploads", "guess_accuracy", "leakage_table")


def record_scope(cfg: ExperimentConfig) -> Dict:
    """The code record of a leakage table of ``cfg`` made now: the run's (``build.code_record``) and this module's
    ``RECORDED`` definitions (not its storing code, which imports the workbook: an edit of the workbook's run
    orchestration changes no leakage number)."""
    from .build import code_record
    from .runstore import code_record_of
    from .units import merge_records

    return merge_records(code_record(cfg.local, cfg.strategy, cfg),
                         code_record_of([], [f"{__name__}:{name}" for name in RECORDED]))


def is_record(data: object) -> bool:
    """Whether a stored JSON document is a stored leakage table (as ``stored_leakage_table`` writes it)."""
    return isinstance(data, dict) and {"config", "max_steps", "table", "code"} <= data.keys()


