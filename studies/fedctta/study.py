"""FedCTTA reproduction helpers: run strategy objects live on a small stream, and the ablation grids of Table IV
(probe data x statistic x distance) and Fig. 5 (aggregation interval, batch size).

A variant here (``Variant``: ``variants.strategy_variant``) is a strategy with parameters that may hold live objects
(e.g. FedCTTA with a tensor of clean probe images, which no stored file can hold); ``live_grid`` runs such variants
over seeds in memory (``grid.run`` with a ``grid.MemoryStore``: ``grid.run_live`` on one stream per config and seed)
and gives each variant's typed parameters (its ``factors``) as columns: the names are display labels only, never
parsed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
import torch

from ftta_core import grid
from ftta_core.experiment import ExperimentConfig
from ftta_core.grid import run_live  # noqa: F401  (this module's name for it before grid)
from ftta_core.rng import numpy_generator
from ftta_core.stats import comparison_phrase
from ftta_core.variants import Variant as GridVariant
from ftta_core.variants import strategy_variant

if TYPE_CHECKING:
    from ftta_core.loop import Engine, StepResult
    from ftta_core.stream import StreamBatch

# Table IV of the paper: (probe data, statistic, distance), as in data/paper_numbers/fedctta_table4.csv
TABLE4_FACTORS = ["probes", "statistic", "distance"]
TABLE4_CELLS = [(probes, "logits", d) for probes in ("random_noise", "clean_images")
                for d in ("euclidean", "kl", "cross_entropy", "cosine")] + \
               [(probes, "features", d) for probes in ("random_noise", "clean_images") for d in ("euclidean", "cosine")]


# a live run's variant: Variant(strategy, params, config, factors), e.g. Variant("fedctta", {"probe_images": images},
# factors={"probes": "clean_images"}); the study's name for ``variants.strategy_variant``
Variant = strategy_variant


def clean_probe_images(dataset: str, m: int = 64, seed: int = 0) -> torch.Tensor:
    """``m`` clean training images [M, C, H, W] in [0, 1], drawn without replacement (the paper's 'selected' set)."""
    from ftta_core.data import load_dataset

    base = load_dataset(dataset, "train")
    idx = numpy_generator(seed, "fedctta-clean-probes").choice(len(base), size=m, replace=False)
    return base.tensors(np.sort(idx))[0]


@dataclass
class FedCTTARound:
    """One FedCTTA aggregation step opened up: the probes, each client's mean output on them, distances and W."""

    step: int
    probes: torch.Tensor  # [N, M, C, H, W] (a shared set repeats)
    statistics: torch.Tensor  # mean logits (or features) on the probes [N, K]
    distances: torch.Tensor  # ||s_i - s_j|| [N, N] (euclidean) or -similarity for other distances
    weights: torch.Tensor  # W = row softmax of the similarities [N, N]
    result: "StepResult"  # the engine's step (its ``weights`` are the W it applied, equal to ``weights``)
    domains: np.ndarray  # each client's domain id at this step [N]

    @property
    def engine_weights(self) -> np.ndarray:
        """The W the engine applied at this step."""
        return self.result.weights


def fedctta_round(engine: "Engine", batch: "StreamBatch") -> FedCTTARound:
    """Run one engine step with a FedCTTA strategy and return what its server computed, recomputed in the open
    from the clients' probe statistics (the engine's own W is kept beside it for comparison)."""
    from ftta_core.strategies.fedctta import PROBE_UPLOAD, FedCTTA, similarity_matrix, similarity_weights

    strategy = engine.strategy
    if not isinstance(strategy, FedCTTA):
        raise TypeError(f"fedctta_round needs a FedCTTA engine, got {strategy.name!r}")
    phase = engine.local_phase(batch, strategy)
    probes = strategy.probe_inputs(batch.step, engine.n_clients, tuple(phase.x.shape[2:]))
    stats = strategy.probe_uploads(engine.bank, engine.local, phase.x, batch.step)[PROBE_UPLOAD].detach().cpu()
    valid = torch.ones(engine.n_clients, dtype=torch.bool)
    distances = -similarity_matrix(stats, strategy.distance)
    weights = similarity_weights(stats, valid, strategy.distance, strategy.temperature)
    result = engine.server_phase(phase, strategy)
    return FedCTTARound(batch.step, probes, stats, distances, weights, result, np.asarray(batch.domains))


def cluster_groups(domain_map: np.ndarray) -> Dict[str, List[int]]:
    """Clients that see the same domain sequence (identical rows of the scenario's domain map), named by members."""
    groups: Dict[tuple, List[int]] = {}
    for i, row in enumerate(np.asarray(domain_map)):
        groups.setdefault(tuple(row), []).append(i)
    return {f"clients {','.join(map(str, m))}": m for m in groups.values()}


def live_grid(base: ExperimentConfig, variants: Mapping[str, GridVariant], seeds: Sequence[int],
              cache: Optional[Dict[tuple, dict]] = None) -> pd.DataFrame:
    """Every variant at every seed, in memory (``grid.run`` with a ``grid.MemoryStore``: streams built once per config
    and seed); one row per run: accuracies, W's mean self-weight (diagonal over steps and clients) and one column per
    factor of the variants (NaN where a variant lacks that factor).

    With ``cache`` (a dict kept by the caller) a run with the same config, strategy and parameters as one already
    in it is read back instead of run again (e.g. FedCTTA at its defaults in several grids)."""
    return grid.run(base, variants, seeds, grid.MemoryStore(cache))


def table4_variants(probe_images: torch.Tensor, baselines: Sequence[str] = ("local", "fedavg")) -> Dict[str, GridVariant]:
    """FedCTTA for every Table IV cell (named 'probes/statistic/distance', with those factors), plus baseline
    strategies by name (no factors)."""
    out = {}
    for cell in TABLE4_CELLS:
        probes, statistic, distance = cell
        params: Dict[str, Any] = {"on": statistic, "distance": distance}
        if probes == "clean_images":
            params["probe_images"] = probe_images
        out["/".join(cell)] = Variant("fedctta", params, factors=dict(zip(TABLE4_FACTORS, cell)))
    out.update({b: Variant(b) for b in baselines})
    return out


def split_table4(grid: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over seeds per Table IV cell, as columns probes, statistic, distance, mean, std, seeds (cells in
    the order first run). ``grid``: ``live_grid`` of ``table4_variants``, whose factor columns name each row's cell;
    rows without a cell (the baselines) are left out."""
    cells = grid.dropna(subset=TABLE4_FACTORS)
    g = cells.groupby(TABLE4_FACTORS, sort=False)["accuracy"]
    out = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=1).fillna(0.0), "seeds": g.size()}).reset_index()
    return out[[*TABLE4_FACTORS, "mean", "std", "seeds"]]


def interval_variants(intervals: Sequence[int]) -> Dict[str, GridVariant]:
    """FedCTTA aggregating every k-th step, for each k (Fig. 5a); factor ``interval``."""
    return {f"interval {k}": Variant("fedctta", {"interval": int(k)}, factors={"interval": int(k)})
            for k in intervals}


def temperature_variants(temperatures: Sequence[float], prefix: str = "",
                         **params: Any) -> Dict[str, GridVariant]:
    """FedCTTA with W = softmax(-distance / temperature) for each temperature (the paper fixes 1), with further
    FedCTTA ``params`` (e.g. ``probe_bn``, ``ema``); names ``"{prefix}temperature {t}"``, factor ``temperature``."""
    return {f"{prefix}temperature {t:g}": Variant("fedctta", {**params, "temperature": float(t)},
                                                  factors={"temperature": float(t)})
            for t in temperatures}


# how the clients normalise the probes, whether every client draws its own, and whether the server smooths their
# statistics: ours (the paper's shared noise, no EMA), and step by step to the reference code's (last entry)
PROBE_SETTINGS = {"client statistics": {}, "client statistics, EMA 0.9": {"ema": 0.9},
                  "eval mode": {"probe_bn": "eval"}, "eval mode, EMA 0.9": {"probe_bn": "eval", "ema": 0.9},
                  "eval mode, per-client probes, EMA 0.9": {"probe_bn": "eval", "probes": "per_client", "ema": 0.9}}
REFERENCE_PROBES = "eval mode, per-client probes, EMA 0.9"  # rajibrhasan/FedCTTA's clients and server


def probe_temperature_grid(base: ExperimentConfig, temperatures: Sequence[float], seeds: Sequence[int],
                           cache: Optional[Dict[tuple, dict]] = None,
                           settings: Mapping[str, Mapping[str, Any]] = PROBE_SETTINGS) -> pd.DataFrame:
    """FedCTTA at every (probe setting, temperature) (``live_grid``): factor columns ``setting`` (a name of
    ``settings``) and ``temperature``, with W's mean self-weight."""
    variants = {name: dataclasses.replace(v, factors={"setting": setting, **v.factors})
                for setting, params in settings.items()
                for name, v in temperature_variants(temperatures, f"{setting} / ", **params).items()}
    return live_grid(base, variants, seeds, cache=cache)


def probe_temperature_reading(grid: pd.DataFrame, refs: Mapping[str, float], n_clients: int) -> str:
    """What the (probe setting x temperature) curve says, computed: per setting, accuracy and self-weight at T = 1
    (and whether W is then uniform mixing, self-weight 1/N to 3 decimals) and the best temperature; the EMA's effect
    at T = 1 for each setting that is also run without it, paired by seed (``stats.comparison_phrase``); the
    distance to FedAvg (``refs['fedavg']``)."""
    means = grid.groupby(["setting", "temperature"])[["accuracy", "self weight"]].mean()
    settings = list(dict.fromkeys(grid["setting"]))
    lines = []
    for setting in settings:
        rows = means.loc[setting]
        best = rows["accuracy"].idxmax()
        text = f"- **{setting}**{' (the reference code)' if setting == REFERENCE_PROBES else ''}: "
        if 1.0 in rows.index:
            at1 = rows.loc[1.0]
            text += f"T = 1 gives {at1['accuracy']:.2f}% with self-weight {at1['self weight']:.3f}"
            text += (" — W is uniform mixing, i.e. FedAvg; " if abs(at1["self weight"] - 1 / n_clients) < 1e-3
                     else "; ")
        text += (f"the best temperature here is {best:g} ({rows.loc[best, 'accuracy']:.2f}%, self-weight "
                 f"{rows.loc[best, 'self weight']:.3f})")
        if "fedavg" in refs:
            text += f", {rows.loc[best, 'accuracy'] - refs['fedavg']:+.2f} points from FedAvg"
        lines.append(text + ".")
    at_1 = grid[grid["temperature"] == 1.0].pivot_table(index="seed", columns="setting", values="accuracy")
    for setting in settings:
        with_ema = f"{setting}, EMA 0.9"
        if with_ema in at_1 and setting in at_1:
            lines.append(f"- At T = 1 the EMA moves accuracy with {setting}: "
                         + comparison_phrase(at_1[with_ema], at_1[setting], "with EMA", "without") + ".")
    return "\n".join(lines)


def distance_contrast(distances: np.ndarray, groups: Mapping[str, Sequence[int]]) -> Dict[str, float]:
    """Mean distance between clients of the same cluster and of different clusters (off-diagonal entries)."""
    d = np.asarray(distances, dtype=float)
    label = np.empty(len(d), dtype=int)
    for k, members in enumerate(groups.values()):
        label[list(members)] = k
    same = (label[:, None] == label[None, :]) & ~np.eye(len(d), dtype=bool)
    other = label[:, None] != label[None, :]
    return {"within": float(d[same].mean()) if same.any() else float("nan"), "across": float(d[other].mean())}


def batch_size_variants(batch_sizes: Sequence[int], images_per_slot: int,
                        strategies: Sequence[str] = ("local", "fedavg", "fedctta")) -> Dict[str, GridVariant]:
    """Each strategy at each batch size (Fig. 5b); a slot keeps ``images_per_slot`` images per client, so larger
    batches mean fewer steps per distribution (the paper's reading of its batch-size curve); factors ``strategy`` and
    ``batch``."""
    return {f"{s} / batch {b}": Variant(s, config={"batch_size": int(b), "slot_steps": max(1, images_per_slot // b)},
                                        factors={"strategy": s, "batch": int(b)})
            for b in batch_sizes for s in strategies}


def _points(a: float, b: float) -> str:
    """'a - b' as signed points."""
    return f"{a - b:+.2f} points"


def reading(walk: Mapping[str, float], shares: pd.DataFrame, contrast: Mapping[str, float], table4: pd.DataFrame,
            grad_refs: Mapping[str, float], interval: pd.DataFrame, temperature: pd.DataFrame, batch: pd.DataFrame,
            cost: pd.DataFrame, table1: pd.DataFrame, rounds: Optional[pd.DataFrame] = None,
            table3: Optional[pd.DataFrame] = None, fig2: Optional[Mapping[str, pd.DataFrame]] = None) -> str:
    """The notebook's interpretation, written from the numbers it computed (every comparison is computed here).

    ``walk``: accuracy per strategy label (Local, FedAvg, FedCTTA) on the digits stream; ``shares``:
    ``workbook.group_weight_shares`` of FedCTTA's W; ``contrast``: ``distance_contrast`` at the opened step;
    ``table4``: ``tables.beside_fedctta_table4``; ``grad_refs``: Local and FedAvg under TTA-grad; ``interval`` /
    ``temperature``: rows with columns interval / temperature and accuracy; ``batch``: columns strategy, batch,
    accuracy; ``cost``: ``server_cost.scaling_table``; ``table1``: ``fedtsa.table1.stored_table1_runs``; ``rounds``: the
    benchmark's memory-over-rounds rows (strategy, round, retained_bytes); ``table3``:
    ``tables.beside_fedctta_table3`` of the stored case study; ``fig2``: ``workbook.heterogeneity_sweep`` tables
    keyed by the swept field ("sh", "th").
    """
    out = []
    ctta, avg, loc = walk["FedCTTA"], walk["FedAvg"], walk["Local"]
    own_self = float(shares["self"].mean())
    own_group = float(shares["own group (others)"].mean())
    by_t = temperature.groupby("temperature")["accuracy"].mean()
    best_t = float(by_t.idxmax())
    out.append(
        f"**Digits stream (TTA-bn).** FedCTTA reaches {ctta:.2f}% against {avg:.2f}% for FedAvg "
        f"({_points(ctta, avg)}) and {loc:.2f}% for Local ({_points(ctta, loc)}). The probe statistic does "
        f"{'' if contrast['within'] < contrast['across'] else 'not '}separate the clusters: at the opened step "
        f"clients of one cluster are {contrast['within']:.1f} apart and clients of different clusters "
        f"{contrast['across']:.1f}. With W = softmax(-distance) at temperature 1 (the paper's), a client keeps on "
        f"average {100 * own_self:.1f}% of its weight on itself and gives {100 * own_group:.1f}% to the other members "
        f"of its cluster, so W is {'near the identity (Local)' if own_self > 0.9 else 'far from the identity'} here "
        f"(self-weight {'above' if own_self > 0.9 else 'at most'} 90 %). Over the temperatures tried, FedCTTA is best "
        f"at {best_t:g} ({by_t.max():.2f}%, {_points(by_t.max(), loc)} over Local); that the model's logit scale is "
        f"what sets W's sharpness is an untested hypothesis here.")
    best = table4.sort_values("mean", ascending=False).iloc[0]
    eu = table4[(table4.probes == "random_noise") & (table4.statistic == "logits") & (table4.distance == "euclidean")]
    kl = table4[(table4.statistic == "logits") & table4.distance.isin(["kl", "cross_entropy"])]
    same_kl_ce = all(np.isclose(g["mean"].iloc[0], g["mean"].iloc[-1]) for _, g in kl.groupby("probes"))
    spread = float(table4["mean"].max() - table4["mean"].min())
    text = (f"**Table IV on digits.** The best cell is {best.probes} / {best.statistic} / {best.distance} "
            f"({best['mean']:.2f}%); the paper's choice (noise, logits, Euclidean) gives "
            f"{float(eu['mean'].iloc[0]):.2f}% (rank {int(eu.rank_ours.iloc[0])} of {len(table4)}); the cells span "
            f"{spread:.2f} points.")
    if len(kl):
        text += f" KL and cross entropy give {'identical' if same_kl_ce else 'different'} accuracies" + \
            (", as the row softmax implies." if same_kl_ce else ".")
    cosine = table4[table4.distance == "cosine"]
    if len(cosine):
        from studies.paper import paper_table

        p1 = paper_table("fedctta_table1").set_index(["method", "dataset", "setting", "tta"])["mean"]
        p_avg, p_loc = p1[("FedAvg", "cifar10", "niid", "grad")], p1[("Local", "cifar10", "niid", "grad")]
        other = table4[table4.distance != "euclidean"]["paper"]
        text += (f" Cosine similarities lie in [-1, 1], so their row softmax stays near uniform (no two weights of a "
                 f"row differ by more than a factor e^2): the cosine cells "
                 f"average {cosine['mean'].mean():.2f}%, {_points(cosine['mean'].mean(), avg)} from FedAvg and "
                 f"{_points(cosine['mean'].mean(), loc)} from Local. The paper's own non-Euclidean cells "
                 f"({other.min():.2f}-{other.max():.2f}) sit "
                 f"near its FedAvg ({p_avg:.2f}) and below its Local ({p_loc:.2f}) in the same setting (Table I, NIID "
                 "TTA-grad), which a near-uniform W would also produce.")
    if grad_refs:
        gap = abs(grad_refs["FedAvg"] - grad_refs["Local"])
        text += (f" Under TTA-grad on this stream (SGD lr 1e-4) Local and FedAvg differ by {gap:.2f} points "
                 f"(TTA-bn: {abs(avg - loc):.2f}), so W has much less to act on there; that is why the grid uses "
                 "TTA-bn.")
    out.append(text)
    by_k = interval.groupby("interval")["accuracy"].mean()
    by_b = batch.groupby(["strategy", "batch"])["accuracy"].mean().unstack("strategy")
    best_b = int(by_b["fedctta"].idxmax())
    out.append(f"**Fig. 5 on digits.** Aggregating every step gives {by_k.iloc[0]:.2f}%, every {by_k.index[-1]} "
               f"steps {by_k.iloc[-1]:.2f}% ({_points(by_k.iloc[-1], by_k.iloc[0])}). Across batch sizes FedCTTA is "
               f"best at batch {best_b} ({by_b['fedctta'].max():.2f}%) and "
               f"{'above' if (by_b['fedctta'] > by_b['fedavg']).all() else 'not always above'} FedAvg at every size.")
    if len(cost):
        big = cost[cost.clients == cost.clients.max()].set_index("strategy")
        ratio = big.loc["FedTSA", "s_per_round"] / big.loc["FedCTTA", "s_per_round"]
        how = " (extrapolated from fewer timed server steps)" if bool(big.loc["FedTSA", "extrapolated"]) else ""
        text = (f"**Server cost.** At {int(cost.clients.max())} clients a FedTSA round (100 server steps) takes "
                f"{big.loc['FedTSA', 's_per_round']:.1f} s{how}, {ratio:.0f}x FedCTTA's "
                f"{big.loc['FedCTTA', 's_per_round']:.3f} s (FedAvg: {big.loc['FedAvg', 's_per_round']:.3f} s), "
                f"and FedTSA holds {big.loc['FedTSA', 'held_bytes'] / 2**20:.1f} MB between rounds against "
                f"{big.loc['FedCTTA', 'held_bytes']:.0f} B for FedCTTA.")
        if rounds is not None and len(rounds):
            late = rounds[rounds["round"] >= 10]
            flat = all(g.retained_bytes.nunique() == 1 for _, g in late.groupby("strategy"))
            text += (f" From round 10 to round {int(rounds['round'].max())} the memory held "
                     f"{'stays constant for every strategy' if flat else 'still changes for some strategy'}.")
        out.append(text + " FedCTTA's own cost sits where the probes run: N x 64 forwards per round.")
    have = set(table1.strategy) if len(table1) else set()
    parts = []
    if {"fedctta", "fedtsa", "fedavg"} <= have:
        m = table1.groupby(["tta", "setting", "strategy"])["accuracy"].mean()
        for (tta, setting) in sorted({(t, s) for t, s, _ in m.index}):
            row = m.loc[(tta, setting)]
            if {"fedctta", "fedtsa", "fedavg"} <= set(row.index):
                parts.append(f"TTA-{tta} {setting.upper()}: FedCTTA {row['fedctta']:.2f}, FedTSA {row['fedtsa']:.2f},"
                             f" FedAvg {row['fedavg']:.2f}")
    if parts:
        out.append("**CIFAR-10-C (stored runs, mean over the seeds stored).** " + "; ".join(parts) + ".")
    else:
        out.append("**CIFAR-10-C.** The stored runs do not yet hold FedCTTA, FedTSA and FedAvg for one column, so "
                   "whether FedCTTA beats them on our setup, as the paper claims, is still open (see the "
                   "missing-runs table).")
    if table3 is not None and ("FedCTTA", "ours") in table3.index:
        gain = table3["gain over No-Adapt"]
        ours = gain.xs("ours", level="who").drop("No-Adapt")
        best = ours.idxmax()
        text = (f"**Table III (the paper's orders).** Over No-Adapt, FedCTTA gains {gain[('FedCTTA', 'ours')]:.2f} "
                f"points here and {gain[('FedCTTA', 'paper')]:.2f} in the paper; the best of ours is {best} "
                f"({ours[best]:.2f})")
        if ("pFedGraph", "paper") in gain.index and ("pFedGraph", "ours") in gain.index:
            text += (f", and pFedGraph gains {gain[('pFedGraph', 'ours')]:.2f} here against "
                     f"{gain[('pFedGraph', 'paper')]:.2f} in the paper")
        out.append(text + ". " + case_study_order(table3))
    if fig2 and any(len(t) for t in fig2.values()):
        out.append(heterogeneity_reading(fig2))
    return "\n\n".join(out)


def case_study_order(table3: pd.DataFrame) -> str:
    """The methods that both we and the paper ran, ranked by mean accuracy over the slots both have, ours beside the
    paper's, and whether the two orders agree (``table3``: ``tables.beside_fedctta_table3``)."""
    means = table3["mean (slots run)"].unstack("who")
    both = means.dropna()
    if len(both) < 2:
        return "Too few methods are in both our case study and the paper's Table III to compare orders."
    ranked = {who: " > ".join(f"{m} {both.loc[m, who]:.2f}" for m in both[who].sort_values(ascending=False).index)
              for who in ("ours", "paper")}
    same = list(both["ours"].sort_values().index) == list(both["paper"].sort_values().index)
    return (f"Ranked by the mean over the slots: ours {ranked['ours']}; the paper's {ranked['paper']} "
            f"({'the same order' if same else 'a different order'}).")


def heterogeneity_reading(fig2: Mapping[str, pd.DataFrame]) -> str:
    """Fig. 2's claims checked on the sweeps: each strategy's change from the lowest to the highest SH (TH), which
    drops most, and at how many points FedCTTA is the best of the strategies stored there."""
    from studies.paper import METHOD_LABELS

    label = lambda s: METHOD_LABELS.get(s, s)  # noqa: E731
    parts = []
    for field, table in fig2.items():
        if not len(table):
            continue
        means = table.groupby([field, "variant"])["accuracy"].mean().unstack()
        lo, hi = means.index.min(), means.index.max()
        if len(means) < 2:
            parts.append(f"{field.upper()}: only {lo:g} stored so far")
            continue
        change = (means.loc[hi] - means.loc[lo]).dropna().sort_values()
        best = means.idxmax(axis=1)
        unchanged = [label(s) for s, d in change.items() if abs(d) < 0.005]
        text = (f"{field.upper()} from {lo:g} to {hi:g}: " +
                ", ".join(f"{label(s)} {d:+.2f}" for s, d in change.items()) + " points (" +
                (f"largest drop: {label(change.index[0])}" if change.iloc[0] < 0 else "no strategy loses accuracy") +
                (f"; unchanged: {', '.join(unchanged)}" if unchanged else "") + ")")
        if "fedctta" in means:
            text += (f"; FedCTTA is the best of the {means.shape[1]} strategies stored at "
                     f"{int((best == 'fedctta').sum())} of {len(means)} points (best elsewhere: " +
                     ", ".join(f"{label(b)} at {v:g}" for v, b in best.items() if b != "fedctta") + ")")
        parts.append(text)
    return "**Fig. 2 (robustness, CIFAR-10-C).** " + "; ".join(parts) + "."


__all__ = ["TABLE4_CELLS", "TABLE4_FACTORS", "Variant", "FedCTTARound", "fedctta_round", "cluster_groups", "clean_probe_images", "run_live", "live_grid",
           "table4_variants", "split_table4", "interval_variants", "batch_size_variants", "temperature_variants", "distance_contrast", "reading",
           "heterogeneity_reading"]
