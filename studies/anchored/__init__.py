"""Beyond the papers: is collaboration worth it once a client cannot drift? (issue 56)

In the drift cell of FedTSA's Table 1 protocol (Tent on all parameters, running BN, Adam 3e-4: the cell chosen
after seeing results where Local drifts below TTA-bn, ``fedtsa.step_rule.POST_HOC_STEP``) the source-anchored
FedProx gains more over Local than any strategy of Table 1. None of the five papers compares its strategy with a
client that simply cannot drift. This study crosses the anchored local methods (``CLIENTS``) with Local and the
strategies of ``STRATEGIES``, NIID and IID, at ``SEEDS``, and asks, with the statistics module's paired intervals:

1. each strategy's gain over Local, with a plain client and with each anchored client (``gains_table``);
2. whether the best federated result beats the best local one, per setting (``best_table``). The two bests are
   picked on the study's own seeds, a choice made after seeing them: the pair is labelled post hoc and compared
   again on ``REPLICATION_SEEDS``, seeds no choice of this study saw, once the setting's grid is complete
   (``replication_runs``, ``replication_table``);
3. what collaboration costs in uploaded bytes for what it gains (``cost_table``).

The design, stated before any of its runs (each anchor's strength comes from its own paper or from a stored run,
never from this study's outcomes):

- ``plain``: Tent itself (the drift cell's client); its runs are the stored Table 1 runs
  (``figures/fedtsa_table1/runs``, read, never rewritten).
- ``prox``: ``tentprox`` with ``mu = 1``: the strength of the stored ``fedprox_source`` runs whose gain raised the
  question (``strategies.fedprox_source`` default), so "Local + prox" is that anchor without a server.
- ``restore``: ``tentrestore`` with ``p = 0.01``: CoTTA's restore probability for CIFAR-10-C (Wang et al. 2022).
- ``fisher``: ``eata`` with ``select_samples=False``: EATA's Fisher regulariser alone, ``fisher_alpha = 1`` (the
  reference configuration's CIFAR-10-C value, ``tta.eata`` default) on the Fisher of 500 source images.
- ``reset``: ``rdumb``: RDumb's T = 1,000 steps would never fire in a 750-step run, so its period is chosen by a
  rule on Local alone at the held-out seed ``fedtsa.step_rule.HELD_OUT_SEED`` (NIID), as the step size was: the
  period of ``RESET_GRID`` with the highest Local accuracy there (``reset_selection``); no strategy's run enters.

The paper's own TTA-grad cell (``CHECK_CELL``: SGD 1e-4, batch BN) is run at one seed (``CHECK_SEED``) as a check
that the answer is not an artefact of the drift cell. ``python -m studies.anchored`` plans every missing run
(``FTTA_PLAN``) and runs them, the grid and each setting's replication before the check cell, planning again until
nothing is missing (``plan_and_run``; resumable: stored runs are skipped, each run is stored as it finishes).
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import pandas as pd

from ftta_core import stats
from ftta_core.experiment import ExperimentConfig
from studies.fedtsa.step_rule import CELL, HELD_OUT_SEED, POST_HOC_STEP, REPLICATION_SEEDS
from studies.fedtsa.table1 import table1_config
from ftta_core.workbook import strategy_comparison

REPO = Path(__file__).resolve().parents[2]
RUNS_DIR = REPO / "figures" / "anchored" / "runs"
TABLE1_RUNS = REPO / "figures" / "fedtsa_table1" / "runs"
DATASET = "cifar10"
SETTINGS = ("niid", "iid")
SEEDS = (0, 1, 2)
STRATEGIES = ("local", "fedavg", "fedtsa", "fedctta", "pfedgraph")
DRIFT_STEP = POST_HOC_STEP
CHECK_CELL, CHECK_SEED = "grad", 0
RESET_GRID = (50, 150, 375)  # 15, 5 and 2 resets in a 750-step run
# client -> (local method, its parameters beyond the cell's, why this strength): stated before any run
CLIENTS: Dict[str, Tuple[str, Dict[str, Any], str]] = {
    "plain": ("tent", {}, "the drift cell's client"),
    "prox": ("tentprox", {"mu": 1.0}, "mu of the stored fedprox_source runs"),
    "restore": ("tentrestore", {"p": 0.01}, "CoTTA's p for CIFAR-10-C"),
    "fisher": ("eata", {"select_samples": False, "fisher_alpha": 1.0, "fisher_source": "resnet8_cifar10",
                        "fisher_samples": 500}, "EATA's CIFAR-10-C fisher_alpha, 500 source images"),
    "reset": ("rdumb", {}, "period chosen on Local at the held-out seed (reset_selection)"),
}


def client_config(client: str, setting: str, cell: str = CELL, lr: Optional[float] = DRIFT_STEP,
                  reset_every: Optional[int] = None) -> ExperimentConfig:
    """The Table 1 protocol config of ``client`` in ``cell`` (``lr``: the cell's step instead of its own; None: the
    cell's), strategy 'local' and seed 0 (the grid sets both). ``reset_every``: the ``reset`` client's period."""
    if client not in CLIENTS:
        raise ValueError(f"client must be one of {sorted(CLIENTS)}, got {client!r}")
    base = table1_config(DATASET, setting, cell, lr=lr)
    local, extra, _ = CLIENTS[client]
    if client == "reset":
        if reset_every is None:
            raise ValueError("the reset client needs reset_every (reset_selection picks it)")
        extra = {**extra, "reset_every": int(reset_every)}
    if client == "plain":
        return base
    return dataclasses.replace(base, local=local, local_params={**base.local_params, **extra})


def _grid(cfg: ExperimentConfig, strategies: Sequence[str], seeds: Sequence[int], only_cached: bool) -> pd.DataFrame:
    RUNS_DIR.mkdir(parents=True, exist_ok=True)
    out = strategy_comparison(cfg, strategies, seeds, results_dir=RUNS_DIR, only_cached=only_cached,
                              also_read=[TABLE1_RUNS])
    return out.rename(columns={"variant": "strategy"})


def reset_selection(only_cached: bool = True) -> pd.DataFrame:
    """Local with the ``reset`` client at each period of ``RESET_GRID`` on the held-out seed (NIID): one row per
    period with its accuracy (NaN while a run is missing)."""
    rows = []
    for period in RESET_GRID:
        g = _grid(client_config("reset", "niid", reset_every=period), ["local"], [HELD_OUT_SEED], only_cached)
        rows.append({"reset_every": period, "accuracy": float(g["accuracy"].iloc[0]) if len(g) else float("nan")})
    return pd.DataFrame(rows)


def chosen_reset(table: pd.DataFrame) -> Optional[int]:
    """The period the rule picks (highest held-out Local accuracy; ties: the longer period), None while a selection
    run is missing."""
    if table["accuracy"].isna().any():
        return None
    best = table["accuracy"].max()
    return int(table.loc[table["accuracy"] == best, "reset_every"].max())


def study_runs(only_cached: bool = True, clients: Sequence[str] = tuple(CLIENTS)) -> pd.DataFrame:
    """Every run of the study (the drift cell at ``SEEDS`` and the check cell at ``CHECK_SEED``): one row per
    (cell, setting, client, strategy, seed) with the summary's accuracy and upload bytes. The ``reset`` client is
    left out until ``reset_selection`` has picked its period."""
    period = chosen_reset(reset_selection(only_cached))
    frames = []
    for cell, lr, seeds in ((CELL, DRIFT_STEP, SEEDS), (CHECK_CELL, None, (CHECK_SEED,))):
        for setting in SETTINGS if cell == CELL else ("niid",):
            for client in clients:
                if client == "reset" and period is None:
                    continue
                cfg = client_config(client, setting, cell, lr, reset_every=period)
                g = _grid(cfg, STRATEGIES, seeds, only_cached)
                frames.append(g.assign(cell=cell, setting=setting, client=client))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# the Table 1 strategies in both settings before pFedGraph in either: every client's answer then covers NIID and IID
PLAN_ORDER = (("niid", ("local", "fedavg", "fedtsa", "fedctta")), ("iid", ("local", "fedavg", "fedtsa", "fedctta")),
              ("niid", ("pfedgraph",)), ("iid", ("pfedgraph",)))


def plan_in_order(clients: Sequence[str] = tuple(CLIENTS), check: bool = True) -> None:
    """Ask for every run of the study in the order a CPU budget should spend them (``PLAN_ORDER``): the Table 1
    strategies (NIID, then IID) before pFedGraph, one client's three seeds complete before the next client's (a
    client's verdicts need ``stats.MIN_SEEDS`` paired seeds), the check cell, then the replication of each
    complete setting's post-hoc best pair (``replication_runs``). With ``$FTTA_PLAN`` set this appends the missing
    runs to the plan in that order; the set of runs is ``study_runs``'s and ``replication_runs``'s. ``check=False``
    leaves the check cell out (``plan_and_run`` runs the answer's runs first)."""
    period = chosen_reset(reset_selection(only_cached=False))
    for setting, strategies in PLAN_ORDER:
        for client in clients:
            if client == "reset" and period is None:
                continue
            _grid(client_config(client, setting, reset_every=period), strategies, SEEDS, only_cached=False)
    # the check cell (and anything the order above left out); without the check, the stored runs are only read
    runs = study_runs(only_cached=not check, clients=clients)
    replication_runs(runs, only_cached=False)  # the post-hoc best pairs on unseen seeds, once a grid is complete


def _by_seed(runs: pd.DataFrame, client: str, strategy: str) -> pd.Series:
    here = runs[(runs.client == client) & (runs.strategy == strategy)]
    return here.set_index("seed")["accuracy"]


def gains_table(runs: pd.DataFrame, cell: str = CELL, confidence: float = stats.CONFIDENCE) -> pd.DataFrame:
    """Per setting, client and federated strategy: its gain over Local with the same client and over Local with the
    plain client, paired by seed (``stats.paired``, intervals at ``confidence``), with ``stats.comparison``'s
    verdict. For an anchored client, also Local with it over Local with the plain client (strategy 'local'): what
    the anchor gives without any collaboration."""
    rows: List[Dict[str, Any]] = []
    runs = runs[runs.cell == cell]
    for setting, here in runs.groupby("setting", sort=False):
        for client in pd.unique(here.client):
            for strategy in STRATEGIES:
                if strategy == "local" and client == "plain":
                    continue
                mine = _by_seed(here, client, strategy)
                if mine.empty:
                    continue
                pairs = ([] if strategy == "local" else [("Local, same client", client)]) \
                    + ([("Local, plain client", "plain")] if client != "plain" else [])
                for versus, base in pairs:
                    est = stats.paired(mine, _by_seed(here, base, "local"), confidence)
                    rows.append({"setting": setting, "client": client, "strategy": strategy, "versus": versus,
                                 "gain": est.mean, "low": est.low, "high": est.high, "seeds": est.n,
                                 "seed ids": tuple(int(s) for s in est.seeds), "comparison": stats.comparison(est)})
    return pd.DataFrame(rows)


def _over_same_local(gains: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``gains_table`` that compare a federated strategy with Local using the same client."""
    if gains.empty:
        return gains
    return gains[(gains.versus == "Local, same client") & (gains.strategy != "local")]


def family_table(runs: pd.DataFrame, cell: str = CELL) -> pd.DataFrame:
    """A sensitivity reading, not the rule: the grid's gains over Local with the same client (every federated
    strategy x client x setting with ``stats.MIN_SEEDS`` seeds or more) read as one family of ``m`` comparisons,
    each interval widened to confidence ``1 - (1 - stats.CONFIDENCE) / m`` (Bonferroni: the chance of any false
    'ahead' or 'behind' in the family stays under 5 %). The rule's verdict (``gains_table``) stands; this says
    which of them a skeptic who counts every comparison of the grid would still accept."""
    keys = ["setting", "client", "strategy"]
    columns = [*keys, "gain", "low", "high", "comparison", "family confidence", "family low", "family high",
               "family comparison"]

    def family(g: pd.DataFrame) -> pd.DataFrame:
        g = _over_same_local(g)
        return g if g.empty else g[g.seeds >= stats.MIN_SEEDS]

    rule = family(gains_table(runs, cell))
    if rule.empty:
        return pd.DataFrame(columns=columns)
    confidence = 1 - (1 - stats.CONFIDENCE) / len(rule)
    wide = family(gains_table(runs, cell, confidence))[[*keys, "low", "high", "comparison"]]
    out = rule[[*keys, "gain", "low", "high", "comparison"]].merge(
        wide.rename(columns={"low": "family low", "high": "family high", "comparison": "family comparison"}),
        on=keys, how="left").assign(**{"family confidence": confidence})
    return out[columns].reset_index(drop=True)


def _family_reading(family: Optional[pd.DataFrame]) -> List[str]:
    """One sentence: how many of the rule's 'ahead'/'behind' gains stay so when the grid is one family."""
    if family is None or family.empty:
        return []
    told = []
    for side in ("ahead", "behind"):
        rule = family[family.comparison == side]
        if rule.empty:
            continue
        kept = rule[rule["family comparison"] == side]
        names = ", ".join(f"{r['setting'].upper()} {r['strategy']} + {r['client']}" for r in kept.to_dict("records"))
        told.append(f"{len(kept)} of the {len(rule)} '{side}' stay {side}" + (f" ({names})" if names else ""))
    return [f"Read as one family (a sensitivity reading; the verdicts above are the rule's): the {len(family)} gains "
            f"over Local with the same client, each interval at {100 * family['family confidence'].iloc[0]:.3f} % "
            f"(Bonferroni): " + ("; ".join(told) or "none is ahead or behind under the rule") + "."]


def _bests(here: pd.DataFrame) -> Optional[Tuple[Tuple[str, str], str]]:
    """((client, strategy) of the best federated mean, client of the best Local mean) of one setting's runs, among
    the cells with every seed of ``SEEDS`` (a mean of fewer seeds is not compared with means of three); None when
    either side has no such cell."""
    here = here[here.seed.isin(SEEDS)]
    complete = here.groupby(["client", "strategy"])["seed"].nunique() == len(SEEDS)
    means = here.groupby(["client", "strategy"])["accuracy"].mean()[complete[complete].index]
    local = means[means.index.get_level_values("strategy") == "local"]
    fed = means[means.index.get_level_values("strategy") != "local"]
    if local.empty or fed.empty:
        return None
    return fed.idxmax(), local.idxmax()[0]


def best_table(runs: pd.DataFrame, cell: str = CELL) -> pd.DataFrame:
    """Per setting: the best federated (client, strategy) by mean accuracy against the best local client (cells
    with every seed of ``SEEDS``), paired by seed, with ``stats.comparison``. The two bests are picked on the means
    of these very runs (post hoc), so the row says which they are; the interval is for that pair
    (``replication_table`` tests it on unseen seeds)."""
    rows = []
    runs = runs[runs.cell == cell]
    for setting, here in runs.groupby("setting", sort=False):
        picked = _bests(here)
        if picked is None:
            continue
        (fc, fs), lc = picked
        est = stats.paired(_by_seed(here, fc, fs), _by_seed(here, lc, "local"))
        rows.append({"setting": setting, "best federated": f"{fs} + {fc}",
                     "its accuracy": _by_seed(here, fc, fs).mean(), "best local": f"local + {lc}",
                     "local accuracy": _by_seed(here, lc, "local").mean(), "difference": est.mean,
                     "low": est.low, "high": est.high, "seeds": est.n, "comparison": stats.comparison(est)})
    return pd.DataFrame(rows)


def grid_count(runs: pd.DataFrame, setting: str, cell: str = CELL) -> Tuple[int, int]:
    """(stored, expected) runs of ``setting``'s grid in ``cell``: every client x strategy at ``SEEDS``."""
    expected = {(c, st, seed) for c in CLIENTS for st in STRATEGIES for seed in SEEDS}
    if not len(runs):
        return 0, len(expected)
    here = runs[(runs.cell == cell) & (runs.setting == setting)]
    stored = {(c, st, int(seed)) for c, st, seed in zip(here.client, here.strategy, here.seed)}
    return len(stored & expected), len(expected)


def best_pairs(runs: pd.DataFrame, cell: str = CELL) -> Dict[str, Tuple[Tuple[str, str], str]]:
    """Per setting whose grid is complete (``grid_count``): the pair ``best_table`` picked, ((client, strategy) of
    the best federated mean, the best local client). A setting with runs missing picks nothing yet: a pick made
    on part of the grid could change as runs land."""
    out = {}
    for setting in SETTINGS:
        stored, expected = grid_count(runs, setting, cell)
        if stored == expected:
            picked = _bests(runs[(runs.cell == cell) & (runs.setting == setting)])
            if picked is not None:
                out[setting] = picked
    return out


def replication_runs(runs: pd.DataFrame, only_cached: bool = True) -> pd.DataFrame:
    """The pairs of ``best_pairs`` run again at ``REPLICATION_SEEDS`` (with ``$FTTA_PLAN``: the missing runs are
    planned); one row per run as in ``study_runs``. Stored plain-client runs at those seeds are read back."""
    period = chosen_reset(reset_selection(only_cached))
    frames = []
    for setting, ((fed_client, fed_strategy), local_client) in best_pairs(runs).items():
        wanted: Dict[str, List[str]] = {local_client: ["local"]}
        wanted.setdefault(fed_client, []).append(fed_strategy)
        for client, strategies in wanted.items():
            g = _grid(client_config(client, setting, reset_every=period), strategies, REPLICATION_SEEDS,
                      only_cached)
            frames.append(g.assign(cell=CELL, setting=setting, client=client))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def replication_table(runs: pd.DataFrame, replication: pd.DataFrame) -> pd.DataFrame:
    """Per setting: the post-hoc pair of ``best_pairs`` (picked on ``SEEDS``) compared again on
    ``REPLICATION_SEEDS`` (``stats.paired``, ``stats.comparison``); 'status' says what it waits for."""
    rows = []
    picked = best_pairs(runs)
    for setting in SETTINGS:
        stored, expected = grid_count(runs, setting)
        row: Dict[str, Any] = {"setting": setting, "replication seeds": tuple(REPLICATION_SEEDS)}
        if setting not in picked:
            rows.append({**row, "status": f"waits for the complete grid ({stored} of {expected} runs stored)"})
            continue
        (fc, fs), lc = picked[setting]
        here = replication[replication.setting == setting] if len(replication) else replication
        fed = _by_seed(here, fc, fs) if len(here) else pd.Series(dtype=float)
        local = _by_seed(here, lc, "local") if len(here) else pd.Series(dtype=float)
        est = stats.paired(fed, local)
        done = est.n == len(REPLICATION_SEEDS)
        rows.append({**row, "best federated": f"{fs} + {fc}", "best local": f"local + {lc}",
                     "difference": est.mean, "low": est.low, "high": est.high, "seeds": est.n,
                     "comparison": stats.comparison(est),
                     "status": "replicated" if done else
                     f"waits for runs ({est.n} of {len(REPLICATION_SEEDS)} seeds paired)"})
    table = pd.DataFrame(rows)
    if "seeds" in table:  # a count: a waiting row's NaN must not make it 3.0
        table["seeds"] = table["seeds"].astype("Int64")
    return table


def check_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The check: each pair of ``gains_table`` (NIID) in the paper's TTA-grad cell (``CHECK_CELL``) at ``CHECK_SEED``
    beside the same pair in the drift cell at that seed and the drift cell's verdict over ``SEEDS``. One seed gives
    no interval, so the check cell has no verdict: each gain gets a ``stats.direction`` (beyond ``stats.MARGIN`` or
    within it) and 'agree' says whether both cells point the same way at ``CHECK_SEED`` (NaN while a run is
    missing)."""
    keys = ["setting", "client", "strategy", "versus"]
    columns = [*keys, "check cell gain", "check cell direction", "drift cell gain, same seed",
               "drift cell direction, same seed", "drift cell gain", "drift cell verdict", "agree"]
    check = gains_table(runs, CHECK_CELL)
    if check.empty:
        return pd.DataFrame(columns=columns)
    out = check[keys + ["gain"]].rename(columns={"gain": "check cell gain"})
    out = out.merge(gains_table(runs[runs.seed == CHECK_SEED], CELL)[keys + ["gain"]].rename(
        columns={"gain": "drift cell gain, same seed"}), on=keys, how="left")
    out = out.merge(gains_table(runs, CELL)[keys + ["gain", "comparison"]].rename(
        columns={"gain": "drift cell gain", "comparison": "drift cell verdict"}), on=keys, how="left")
    out["check cell direction"] = out["check cell gain"].map(stats.direction)
    out["drift cell direction, same seed"] = out["drift cell gain, same seed"].map(stats.direction)
    paired = out["check cell gain"].notna() & out["drift cell gain, same seed"].notna()
    out["agree"] = (out["check cell direction"] == out["drift cell direction, same seed"]).where(paired)
    return out[columns]


def _check_reading(check: Optional[pd.DataFrame]) -> List[str]:
    """One sentence on the TTA-grad check: per direction, how many of its gains point that way, and how many agree
    with the drift cell at ``CHECK_SEED`` (no sentence while no check run is paired)."""
    if check is None or check.empty:
        return []
    both = check.dropna(subset=["agree"])
    if both.empty:
        return []
    counts = both["check cell direction"].value_counts()
    told = ", ".join(f"{int(counts[d])} {d}" for d in ("ahead", "behind", "within the margin") if d in counts)
    return [f"Check, the paper's TTA-grad cell at seed {CHECK_SEED} (NIID; one seed: no interval, no verdict): of "
            f"{len(both)} gains paired with the drift cell at that seed, {told} (margin ±{stats.MARGIN:g}); "
            f"{int(both['agree'].astype(bool).sum())} point the same way as in the drift cell."]


def cost_table(runs: pd.DataFrame, gains: pd.DataFrame, cell: str = CELL) -> pd.DataFrame:
    """Per setting, strategy and client: the megabytes each client uploads per step (from the run records) beside
    the strategy's gain over Local with the same client (``gains_table``: its interval and verdict), one row per
    pair with a gain (settings are never averaged together)."""
    runs = runs[runs.cell == cell]
    keys = ["setting", "strategy", "client"]
    up = (runs.groupby(keys)["upload_bytes_per_client_step"].mean() / 1e6).rename("MB uploaded per client step")
    same = gains[gains.versus == "Local, same client"].set_index(keys)[["gain", "low", "high", "comparison"]]
    return pd.concat([up, same.rename(columns={"gain": "gain over Local"})], axis=1, join="inner").reset_index()


def reading(gains: pd.DataFrame, best: pd.DataFrame, replication: Optional[pd.DataFrame] = None,
            check: Optional[pd.DataFrame] = None, family: Optional[pd.DataFrame] = None) -> str:
    """The answer in sentences computed from ``gains``, ``best``, ``replication`` (``replication_table``),
    ``check`` (``check_table``) and ``family`` (``family_table``); no sentence is printed without its rows."""
    if gains.empty:
        return "No run of the anchored-client study is stored yet (python -m studies.anchored runs them)."
    lines = []
    same = _over_same_local(gains)
    for setting, here in same.groupby("setting", sort=False):
        ahead = here[here.comparison == "ahead"]
        per_client = {c: sorted(g.strategy) for c, g in ahead.groupby("client")}
        told = "; ".join(f"{c}: {', '.join(s)}" for c, s in per_client.items()) or "none"
        lines.append(f"{setting.upper()}: strategies ahead of Local with the same client (95 % interval above 0), "
                     f"by client: {told} (of {len(here)} pairs, {int((here.seeds < stats.MIN_SEEDS).sum())} with "
                     f"fewer than {stats.MIN_SEEDS} seeds).")
    for r in best.to_dict("records"):
        lines.append(f"{r['setting'].upper()}: best federated {r['best federated']} ({r['its accuracy']:.2f}) minus "
                     f"best local {r['best local']} ({r['local accuracy']:.2f}) = {r['difference']:+.2f} "
                     f"[{r['low']:+.2f}, {r['high']:+.2f}] ({r['seeds']} seeds): {r['comparison']} (both picked "
                     "on these runs' means: post hoc).")
    lines += _replication_reading(replication)
    lines += _drift_reading(gains)
    lines += _family_reading(family)
    lines += _check_reading(check)
    return "\n".join(lines)


def _replication_reading(replication: Optional[pd.DataFrame]) -> List[str]:
    """One sentence per setting: the post-hoc best pair on the unseen seeds, or what its replication waits for."""
    lines = []
    for r in ([] if replication is None else replication.to_dict("records")):
        seeds = ", ".join(map(str, r["replication seeds"]))
        if r["status"] != "replicated":
            pair = f" of {r['best federated']} against {r['best local']}" if isinstance(r.get("best federated"),
                                                                                          str) else ""
            lines.append(f"{r['setting'].upper()}: the replication{pair} on unseen seeds {seeds} {r['status']}.")
            continue
        lines.append(f"{r['setting'].upper()}: replicated on unseen seeds {seeds}: {r['best federated']} minus "
                     f"{r['best local']} = {r['difference']:+.2f} [{r['low']:+.2f}, {r['high']:+.2f}] "
                     f"({int(r['seeds'])} seeds): {r['comparison']}.")
    return lines


def _drift_reading(gains: pd.DataFrame) -> List[str]:
    """Which of the papers' gains survive a client that cannot drift, computed from ``gains``: per setting, what
    each anchor gives alone (Local with it minus Local with the plain client), then, for every strategy ahead of
    Local with the plain client (the papers' comparison), its verdict over Local with each anchored client. A pair
    with fewer than ``stats.MIN_SEEDS`` seeds is counted as waiting for runs, never read."""
    lines = []
    for setting, here in gains.groupby("setting", sort=False):
        alone = here[(here.strategy == "local") & (here.seeds >= stats.MIN_SEEDS)]
        if not alone.empty:
            told = "; ".join(f"{r['client']} {r['gain']:+.2f} [{r['low']:+.2f}, {r['high']:+.2f}] ({r['comparison']})"
                             for r in alone.to_dict("records"))
            lines.append(f"{setting.upper()}: the anchor alone (Local with it minus Local with the plain client): "
                         f"{told}.")
        same = _over_same_local(here)
        papers = same[(same.client == "plain") & (same.comparison == "ahead") & (same.seeds >= stats.MIN_SEEDS)]
        for client in [c for c in pd.unique(same.client) if c != "plain"]:
            mine = same[(same.client == client) & same.strategy.isin(papers.strategy)].set_index("strategy")
            read = mine[mine.seeds >= stats.MIN_SEEDS]
            if read.empty:
                continue
            groups = {verdict: sorted(read.index[read.comparison == verdict]) for verdict in ("ahead", "behind")}
            rest = sorted(set(read.index) - set(groups["ahead"]) - set(groups["behind"]))
            waiting = sorted(set(papers.strategy) - set(read.index))
            parts = [f"still ahead of Local with it: {', '.join(groups['ahead'])}" if groups["ahead"] else "",
                     f"behind it (the anchor alone does better): {', '.join(groups['behind'])}"
                     if groups["behind"] else "",
                     f"no longer shown ahead (undetermined): {', '.join(rest)}" if rest else "",
                     f"waiting for runs: {', '.join(waiting)}" if waiting else ""]
            lines.append(f"{setting.upper()}, {client} client: of the strategies ahead of Local with the plain client "
                         f"({', '.join(sorted(papers.strategy))}), " + "; ".join(p for p in parts if p) + ".")
    return lines


def gains_figure(gains: pd.DataFrame) -> Any:
    """Each strategy's gain over Local with the same client, one colour per client, NIID and IID panels on one
    y-scale, 95 % interval bars over paired seeds, the ±``stats.MARGIN`` band shaded."""
    from ftta_core import plots
    from studies.paper import METHOD_LABELS

    shown = gains[gains.versus == "Local, same client"].assign(
        ci95=lambda d: (d["high"] - d["low"]) / 2, method=lambda d: d.strategy.map(METHOD_LABELS).fillna(d.strategy),
        setting=lambda d: d.setting.str.upper() + " clients").rename(columns={"gain": "gain over Local"})
    axes = plots.gains_by_panel(shown, ["setting"], hue="client", err="ci95", tie=stats.MARGIN, ncols=1,
                                panel_size=(9.0, 3.0), err_label="bar: 95 % t interval over paired seeds",
                                key_title="client (local method)")
    axes[0].figure.suptitle("What each strategy adds over Local when both use the same client, drift cell "
                            f"(running BN, Adam {DRIFT_STEP:g})")
    return axes[0].figure


def board(runs: pd.DataFrame, setting: str, cell: str = CELL) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """The anchored clients on the leaderboard: ``studies.leaderboard``'s table (mean, std, seeds, 95 % half-width
    per client x strategy, best first) of one setting of ``cell``, and the runs behind it (``local`` = the client),
    for ``leaderboard.leaderboard_heatmap``."""
    here = runs[(runs.cell == cell) & (runs.setting == setting)] if len(runs) else runs
    grid = here.rename(columns={"client": "local"})[["local", "strategy", "seed", "accuracy"]] if len(here) else \
        pd.DataFrame(columns=["local", "strategy", "seed", "accuracy"])
    from studies.leaderboard import leaderboard_table

    return leaderboard_table(grid), grid


def board_figure(runs: pd.DataFrame) -> Any:
    """One leaderboard heatmap per setting (NIID above IID) of the drift cell: rows the clients, columns the
    strategies, each cell 'mean ± 95 % half-width' with its seeds; both panels on one colour scale (``plots``)."""
    import matplotlib.pyplot as plt

    from studies.leaderboard import leaderboard_heatmap

    from ftta_core import style

    boards = {setting: board(runs, setting) for setting in SETTINGS}
    limits = style.shared_limits([table["mean"].values for table, _ in boards.values()])
    fig, axes = plt.subplots(len(SETTINGS), 1, figsize=(9.0, len(SETTINGS) * (0.6 * len(CLIENTS) + 3.2)),
                             squeeze=False)
    for ax, (setting, (table, grid)) in zip(axes[:, 0], boards.items()):
        title = f"{setting.upper()}, drift cell (running BN, Adam {DRIFT_STEP:g})"
        if table.empty:
            ax.set_axis_off()
            ax.set_title(title)
            ax.text(0.5, 0.5, "no stored run yet", ha="center", va="center", transform=ax.transAxes)
            continue
        leaderboard_heatmap(table, ax=ax, title=title, rows=list(CLIENTS), columns=list(STRATEGIES), grid=grid,
                            limits=limits)
    return fig


def plan_and_run(workers: int, plan: Path, rounds: int = 8) -> int:
    """Run every missing run of the study, the answer's first: each round plans the whole study into ``plan`` (the
    committed record of what the study asks for), then the missing grid and replication runs (``plan_in_order``
    without the check cell) into a front plan and runs those; only when none is missing does it run ``plan`` (the
    check cell). The reset client's runs can be planned only once its period is chosen, a setting's replication
    only once its grid is complete, so the rounds go on until planning adds nothing (at most ``rounds``).
    Returns run-plan's exit status."""
    import subprocess
    import sys
    import tempfile

    from ftta_core.plan import read_plan

    def planned_into(path: Path, check: bool = True) -> int:
        os.environ["FTTA_PLAN"] = str(path)
        try:
            plan_in_order(check=check)
        finally:
            os.environ.pop("FTTA_PLAN", None)
        return len(read_plan(path)) if path.exists() else 0

    def run_plan(path: Path) -> int:
        return subprocess.run([sys.executable, "-m", "ftta_core", "run-plan", str(path), "--workers", str(workers),
                               "--threads", "1"]).returncode

    ran_whole = -1
    with tempfile.TemporaryDirectory(prefix="anchored-front-") as tmp:
        front = Path(tmp) / "front.plan.jsonl"
        for _ in range(rounds):
            whole = planned_into(plan)
            front.unlink(missing_ok=True)
            if planned_into(front, check=False):
                rc = run_plan(front)  # missing grid or replication runs: the answer before the check
            elif whole in (0, ran_whole):
                return 0  # the whole plan ran and this round planned nothing new: every run is stored
            else:
                ran_whole, rc = whole, run_plan(plan)
            if rc:
                return rc
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m studies.anchored [--workers N]``: plan and run the study's missing runs (resumable)."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--plan", type=Path, default=REPO / "figures" / "anchored" / "anchored.plan.jsonl")
    args = p.parse_args(argv)
    return plan_and_run(args.workers, args.plan)


__all__ = ["CLIENTS", "STRATEGIES", "SEEDS", "SETTINGS", "RESET_GRID", "REPLICATION_SEEDS", "CHECK_CELL",
           "CHECK_SEED", "client_config", "reset_selection", "chosen_reset", "study_runs", "plan_in_order",
           "PLAN_ORDER", "gains_table", "best_table", "grid_count", "best_pairs", "replication_runs",
           "replication_table", "check_table", "cost_table", "reading",
           "gains_figure", "board", "board_figure", "plan_and_run", "main"]
