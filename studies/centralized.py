"""Centralized sanity check: local TTA methods as ONE client over the corruptions in sequence (continual setting).

The protocol of the test-time-adaptation benchmark (mariodoebler/test-time-adaptation, ``classification/``):
one model, the 15 corruptions at severity 5 in Hendrycks' order, batch 200, no reset between corruptions, and the
error of the prediction made while adapting (the method's output on a batch before the server step: our
``correct_local``). It runs through the ordinary engine with strategy ``local`` and a single client, so the methods
are exactly the federated ones. ``beside_reference`` lays our errors beside the published WRN-28 numbers stored in
``data/paper_numbers/tta_benchmark_cifar10c.csv``.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import pandas as pd

from ftta_core.experiment import (ALL_CORRUPTIONS, DATASET_DEFAULTS, ExperimentConfig, build_stream, resolve_device,
                         run_experiment)
from studies.paper import paper_table

REFERENCE_TABLE = "tta_benchmark_cifar10c"
BENCHMARK_METHODS = ("source", "bn", "tent", "eata", "cotta", "rotta", "roid")

# the benchmark's settings where our defaults differ (cfgs/cifar10_c/<method>.yaml: Adam 1e-3, BN affine for
# Tent; EATA's Fisher from 2,000 source samples); eata also gets fisher_source = the run's source model
REFERENCE_PARAMS: Dict[str, Dict[str, Any]] = {
    "tent": {"params": "bn_affine", "optimizer": "adam", "lr": 1e-3},
    "eata": {"fisher_samples": 2000, "fisher_batch": 200},
}


def method_params(method: str, model_name: str, seed: int,
                  overrides: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Dict[str, Any]:
    """A method's parameters for the centralized protocol: reference settings, the run's seed and source model
    where the method takes them, then ``overrides[method]``."""
    from ftta_core.registry import accepts
    from ftta_core.tta import LOCAL_METHODS

    params: Dict[str, Any] = dict(REFERENCE_PARAMS.get(method, {}))
    if accepts(LOCAL_METHODS, method, "fisher_source"):
        params["fisher_source"] = model_name
    if accepts(LOCAL_METHODS, method, "seed"):
        params["seed"] = seed
    params.update((overrides or {}).get(method, {}))
    return params


def centralized_config(method: str, dataset: str = "cifar10", images_per_corruption: int = 10000,
                       batch_size: int = 200, severity: int = 5, corruptions: Sequence[str] | str = ALL_CORRUPTIONS,
                       seed: int = 0, device: str = "auto", backend: str = "vectorized",
                       overrides: Optional[Mapping[str, Mapping[str, Any]]] = None) -> ExperimentConfig:
    """One client walking the corruptions in order (scenario ``fedtsa_iid`` with one client), strategy ``local``."""
    if images_per_corruption < batch_size:
        raise ValueError(f"images_per_corruption ({images_per_corruption}) must be at least batch_size ({batch_size})")
    if dataset not in DATASET_DEFAULTS:
        raise ValueError(f"dataset: unknown {dataset!r}; valid: {sorted(DATASET_DEFAULTS)}")
    params = method_params(method, DATASET_DEFAULTS[dataset]["model"], seed, overrides)
    return ExperimentConfig(dataset=dataset, scenario="fedtsa_iid", corruptions=corruptions, severity=severity,
                            clients=1, batch_size=batch_size, images_per_client=images_per_corruption,
                            local=method, local_params=params, strategy="local", seed=seed, device=device,
                            backend=backend)


def run_centralized(methods: Sequence[str], dataset: str = "cifar10", images_per_corruption: int = 10000,
                    batch_size: int = 200, severity: int = 5, corruptions: Sequence[str] | str = ALL_CORRUPTIONS,
                    seed: int = 0, device: str = "auto", backend: str = "vectorized",
                    overrides: Optional[Mapping[str, Mapping[str, Any]]] = None, progress: bool = False,
                    data_root: Optional[str] = None) -> pd.DataFrame:
    """Tidy table (method, corruption, n, error, error_after_update) in %, corruptions in stream order.

    ``error`` is the prediction made while adapting (the benchmark's number); ``error_after_update`` predicts the
    same batch again after the step.
    """
    rows = []
    stream = None
    for method in methods:
        cfg = centralized_config(method, dataset, images_per_corruption, batch_size, severity, corruptions, seed,
                                 device, backend, overrides)
        stream = stream or build_stream(cfg, resolve_device(cfg.device), data_root)
        steps = run_experiment(cfg, progress=progress, stream=stream).steps
        g = steps.groupby("domain", sort=False)[["n", "correct_local", "correct_mixed"]].sum()
        for corruption, r in g.iterrows():
            rows.append({"method": method, "corruption": corruption, "n": int(r["n"]),
                         "error": 100 - 100 * r["correct_local"] / r["n"],
                         "error_after_update": 100 - 100 * r["correct_mixed"] / r["n"]})
    return pd.DataFrame(rows)


def beside_reference(table: pd.DataFrame) -> pd.DataFrame:
    """Per method: our mean error over corruptions beside the benchmark's continual WRN-28 mean, with both rankings
    (1 = lowest error among the methods that have both numbers)."""
    ref = paper_table(REFERENCE_TABLE)
    ref = ref[(ref["source"] == "benchmark") & (ref["corruption"] == "mean")].set_index("method")["error"]
    ours = table.groupby("method", sort=False)["error"].mean()
    out = pd.DataFrame({"method": ours.index, "ours_error": ours.values,
                        "reference_error": [ref.get(m, float("nan")) for m in ours.index]})
    out["difference"] = out["ours_error"] - out["reference_error"]
    both = out["reference_error"].notna()
    out["rank_ours"] = out["ours_error"].where(both).rank(method="min").astype("Int64")
    out["rank_reference"] = out["reference_error"].rank(method="min").astype("Int64")
    return out


def per_corruption_beside(table: pd.DataFrame) -> pd.DataFrame:
    """Corruption x method errors, ours beside the Tent README's WRN-28 rows (source, bn, tent; the README resets the
    model for every corruption, which changes nothing for source and bn but does for tent)."""
    ref = paper_table(REFERENCE_TABLE)
    ref = ref[(ref["source"] == "tent_readme") & (ref["corruption"] != "mean")]
    ours = table.pivot(index="corruption", columns="method", values="error")
    ours = ours.loc[table["corruption"].unique()]
    out = pd.DataFrame(index=ours.index)
    for method in table["method"].unique():
        out[f"{method}_ours"] = ours[method]
        theirs = ref[ref["method"] == method].set_index("corruption")["error"]
        if len(theirs):
            out[f"{method}_reference"] = theirs.reindex(ours.index)
    out.index.name = "corruption"
    return out


def ordering_reading(beside: pd.DataFrame) -> str:
    """How our ranking of the methods (``beside_reference``) agrees with the benchmark's: Spearman's rank correlation
    over the methods with both numbers, and each method whose rank differs, with both errors."""
    both = beside.dropna(subset=["ours_error", "reference_error"])
    if len(both) < 2:
        return "Fewer than two methods have both our error and the benchmark's: no ordering to compare."
    rank_ours = both["ours_error"].rank(method="min")
    rank_ref = both["reference_error"].rank(method="min")
    rho = float(rank_ours.corr(rank_ref, method="pearson")) if rank_ours.nunique() > 1 else float("nan")
    moved = [f"{r.method} ({int(a)} here, {int(b)} there: {r.ours_error:.1f}% vs {r.reference_error:.1f}%)"
             for r, a, b in zip(both.itertuples(), rank_ours, rank_ref) if a != b]
    best, worst = both.loc[both.ours_error.idxmin(), "method"], both.loc[both.ours_error.idxmax(), "method"]
    adapted = both[both.method != "source"]
    spread = (f"The adapting methods span {adapted.ours_error.min():.1f}-{adapted.ours_error.max():.1f}% here and "
              f"{adapted.reference_error.min():.1f}-{adapted.reference_error.max():.1f}% there; ranks within a few "
              "tenths of a point are noise. ") if len(adapted) > 1 else ""
    text = (f"Spearman rank correlation with the benchmark's ordering over {len(both)} methods: {rho:.2f}. "
            f"Lowest error here: {best}; highest: {worst}. " + spread)
    return text + ("Same ordering as the benchmark." if not moved else "Ranks that differ: " + "; ".join(moved) + ".")
