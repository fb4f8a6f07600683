"""How personal pFedBBN's mixing is: its softmax temperature T and distance scale, the rule that picks them, and
the claims of pFedBBN's Table 1 read at the picked setting.

pFedBBN's paper names a "temperature-controlled softmax" over BN-statistic distances but gives neither T nor how the
distances are normalised; T = 1 on the summed per-layer distances (our default, Eq. 7 as written) leaves the
degree of personalisation to the number of layers and the batch size. The grid: T in ``TEMPERATURES`` x scale in
``SCALES`` (``strategies.base.scale_distances``) on pFedBBN's protocol (``imbalance.pfedbbn_config``) with BBN
clients, per label-skew alpha.

The selection rule, fixed before any accuracy is read: on a held-out stream (the same protocol drawn with
``HELD_OUT_SEED``, a seed no table reports), take the setting whose W puts the largest share of each client's
weight on the *other* clients that see the same corruption at that step (``workbook.same_domain_weight``, averaged
over clients and steps); ties go to the smaller T. Accuracy is then read on the reported seeds.
Every run is a ``workbook.run_grid`` summary (with ``weight_shares``) under ``RESULTS_DIR``; ``FTTA_PLAN`` plans
the missing ones for ``run-plan``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import pandas as pd

from .experiment import ExperimentConfig

TEMPERATURES = (1.0, 2.0, 4.0, 8.0, 16.0)
SCALES = ("none", "row_median")
ALPHAS = (0.1, 0.01)
HELD_OUT_SEED = 100
RESULTS_DIR = "figures/pfedbbn/runs/temperature"
GRID_DIR = "figures/pfedbbn/runs"  # pFedBBN's Table 1 grid: read for runs it already has (T = 1, references)
SHARE_COLUMNS = ("self", "same domain", "other domains", "uniform same-domain")


def setting_name(temperature: float, scale: str) -> str:
    return f"T={temperature:g}, scale={scale}"


def bbn_base(base: ExperimentConfig, alpha: Optional[float]) -> ExperimentConfig:
    """``base`` with BBN clients (the benchmark's settings) and label skew ``alpha``."""
    from .imbalance import local_settings

    return dataclasses.replace(base, local="bbn", local_params=local_settings("bbn", base.model_name),
                               label_alpha=alpha)


def temperature_variants(temperatures: Sequence[float] = TEMPERATURES,
                         scales: Sequence[str] = SCALES) -> Dict[str, Dict[str, Any]]:
    """``run_grid`` variants: pFedBBN at every (T, scale); T = 1 with scale "none" is the default, stored as such."""
    out = {}
    for scale in scales:
        for t in temperatures:
            params = {k: v for k, v in (("temperature", float(t)), ("scale", scale))
                      if (k, v) not in (("temperature", 1.0), ("scale", "none"))}
            out[setting_name(t, scale)] = {"strategy": "pfedbbn", "strategy_params": params}
    return out


def reference_variants() -> Dict[str, Dict[str, Any]]:
    """BBN alone and FedAvg + BBN: what pFedBBN's Table 1 puts it beside."""
    return {"BBN alone": {"strategy": "local", "strategy_params": {}},
            "FedAvg + BBN": {"strategy": "fedavg", "strategy_params": {}}}


def temperature_grid(base: ExperimentConfig, seeds: Sequence[int], alphas: Sequence[Optional[float]] = ALPHAS,
                     variants: Optional[Mapping[str, Mapping[str, Any]]] = None,
                     results_dir: Path | str = RESULTS_DIR, only_cached: bool = False,
                     also_read: Sequence[Path | str] = (GRID_DIR,)) -> pd.DataFrame:
    """One row per (alpha, variant, seed): accuracy and the mean ``weight_shares`` of the stored run (runs the
    missing ones unless ``only_cached``; with ``FTTA_PLAN`` set, plans them). ``also_read``: folders of stored runs
    read (never written) when ``results_dir`` lacks one, e.g. the Table 1 grid's BBN alone / FedAvg + BBN."""
    from .workbook import run_grid

    variants = dict(variants if variants is not None else {**temperature_variants(), **reference_variants()})
    frames = []
    for alpha in alphas:
        grid = run_grid(bbn_base(base, alpha), variants, list(seeds), results_dir=Path(results_dir), progress=False,
                        only_cached=only_cached, also_read=[Path(f) for f in also_read])
        if len(grid):
            frames.append(grid.assign(alpha=alpha))
    if not frames:
        return pd.DataFrame(columns=["alpha", "variant", "seed", "accuracy", *SHARE_COLUMNS])
    table = pd.concat(frames, ignore_index=True)
    shares = _stored_shares(base, table, variants, [Path(results_dir), *map(Path, also_read)])
    return pd.concat([table, shares], axis=1)[["alpha", "variant", "seed", "accuracy", *SHARE_COLUMNS]]


def _stored_shares(base: ExperimentConfig, table: pd.DataFrame, variants: Mapping[str, Mapping[str, Any]],
                   folders: Sequence[Path]) -> pd.DataFrame:
    """The ``weight_shares`` of each row's stored summary (NaN for runs stored before summaries carried them)."""
    from .runstore import read_summary
    from .workbook import stored_path

    rows = []
    for r in table.to_dict("records"):
        cfg = dataclasses.replace(bbn_base(base, r["alpha"]), **dict(variants[r["variant"]]), seed=r["seed"])
        found = stored_path(cfg, folders[0], folders[1:])
        shares = read_summary(found).get("weight_shares", {}) if found is not None else {}
        rows.append({k: shares.get(k, float("nan")) for k in SHARE_COLUMNS})
    return pd.DataFrame(rows, index=table.index)


def select_setting(held_out: pd.DataFrame) -> pd.DataFrame:
    """The rule, per alpha: the pFedBBN setting with the largest same-domain share on the held-out stream (ties:
    smaller T). ``held_out``: ``temperature_grid`` rows of ``HELD_OUT_SEED``. One row per alpha."""
    rows = held_out[held_out["variant"].str.startswith("T=")].copy()
    rows["T"] = rows["variant"].str.extract(r"T=([\d.]+)")[0].astype(float)
    rows = rows.sort_values(["alpha", "same domain", "T"], ascending=[True, False, True])
    return rows.groupby("alpha", sort=False).head(1)[["alpha", "variant", "same domain", "uniform same-domain",
                                                       "self"]].reset_index(drop=True)


def curve(grid: pd.DataFrame) -> pd.DataFrame:
    """Mean accuracy and shares over seeds per (alpha, variant), with the number of seeds."""
    g = grid.groupby(["alpha", "variant"])
    out = g[["accuracy", *SHARE_COLUMNS]].mean()
    out["accuracy sd"] = g["accuracy"].std(ddof=1)
    out["seeds"] = g["seed"].nunique()
    return out.reset_index()


def pfedbbn_claims(reported: pd.DataFrame, chosen: pd.DataFrame, tie: float = 0.5) -> List[Dict[str, Any]]:
    """pFedBBN's Table 1 claims at the chosen setting: above BBN alone and above FedAvg + BBN per alpha (paired by
    seed), and W clustering by domain (same-domain share above the uniform one), in ``fidelity.claims_table``'s
    row shape."""
    from .fidelity import _row, paired, verdict
    from .imbalance import _paper_value, paper_column
    from .paper import paper_table

    paper = paper_table("pfedbbn_table1")
    paper = paper[paper.dataset == "cifar10"]
    rows = []
    for pick in chosen.to_dict("records"):
        alpha, name = pick["alpha"], pick["variant"]
        at = reported[reported["alpha"] == alpha]
        acc = lambda v: at[at["variant"] == v].set_index("seed")["accuracy"]  # noqa: E731
        where = f"pFedBBN {name} (chosen by the held-out rule), BBN clients, alpha {alpha:g}"
        for ref, strategy in (("BBN alone", "None-Fed"), ("FedAvg + BBN", "FedAvg")):
            theirs = (_paper_value(paper, "pFedBBN", "BBN", alpha) - _paper_value(paper, strategy, "BBN", alpha)
                      if paper_column(alpha) is not None else float("nan"))
            rows.append(_row(f"pFedBBN above {ref}, alpha {alpha:g}", "pFedBBN Table 1", theirs,
                             paired(acc(name), acc(ref)), tie, where))
        sh = at[at["variant"] == name].set_index("seed")
        clusters = _row(f"pFedBBN's W clusters by domain (same-domain share minus uniform, in points), "
                        f"alpha {alpha:g}", "pFedBBN Fig 5 (no number: 'clusters')", float("nan"),
                        paired(100 * sh["same domain"], 100 * sh["uniform same-domain"]), tie, where)
        clusters["verdict"] = verdict(clusters["ours"], 1.0 + tie, tie)  # the paper's claim: above uniform
        rows.append(clusters)
    return rows


__all__ = ["TEMPERATURES", "SCALES", "ALPHAS", "HELD_OUT_SEED", "RESULTS_DIR", "temperature_variants",
           "reference_variants", "temperature_grid", "select_setting", "curve", "pfedbbn_claims", "bbn_base"]
