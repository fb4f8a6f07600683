"""FedICON and its baselines on one set of clients, sharing trained models between methods, with cached results.

A method is (trained models, test-time procedure). Trained models are built once per ``Study`` and reused (FedAvg
serves FedAvg, FedAvg-FT, Tent, EATA and T3A; FedTHE's two-head models serve FedTHE and FedTHE+); results are cached
as JSON under a results folder keyed by the full setting (FedTHE's settings join the key of its methods only, so the
other methods' cached results keep their keys), so a rerun of the notebook reads them.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import pandas as pd
import torch
from torch import nn

from ..rng import torch_generator
from ..runstore import atomic_write_text, code_record_of, read_summary, usable
from .adaptation import TTAConfig, accuracy, contrastive_tta, eata_predict, predict, t3a_predict, tent_predict
from .data import ClientData
from .fedthe import FedTHEConfig, fedthe_train, the_predict
from .training import TrainConfig, federated_train, fine_tune, train_classifier

TABLE1_METHODS = ("Local", "FedAvg", "FedAvg-FT", "FedProx", "FedRep", "FedBN", "FedTHE", "Tent", "EATA", "T3A",
                  "FedICON")
# Table 8: (local invariance extraction, global invariance sharing, test-time adaptation) -> (models, test-time)
# what a FedICON record depends on (its ``code`` record, ``runstore``): this module and what it imports (training,
# adaptation, FedTHE, data, losses, models), not the package's reporting module (``report``, which imports the
# workbook: an edit of the workbook's run orchestration changes no FedICON number)
CODE_ROOTS = ("ftta_core.fedicon.study", "ftta_core.models", "ftta_core.data", "ftta_core.rng")

ABLATION = {
    (False, False, False): ("local_ce", "none"), (True, False, False): ("local_supcon", "none"),
    (False, True, False): ("fedavg", "none"), (False, False, True): ("local_ce", "contrastive"),
    (True, True, False): ("fed_supcon", "none"), (False, True, True): ("fedavg", "contrastive"),
    (True, False, True): ("local_supcon", "contrastive"), (True, True, True): ("fed_supcon", "contrastive"),
}
METHODS: Dict[str, Tuple[str, str]] = {
    "Local": ("local_ce", "none"), "FedAvg": ("fedavg", "none"), "FedAvg-FT": ("fedavg_ft", "none"),
    "FedProx": ("fedprox", "none"), "FedRep": ("fedrep", "none"), "FedBN": ("fedbn", "none"),
    "FedTHE": ("fedthe", "the"), "FedTHE+": ("fedthe", "the_plus"),
    "Tent": ("fedavg", "tent"), "EATA": ("fedavg", "eata"), "T3A": ("fedavg", "t3a"),
    "FedICON": ("fed_supcon", "contrastive"), "FedICON-us": ("fed_simclr", "contrastive"),
    "FedICON w/o TTA": ("fed_supcon", "none"),
    **{"ablation " + "".join("1" if f else "0" for f in flags): spec for flags, spec in ABLATION.items()},
}


def ablation_name(lie: bool, gis: bool, tta: bool) -> str:
    """The METHODS key of one Table 8 variant."""
    return "ablation " + "".join("1" if f else "0" for f in (lie, gis, tta))


class Study:
    """Trains (lazily, once) the models the requested methods need and evaluates them on each client's test set."""

    def __init__(self, clients: Sequence[ClientData], arch: str, train_cfg: TrainConfig, tta_cfg: TTAConfig,
                 seed: int, the_cfg: Optional[FedTHEConfig] = None) -> None:
        self.clients, self.arch, self.cfg, self.tta, self.seed = list(clients), arch, train_cfg, tta_cfg, seed
        self.the = the_cfg or FedTHEConfig()
        self._models: Dict[str, List[nn.Module]] = {}

    def models(self, key: str) -> List[nn.Module]:
        """The clients' trained models for ``key`` (see ``METHODS``), trained on first use."""
        if key not in self._models:
            self._models[key] = self._train(key)
        return self._models[key]

    def _train(self, key: str) -> List[nn.Module]:
        c, cfg, s, arch = self.clients, self.cfg, self.seed, self.arch
        bn_arch = "cnn2_bn" if arch == "cnn2" else arch
        builders: Dict[str, Callable[[], List[nn.Module]]] = {
            "local_ce": lambda: federated_train(c, arch, "ce", cfg, s, share="none"),
            "fedavg": lambda: federated_train(c, arch, "ce", cfg, s, share="all"),
            "fedavg_ft": lambda: fine_tune(self.models("fedavg"), c, cfg, s),
            "fedprox": lambda: federated_train(c, arch, "ce", cfg, s, share="all", prox=True, tag="prox"),
            "fedrep": lambda: federated_train(c, arch, "ce", cfg, s, share="encoder", fedrep=True, tag="rep"),
            "fedbn": lambda: federated_train(c, bn_arch, "ce", cfg, s, share="non_bn", tag="bn"),
            "fedthe": lambda: fedthe_train(c, arch, cfg, self.the, s),
            "fed_supcon": lambda: train_classifier(federated_train(c, arch, "supcon", cfg, s, share="encoder"), c, cfg, s),
            "local_supcon": lambda: train_classifier(federated_train(c, arch, "supcon", cfg, s, share="none"), c, cfg, s,
                                                     federated=False),
            "fed_simclr": lambda: train_classifier(federated_train(c, arch, "simclr", cfg, s, share="encoder"), c, cfg, s),
        }
        if key not in builders:
            raise ValueError(f"unknown model key {key!r}; valid: {sorted(builders)}")
        return builders[key]()

    def predictions(self, method: str, clean: bool = False) -> List[torch.Tensor]:
        """Per-client predictions of ``method`` on the shifted (or, with ``clean``, the unshifted) test sets."""
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; valid: {list(METHODS)}")
        key, test_time = METHODS[method]
        out = []
        for i, (model, data) in enumerate(zip(self.models(key), self.clients)):
            x = data.x_test_clean if clean else data.x_test
            if x is None:
                raise ValueError(f"client {data.name} has no clean test set")
            if test_time == "contrastive":
                gen = torch_generator(self.seed, "fedicon-tta", key, i, int(clean))
                out.append(predict(contrastive_tta(model, x, self.cfg, self.tta, gen), x))
            elif test_time == "tent":
                out.append(tent_predict(model, x, self.tta))
            elif test_time == "eata":
                out.append(eata_predict(model, x, data.x_train, self.tta, self.seed))
            elif test_time == "t3a":
                out.append(t3a_predict(model, x, self.tta))
            elif test_time in ("the", "the_plus"):
                views = self.cfg.views if test_time == "the_plus" else None
                gen = torch_generator(self.seed, "fedthe-plus", i, int(clean)) if views is not None else None
                out.append(the_predict(model, x, self.the, self.tta.batch_size, views, gen)[0])
            else:
                out.append(predict(model, x))
        return out

    def accuracies(self, method: str, clean: bool = False) -> Dict[str, float]:
        """Per-client accuracy (%) of ``method``."""
        return {d.name: accuracy(p, d.y_test) for d, p in zip(self.clients, self.predictions(method, clean))}


def record_scope() -> Dict[str, object]:
    """The code record a FedICON result made now would hold (``CODE_ROOTS``); ``run_methods`` writes the same
    record with its own ``code_record_of(CODE_ROOTS)`` call, left as it is so that its recorded definition, and with
    it every stored result, stays current (``tests/test_fedicon.py`` checks the two agree)."""
    return code_record_of(CODE_ROOTS)


def is_record(data: object) -> bool:
    """Whether a stored JSON document is one FedICON result record (as ``run_methods`` writes it)."""
    return isinstance(data, dict) and {"setting", "accuracy", "wall_s"} <= data.keys() and "config" not in data


def setting_key(setting: dict) -> str:
    """A short stable hash of a JSON-able setting."""
    return hashlib.blake2b(json.dumps(setting, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


def run_methods(results_dir: Path, setting: dict, methods: Sequence[str], seeds: Sequence[int],
                build_clients: Callable[[int], Sequence[ClientData]], arch: str, train_cfg: TrainConfig,
                tta_cfg: TTAConfig, clean: bool = False, progress: Optional[Callable[[str], None]] = print,
                the_cfg: Optional[FedTHEConfig] = None) -> pd.DataFrame:
    """Tidy rows (method, seed, client, accuracy, shift) for every method and seed, read from or written to
    ``results_dir/<hash>.json`` (one file per setting, seed, method and shift; ``the_cfg`` -- default
    ``FedTHEConfig()`` -- is part of the key of FedTHE's methods only)."""
    the_cfg = the_cfg or FedTHEConfig()
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in seeds:
        study: Optional[Study] = None
        for method in methods:
            for shifted in ([True, False] if clean else [True]):
                full = {**setting, "arch": arch, "train": asdict(train_cfg), "tta": asdict(tta_cfg), "seed": seed,
                        "method": method, "shifted": shifted}
                if METHODS.get(method, ("",))[0] == "fedthe":
                    full["the"] = asdict(the_cfg)
                path = results_dir / f"{setting_key(full)}.json"
                if usable(path) is not None:
                    record = read_summary(path)
                else:
                    if study is None:
                        study = Study(build_clients(seed), arch, train_cfg, tta_cfg, seed, the_cfg)
                    t0 = time.time()
                    acc = study.accuracies(method, clean=not shifted)
                    record = {"setting": full, "accuracy": acc, "wall_s": round(time.time() - t0, 2),
                              "code": code_record_of(CODE_ROOTS)}
                    atomic_write_text(path, json.dumps(record, indent=1) + "\n")
                    if progress:
                        progress(f"{setting.get('name', '')} seed {seed} {method}{'' if shifted else ' (clean)'}: "
                                 f"mean {sum(acc.values()) / len(acc):.2f}% ({record['wall_s']} s)")
                rows += [{"method": method, "seed": seed, "client": c, "accuracy": a,
                          "shift": "shifted" if shifted else "original"} for c, a in record["accuracy"].items()]
    return pd.DataFrame(rows)


def method_table(rows: pd.DataFrame, methods: Sequence[str], clients: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """Methods x clients (+ mean) of the accuracy averaged over seeds (``mean(std)`` strings when several seeds)."""
    clients = list(clients) if clients is not None else list(dict.fromkeys(rows.client))
    per_seed = rows.pivot_table(index=["method", "seed"], columns="client", values="accuracy")[clients]
    per_seed["mean"] = per_seed.mean(axis=1)
    agg = per_seed.groupby(level="method").agg(["mean", "std"])
    seeds = rows.seed.nunique()
    table = pd.DataFrame(index=[m for m in methods if m in agg.index])
    for col in clients + ["mean"]:
        m, s = agg[(col, "mean")], agg[(col, "std")]
        table[col] = [f"{m[k]:.2f}" + (f"({s[k]:.2f})" if seeds > 1 else "") for k in table.index]
    return table
