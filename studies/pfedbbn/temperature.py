"""How personal pFedBBN's mixing is: its softmax temperature T and distance scale, the rule that picks them, and
the claims of pFedBBN's Table 1 read at the picked setting.

pFedBBN's paper names a "temperature-controlled softmax" over BN-statistic distances but gives neither T nor how the
distances are normalised; T = 1 on the summed per-layer distances (our default, Eq. 7 as written) leaves the
degree of personalisation to the number of layers and the batch size. The grid: T in ``TEMPERATURES`` x scale in
``SCALES`` (``strategies.base.scale_distances``) on pFedBBN's protocol (``imbalance.pfedbbn_config``) with BBN
clients, per label-skew alpha.

The selection rule, fixed before any accuracy is read: on a held-out stream (the same protocol drawn with
``HELD_OUT_SEED``, a seed no table reports, cut to its first ``HELD_OUT_STEPS`` rounds), take the setting whose W puts the largest share of each client's
weight on the *other* clients that see the same corruption at that step (``grid.same_domain_weight``, averaged
over clients and steps); ties go to the smaller T. Accuracy is then read on the reported seeds.
Every run is a grid summary (``grid.run`` with a ``grid.SummaryStore``; with ``weight_shares``) under
``RESULTS_DIR``; ``FTTA_PLAN`` plans the missing ones for ``run-plan``. A setting is a ``variants.Variant`` whose
factors "T" and "scale" become the grid's columns (``temperature_grid``); its name (``setting_name``) is for display
only and is never read back.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import pandas as pd

from ftta_core import stats
from ftta_core.experiment import ExperimentConfig
from ftta_core.plan import REPO_DIR
from ftta_core.variants import Variant, factors_of, overrides_of

TEMPERATURES = (1.0, 2.0, 4.0, 8.0, 16.0)
SCALES = ("none", "row_median")
ALPHAS = (0.1, 0.01)
GRID_ALPHAS = (None, 0.1, 0.01, 0.001)  # pFedBBN's Table 1 columns (IID, then label skew): the whole grid
HELD_OUT_SEED = 100
CHECK_SEED = 101  # a second held-out stream: does the choice between the two best settings hold on it? (no accuracy)
HELD_OUT_STEPS = 25  # the held-out stream's first 25 of 75 rounds (5 of the 15 corruptions): W's shares, not accuracy
# in the repository, whatever the working folder (a notebook runs in notebooks/)
RESULTS_DIR = REPO_DIR / "figures" / "pfedbbn" / "runs" / "temperature"
GRID_DIR = REPO_DIR / "figures" / "pfedbbn" / "runs"  # pFedBBN's Table 1 grid: read for its runs (T = 1, references)
SHARE_COLUMNS = ("self", "same domain", "other domains", "uniform same-domain")
FACTORS = ("T", "scale")  # a setting's factors, the grid's columns (the references have none: NaN)
CHOICE_T = ["T", "runner-up T"]  # ``select_setting``'s columns for the tie-break, not for display


def setting_name(temperature: float, scale: str) -> str:
    """A setting's display name, e.g. "T=4, scale=none" (a label only: its T and scale are the variant's factors)."""
    return f"T={temperature:g}, scale={scale}"


def settings_of(variants: Mapping[str, Any]) -> List[str]:
    """The names of ``variants`` that are pFedBBN settings (a "T" factor), in order."""
    return [name for name, v in variants.items() if "T" in factors_of(v)]


def with_setting(table: pd.DataFrame) -> pd.DataFrame:
    """``table``'s rows of pFedBBN settings: those with a "T" (the factor columns of ``temperature_grid``)."""
    return table[table["T"].notna()].copy()


def bbn_base(base: ExperimentConfig, alpha: Optional[float], max_steps: Optional[int] = None) -> ExperimentConfig:
    """``base`` with BBN clients (the benchmark's settings), label skew ``alpha`` and, if given, ``max_steps``."""
    from studies.pfedbbn.imbalance import local_settings

    cfg = dataclasses.replace(base, local="bbn", local_params=local_settings("bbn", base.model_name),
                              label_alpha=alpha)
    return cfg if max_steps is None else dataclasses.replace(cfg, max_steps=max_steps)


def temperature_variants(temperatures: Sequence[float] = TEMPERATURES,
                         scales: Sequence[str] = SCALES) -> Dict[str, Variant]:
    """Grid variants: pFedBBN at every (T, scale), with factors "T" and "scale"; T = 1 and scale "none" are
    the defaults, left out of ``strategy_params`` (T = 1 with "none" is stored as the default run, found by hash)."""
    out = {}
    for scale in scales:
        for t in temperatures:
            params = {k: v for k, v in (("temperature", float(t)), ("scale", scale))
                      if (k, v) not in (("temperature", 1.0), ("scale", "none"))}
            out[setting_name(t, scale)] = Variant({"strategy": "pfedbbn", "strategy_params": params},
                                                  {"T": float(t), "scale": scale})
    return out


def reference_variants() -> Dict[str, Variant]:
    """BBN alone and FedAvg + BBN: what pFedBBN's Table 1 puts it beside (no T or scale)."""
    return {"BBN alone": Variant({"strategy": "local", "strategy_params": {}}),
            "FedAvg + BBN": Variant({"strategy": "fedavg", "strategy_params": {}})}


def temperature_grid(base: ExperimentConfig, seeds: Sequence[int], alphas: Sequence[Optional[float]] = ALPHAS,
                     variants: Optional[Mapping[str, Any]] = None,
                     results_dir: Path | str = RESULTS_DIR, only_cached: bool = False,
                     also_read: Sequence[Path | str] = (GRID_DIR,), max_steps: Optional[int] = None) -> pd.DataFrame:
    """One row per (alpha, variant, seed): the variant's factors "T" and "scale" (NaN for the references), accuracy,
    the source model's on the same stream and the mean ``weight_shares`` of the stored run (runs the missing ones
    unless ``only_cached``; with ``FTTA_PLAN`` set, plans them). ``also_read``: folders of stored runs
    read (never written) when ``results_dir`` lacks one, e.g. the Table 1 grid's BBN alone / FedAvg + BBN.
    ``max_steps``: truncate every run (the held-out stream: ``HELD_OUT_STEPS``)."""
    from ftta_core import grid

    variants = dict(variants if variants is not None else {**temperature_variants(), **reference_variants()})
    store = grid.SummaryStore(results_dir, also_read)
    frames = []
    for alpha in alphas:
        runs = grid.run(bbn_base(base, alpha, max_steps), variants, list(seeds), store, only_cached=only_cached,
                        progress=False)
        if len(runs):
            frames.append(runs.assign(alpha=alpha))
    columns = ["alpha", "variant", *FACTORS, "seed", "accuracy", "accuracy_source", *SHARE_COLUMNS]
    if not frames:
        return pd.DataFrame(columns=columns)
    table = pd.concat(frames, ignore_index=True)  # the factor columns come from the grid
    shares = _stored_shares(base, table, variants, [Path(results_dir), *map(Path, also_read)], max_steps)
    return pd.concat([table, shares], axis=1).reindex(columns=columns)


def _stored_shares(base: ExperimentConfig, table: pd.DataFrame, variants: Mapping[str, Any],
                   folders: Sequence[Path], max_steps: Optional[int] = None) -> pd.DataFrame:
    """The ``weight_shares`` of each row's stored summary (NaN for runs stored before summaries carried them)."""
    from ftta_core.runstore import read_summary
    from ftta_core.grid import stored_path

    rows = []
    for r in table.to_dict("records"):
        cfg = dataclasses.replace(bbn_base(base, r["alpha"], max_steps), **overrides_of(variants[r["variant"]]),
                                  seed=r["seed"])
        found = stored_path(cfg, folders[0], folders[1:])
        shares = read_summary(found).get("weight_shares", {}) if found is not None else {}
        rows.append({k: shares.get(k, float("nan")) for k in SHARE_COLUMNS})
    return pd.DataFrame(rows, index=table.index)


def select_setting(held_out: pd.DataFrame, settings: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """The rule, per alpha: the pFedBBN setting with the largest same-domain share on the held-out stream (ties:
    smaller T). ``held_out``: ``temperature_grid`` rows of ``HELD_OUT_SEED``. One row per alpha, with "held-out
    runs" (stored of ``settings``, the grid's setting names), the "runner-up" setting and the "margin" of the chosen
    one's share over it (how near the choice was), and last the two settings' T ("T", "runner-up T": ``CHOICE_T``,
    for the tie-break; drop them to show the table): an alpha whose held-out runs do not cover every one of
    ``settings`` gets no choice (variant missing), since a setting not run could have won."""
    rows = with_setting(held_out).sort_values(["alpha", "same domain", "T"], ascending=[True, False, True])
    first = rows.groupby("alpha", sort=False).head(1)
    chosen = first[["alpha", "variant", "same domain", "uniform same-domain", "self"]].reset_index(drop=True)
    second = rows.groupby("alpha", sort=False).nth(1).set_index("alpha")
    chosen["runner-up"] = [second["variant"].get(a) for a in chosen["alpha"]]
    chosen["margin"] = [s - second["same domain"].get(a, float("nan"))
                        for a, s in zip(chosen["alpha"], chosen["same domain"])]
    wanted = set(settings) if settings is not None else None
    stored = rows.groupby("alpha")["variant"].agg(set)
    chosen["held-out runs"] = [f"{len(stored[a] & wanted) if wanted else len(stored[a])} of "
                               f"{len(wanted) if wanted else len(stored[a])}" for a in chosen["alpha"]]
    chosen["T"] = first["T"].to_numpy()
    chosen["runner-up T"] = [second["T"].get(a, float("nan")) for a in chosen["alpha"]]
    if wanted:
        incomplete = [not wanted <= stored[a] for a in chosen["alpha"]]
        chosen.loc[incomplete, ["variant", "same domain", "uniform same-domain", "self", "runner-up", "margin",
                                *CHOICE_T]] = None
    return chosen


def choice_reading(chosen: pd.DataFrame) -> str:
    """``select_setting``'s choice per alpha in words: the setting, its held-out same-domain share against uniform
    mixing's, and its margin over the runner-up (or which held-out runs are still missing)."""
    lines = []
    for r in chosen.to_dict("records"):
        if not isinstance(r["variant"], str):
            lines.append(f"- alpha {r['alpha']:g}: no choice yet ({r['held-out runs']} held-out runs stored).")
            continue
        near = (f"; runner-up {r['runner-up']} by {r['margin']:.3f}" if isinstance(r["runner-up"], str) else "")
        lines.append(f"- alpha {r['alpha']:g}: {r['variant']} (same-domain share {r['same domain']:.3f}, uniform "
                     f"{r['uniform same-domain']:.3f}, self-weight {r['self']:.3f}{near}).")
    return "\n".join(lines)


def choice_check(chosen: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """The rule's choice and its runner-up (``select_setting``) on a second held-out stream (``second``:
    ``temperature_grid`` rows of ``CHECK_SEED``): their same-domain shares there and whether the choice is the same.
    One row per alpha whose two settings are both stored at that seed (equal shares: the smaller T, as the rule;
    the Ts are ``chosen``'s "T" and "runner-up T")."""
    rows = []
    for r in chosen.dropna(subset=["variant", "runner-up"]).to_dict("records"):
        here = second[second["alpha"] == r["alpha"]].set_index("variant")["same domain"]
        if r["variant"] in here and r["runner-up"] in here:
            a, b = here[r["variant"]], here[r["runner-up"]]
            t_chosen, t_other = r["T"], r["runner-up T"]
            rows.append({"alpha": r["alpha"], "chosen": r["variant"], "runner-up": r["runner-up"],
                         "margin (rule stream)": r["margin"], "chosen share": a, "runner-up share": b,
                         "margin (second stream)": a - b,
                         "same choice": bool(a > b or (a == b and t_chosen <= t_other))})  # the rule's tie-break
    return pd.DataFrame(rows)


def flipped_choices(chosen: pd.DataFrame, check: pd.DataFrame) -> pd.DataFrame:
    """``chosen``'s rows for the alphas whose choice ``choice_check`` found reversed on the second held-out stream,
    with the runner-up as the setting (and its T): the claims read there too say how much a verdict rests on a near
    tie."""
    flipped = check.loc[~check["same choice"].astype(bool), "alpha"] if len(check) else []
    out = chosen[chosen["alpha"].isin(list(flipped))].copy()
    out["variant"], out["T"] = out["runner-up"], out["runner-up T"]
    return out


RUNNER_UP = f"the runner-up, chosen on the second held-out stream (seed {CHECK_SEED})"


def checked_claims(reported: pd.DataFrame, chosen: pd.DataFrame, check: pd.DataFrame,
                   tie: float = stats.MARGIN) -> List[Dict[str, Any]]:
    """``pfedbbn_claims`` at the rule's choice, and at the runner-up wherever ``choice_check`` found the choice
    reversed on the second held-out stream (``flipped_choices``: chosen after seeing that stream, so "post hoc")."""
    return (pfedbbn_claims(reported, chosen, tie)
            + pfedbbn_claims(reported, flipped_choices(chosen, check), tie, RUNNER_UP, "post hoc"))


def choice_check_reading(check: pd.DataFrame, seed: int = CHECK_SEED) -> str:
    """``choice_check`` in words, per alpha."""
    if check.empty:
        return f"No alpha has its chosen setting and runner-up stored on the second held-out stream (seed {seed})."
    return "\n".join(
        f"- alpha {r['alpha']:g}, second held-out stream (seed {seed}): {r['chosen']} {r['chosen share']:.3f} "
        f"against {r['runner-up']} {r['runner-up share']:.3f} (margin {r['margin (second stream)']:+.3f}; on the "
        f"rule's stream {r['margin (rule stream)']:+.3f}): "
        + ("the same choice." if r["same choice"] else f"the rule would choose {r['runner-up']} there.")
        for r in check.to_dict("records"))


def curve(grid: pd.DataFrame) -> pd.DataFrame:
    """Mean accuracy and shares over seeds per (alpha, variant), with the number of seeds."""
    g = grid.groupby(["alpha", "variant"])
    out = g[["accuracy", *SHARE_COLUMNS]].mean()
    out["accuracy sd"] = g["accuracy"].std(ddof=1)
    out["seeds"] = g["seed"].nunique()
    return out.reset_index()


def column_label(alpha: Optional[float]) -> str:
    """A Table 1 column in a claim's words: "IID" or "alpha A"."""
    return "IID" if alpha is None or pd.isna(alpha) else f"alpha {alpha:g}"


def at_alpha(table: pd.DataFrame, alpha: Optional[float]) -> pd.DataFrame:
    """``table``'s rows in one column (``alpha`` None or NaN: the IID column, stored as a missing alpha)."""
    missing = alpha is None or pd.isna(alpha)
    return table[table["alpha"].isna()] if missing else table[table["alpha"] == alpha]


RULE_CHOSEN = "rule-chosen (pre-registered)"


def pfedbbn_claims(reported: pd.DataFrame, chosen: pd.DataFrame, tie: float = stats.MARGIN,
                   how: str = "chosen by the held-out rule", cell_class: str = RULE_CHOSEN) -> List[Dict[str, Any]]:
    """pFedBBN's Table 1 claims at the chosen setting: above BBN alone and above FedAvg + BBN per alpha (paired by
    seed), and W clustering by domain (same-domain share above the uniform one: a direction claim), as rows of
    ``fidelity.claims_table`` (``stats.paired`` and ``stats.verdict``). ``how``: how the setting was picked, said in
    each row's "settled by"; ``cell_class``: the accuracy claims' class. The W claim is always "post hoc": the
    setting was chosen to maximise that very share (on a held-out stream, but the same quantity)."""
    from studies.fidelity import claim_row
    from studies.pfedbbn.imbalance import _paper_value, paper_column
    from studies.paper import paper_table

    paper = paper_table("pfedbbn_table1")
    paper = paper[paper.dataset == "cifar10"]
    rows = []
    for pick in chosen.to_dict("records"):
        alpha, name = pick["alpha"], pick["variant"]
        if not isinstance(name, str):  # no choice yet (``select_setting``: held-out runs missing)
            continue
        alpha = None if pd.isna(alpha) else alpha
        at, column = at_alpha(reported, alpha), column_label(alpha)
        acc = lambda v: at[at["variant"] == v].set_index("seed")["accuracy"]  # noqa: E731
        where = f"pFedBBN {name} ({how}), BBN clients, {column}"
        for ref, strategy in (("BBN alone", "None-Fed"), ("FedAvg + BBN", "FedAvg")):
            theirs = (_paper_value(paper, "pFedBBN", "BBN", alpha) - _paper_value(paper, strategy, "BBN", alpha)
                      if paper_column(alpha) is not None else float("nan"))
            rows.append(claim_row(f"pFedBBN above {ref}, {column}", "pFedBBN Table 1", theirs,
                             stats.paired(acc(name), acc(ref)), tie, where, cell_class=cell_class))
        sh = at[at["variant"] == name].set_index("seed")
        rows.append(claim_row(f"pFedBBN's W clusters by domain (same-domain share minus uniform, in points), {column}",
                         "pFedBBN Fig 5 (no number: 'clusters')", float("nan"),
                         stats.paired(100 * sh["same domain"], 100 * sh["uniform same-domain"]), tie, where,
                         cell_class="post hoc", kind="direction"))  # the claim: above uniform
    return rows


def pooled_shares(held_out: pd.DataFrame, settings: Sequence[str], alphas: Sequence[float] = ALPHAS) -> pd.DataFrame:
    """The rule over the held-out alphas at once, for the one setting the whole grid runs at: each of ``settings``'
    same-domain share on the held-out stream per alpha and their mean, best first (ties: smaller T, ``held_out``'s
    factor column). Empty until every setting has its held-out run at every alpha (a setting not run could have
    won)."""
    rows = held_out[held_out["variant"].isin(list(settings))]
    wide = rows.pivot_table(index="variant", columns="alpha", values="same domain")
    if not set(settings) <= set(wide.index) or not set(alphas) <= set(wide.columns) or wide.isna().any().any():
        return pd.DataFrame(columns=[*(column_label(a) for a in alphas), "mean"])
    wide = wide[list(alphas)].rename(columns=column_label)
    wide["mean"] = wide.mean(axis=1)
    order = wide.assign(T=rows.groupby("variant")["T"].first())  # each setting's factor, by variant name
    return order.sort_values(["mean", "T"], ascending=[False, True]).drop(columns="T")


WHOLE_GRID = "one setting for the whole grid: the held-out rule over the study's alphas at once"


def whole_grid_claims(reported: pd.DataFrame, grid_rows: pd.DataFrame, setting: str, tie: float = stats.MARGIN,
                      read_alphas: Sequence[Optional[float]] = GRID_ALPHAS,
                      skip: Sequence[float] = ()) -> List[Dict[str, Any]]:
    """pFedBBN at ``setting`` (``pooled_shares``' first) in every column of its Table 1 grid (``read_alphas``):
    ``pfedbbn_claims`` per column (except the alphas in ``skip``, whose own choice is read already), and "best or
    near-best": pFedBBN minus the best of the grid's other cells (every method x server but pFedBBN), paired by
    seed, beside the paper's difference in that column. ``reported``: ``temperature_grid`` rows at the columns with
    ``setting`` and the references; ``grid_rows``: ``imbalance.run_rows`` of the stored Table 1 grid. Every row is
    "post hoc": the pooled rule was stated after the per-alpha accuracies were stored (notebook 30)."""
    from studies.fidelity import claim_row
    from studies.paper import paper_table
    from studies.pfedbbn.imbalance import STRATEGY_LABELS, METHOD_LABELS, paper_column

    paper = paper_table("pfedbbn_table1")
    paper = paper[paper.dataset == "cifar10"]
    kept = [a for a in read_alphas if len(at_alpha(reported, a)) and (a is None or a not in skip)]
    rows = pfedbbn_claims(reported, pd.DataFrame({"alpha": kept, "variant": setting}), tie, WHOLE_GRID, "post hoc")
    for alpha in read_alphas:
        mine = at_alpha(reported, alpha)
        ours = mine[mine["variant"] == setting].set_index("seed")["accuracy"]
        cells = at_alpha(grid_rows, alpha)
        cells = cells[~((cells["method"] == "bbn") & (cells["strategy"] == "pfedbbn"))]
        if cells.empty:
            continue
        best = cells.groupby("seed")["accuracy"].max()
        top = cells.groupby(["strategy", "method"])["accuracy"].mean().idxmax()
        theirs = paper[paper["column"] == paper_column(alpha)]
        others = theirs[(theirs["strategy"] != "pFedBBN") & (theirs["method"] != "Source")]
        paper_gap = (float(theirs.loc[theirs["strategy"] == "pFedBBN", "accuracy"].iloc[0]) - others["accuracy"].max()
                     if len(others) else float("nan"))
        rows.append(claim_row(f"pFedBBN minus the best other method x server of Table 1 (best or near-best under skew), "
                         f"{column_label(alpha)}", "pFedBBN Table 1", paper_gap, stats.paired(ours, best), tie,
                         f"pFedBBN {setting} ({WHOLE_GRID}) against the best of "
                         f"{len(cells.groupby(['strategy', 'method']))} other cells "
                         f"({METHOD_LABELS.get(top[1], top[1])} + {STRATEGY_LABELS.get(top[0], top[0])} on average), "
                         f"{column_label(alpha)}",
                         cell_class="post hoc"))
    return rows


def source_gains(reported: pd.DataFrame, chosen: pd.DataFrame) -> pd.DataFrame:
    """Each pFedBBN claim's two sides as gains over the source model on the same stream, ours beside the paper's
    Table 1 (its Source row): per alpha with a choice, BBN alone, FedAvg + BBN and the chosen pFedBBN setting, ours
    the mean over the seeds all three have. pFedBBN above BBN alone is the difference of two rows here, so the table
    says whether a gap to the paper's margin lies in the reference, in pFedBBN, or in both."""
    from studies.paper import paper_table
    from studies.pfedbbn.imbalance import _paper_value

    paper = paper_table("pfedbbn_table1")
    paper = paper[paper.dataset == "cifar10"]
    rows = []
    for pick in chosen.to_dict("records"):
        alpha, name = pick["alpha"], pick["variant"]
        if not isinstance(name, str):
            continue
        alpha = None if pd.isna(alpha) else alpha
        at = at_alpha(reported, alpha)
        compared = {"BBN alone": ("None-Fed", "BBN alone"), "FedAvg + BBN": ("FedAvg", "FedAvg + BBN"),
                    f"pFedBBN {name}": ("pFedBBN", name)}
        seeds = sorted(set.intersection(*[set(at.loc[at["variant"] == v, "seed"]) for _, v in compared.values()]))
        if not seeds:
            continue
        mine = at[at["seed"].isin(seeds)]
        source = mine[mine["variant"] == "BBN alone"].set_index("seed")["accuracy_source"]
        paper_source = _paper_value(paper, "Any", "Source", alpha)
        rows.append({"alpha": alpha, "row": "source model", "ours": source.mean(), "paper": paper_source,
                     "seeds": len(seeds)})
        for label, (strategy, variant) in compared.items():
            acc = mine[mine["variant"] == variant].set_index("seed")["accuracy"]
            rows.append({"alpha": alpha, "row": f"{label} - source", "ours": (acc - source).mean(),
                         "paper": _paper_value(paper, strategy, "BBN", alpha) - paper_source, "seeds": len(seeds)})
    return pd.DataFrame(rows, columns=["alpha", "row", "ours", "paper", "seeds"])


def source_gains_reading(gains: pd.DataFrame) -> str:
    """``source_gains`` in words, per alpha: each side's gain over the source model, ours against the paper's, and
    how much of the difference between our pFedBBN-above-BBN-alone margin and the paper's each side makes."""
    lines = []
    for alpha, g in gains.groupby("alpha", sort=False, dropna=False):
        by = g.set_index("row")
        ref, mine = by.loc["BBN alone - source"], by.loc[[r for r in by.index if r.startswith("pFedBBN")][0]]
        gap = (mine["ours"] - ref["ours"]) - (mine["paper"] - ref["paper"])
        lines.append(
            f"- {column_label(alpha)} ({int(ref['seeds'])} seed(s)): the source model {by.loc['source model', 'ours']:.2f} "
            f"(paper {by.loc['source model', 'paper']:.2f}); BBN alone {ref['ours']:+.2f} from it (paper "
            f"{ref['paper']:+.2f}), pFedBBN {mine['ours']:+.2f} (paper {mine['paper']:+.2f}). Our pFedBBN-above-"
            f"BBN-alone margin is {gap:+.2f} from the paper's: {mine['ours'] - mine['paper']:+.2f} of it from "
            f"pFedBBN's gain, {-(ref['ours'] - ref['paper']):+.2f} from BBN alone's.")
    return "\n".join(lines)


def stored_claims(results_dir: Path | str = RESULTS_DIR, grid_dir: Path | str = GRID_DIR,
                  seeds: Sequence[int] = (0, 1, 2), tie: float = stats.MARGIN) -> List[Dict[str, Any]]:
    """``pfedbbn_claims`` from the study's stored runs on pFedBBN's full protocol (nothing runs), for each alpha whose
    held-out runs are all stored (``select_setting`` makes no choice for the others); where the second held-out
    stream reverses the choice (``choice_check``), the claims at the runner-up too; and, once every held-out run is
    stored, the pooled setting's claims on the whole grid (``whole_grid``)."""
    from studies.pfedbbn.imbalance import pfedbbn_config

    base = pfedbbn_config(dataset="cifar10")
    held = temperature_grid(base, [HELD_OUT_SEED], ALPHAS, temperature_variants(), results_dir, True, (grid_dir,),
                            HELD_OUT_STEPS)
    if held.empty:
        return []
    reported = temperature_grid(base, seeds, ALPHAS, None, results_dir, True, (grid_dir,))
    chosen = select_setting(held, list(temperature_variants()))
    second = temperature_grid(base, [CHECK_SEED], ALPHAS, temperature_variants(), results_dir, True, (grid_dir,),
                              HELD_OUT_STEPS)
    claims = checked_claims(reported, chosen, choice_check(chosen, second), tie)
    pooled = pooled_shares(held, list(temperature_variants()))
    if len(pooled):
        whole, grid_rows = whole_grid(base, pooled.index[0], seeds, results_dir, grid_dir)
        claims += whole_grid_claims(whole, grid_rows, pooled.index[0], tie, skip=ALPHAS)
    return claims


def whole_grid(base: ExperimentConfig, setting: str, seeds: Sequence[int], results_dir: Path | str = RESULTS_DIR,
               grid_dir: Path | str = GRID_DIR, only_cached: bool = True,
               alphas: Sequence[Optional[float]] = GRID_ALPHAS,
               max_steps: Optional[int] = None) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """pFedBBN at ``setting`` with its references in every column (``alphas``; runs the missing ones unless
    ``only_cached``, plans them under ``FTTA_PLAN``), and ``imbalance.run_rows`` of the stored Table 1 grid."""
    from ftta_core.workbook import stored_summaries
    from studies.pfedbbn.imbalance import run_rows, table1_variants

    runs = temperature_grid(base, seeds, alphas, {setting: temperature_variants()[setting], **reference_variants()},
                            results_dir, only_cached, (grid_dir,), max_steps)
    return runs, run_rows(stored_summaries(base, table1_variants(base, alphas=alphas), seeds, Path(grid_dir)))


# the distance scales in words, for figures (``strategies.base.scale_distances``)
SCALE_LABELS = {"none": "distances as summed (no scaling)", "row_median": "distances / each client's median",
                "count": "distances / number of layers"}


def curve_figure(grid: pd.DataFrame, held_out: Optional[pd.DataFrame] = None) -> "Any":
    """Accuracy (top row) and the same-domain share of W (bottom row) against T (the factor column of
    ``temperature_grid``), one line per distance scale (``SCALE_LABELS``), one column per alpha, rows sharing their
    y-scale: means over the reported seeds with 95 % t intervals where a point has several (open marker: one
    seed), the seeds of every point under the x axis (``style.seed_strip``); where the Ts of a scale were run at
    different seeds, also the mean over the seeds every T has, so the curve is read on one set of streams; BBN
    alone and FedAvg + BBN (no T) as dashed/dotted references; the held-out stream's shares (what the rule reads)
    as open squares. Returns the figure."""
    import matplotlib.pyplot as plt

    from ftta_core import style

    alphas = sorted(grid["alpha"].unique(), reverse=True)
    fig, axes = plt.subplots(2, len(alphas), figsize=(min(style.MAX_WIDTH, 4.6 * len(alphas) + 1), 8.2),
                             squeeze=False, sharey="row",
                             sharex=True, layout="constrained")
    pf = with_setting(grid)
    pf["same-domain share"] = pf["same domain"]
    scales = list(pd.unique(pf["scale"]))
    looks = dict(zip(scales, style.distinct(len(scales))))
    name = lambda scale: SCALE_LABELS.get(scale, scale)  # noqa: E731
    for k, alpha in enumerate(alphas):
        top, bottom = axes[0, k], axes[1, k]
        here = pf[pf["alpha"] == alpha]
        drawn = style.errorbar_lines(top, here, "T", "accuracy", hue="scale", labels=SCALE_LABELS, interval="ci95",
                                     looks=looks)
        for scale, g in here.groupby("scale"):  # where the Ts have different seeds, also the seeds they all have
            common = set.intersection(*[set(v) for v in g.groupby("T")["seed"].unique()])
            if common and len(common) < g["seed"].nunique() and g["T"].nunique() > 1:
                on = g[g["seed"].isin(common)].groupby("T")["accuracy"].mean()
                top.plot(on.index, on.values, "x:", lw=1, color=looks[scale][0],
                         label=f"{name(scale)}: mean over {style.seed_text(common)}, which every T has")
        style.errorbar_lines(bottom, here, "T", "same-domain share", hue="scale", labels=SCALE_LABELS,
                             interval="ci95", looks=looks)
        refs = grid[(grid["alpha"] == alpha) & grid["T"].isna()]  # the references: no T
        for (ref, g), ls in zip(refs.groupby("variant"), ("--", ":")):
            top.axhline(g["accuracy"].mean(), color="0.3", ls=ls, lw=1,
                        label=f"{ref} ({style.seed_text(g['seed'].unique())})")
        uniform = here["uniform same-domain"].mean()
        if pd.notna(uniform):
            bottom.axhline(uniform, color="0.3", ls="--", lw=1, label="uniform mixing (FedAvg)")
        if held_out is not None and len(held_out):
            h = with_setting(held_out[held_out["alpha"] == alpha])
            for scale, g in h.groupby("scale"):
                g = g.sort_values("T")
                bottom.plot(g["T"], g["same domain"], "s--", mfc="white", lw=0.8,
                            color=looks.get(scale, ("0.4", "s"))[0],
                            label=f"{name(scale)}, held-out stream ({style.seed_text(g['seed'].unique())}: what "
                                  "the rule reads)")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(here["T"].unique()), [f"{t:g}" for t in sorted(here["T"].unique())])
            ax.minorticks_off()
        bottom.set_xlabel("softmax temperature T")
        style.seed_strip(bottom, [(looks[s][1], looks[s][0], dict(zip(d["T"], d["seeds"])))
                                  for s, d in drawn.groupby("scale", sort=False)], glyphs=k == 0)
        top.set_title(f"label skew alpha = {alpha:g}")
        top.set_xlabel("")
        top.set_ylabel("accuracy (%)")
        bottom.set_ylabel("same-domain share of W")
    key: Dict[str, Any] = {}  # one key for both rows, below the panels (a scale's line is the same in both)
    for ax in axes[:, -1]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            key.setdefault(label, handle)
    fig.legend(key.values(), key.keys(), loc="outside lower center", ncols=2, frameon=False,
               title="pFedBBN's distance scale, references and the held-out stream ("
                     + style.interval_note(style.mean_sd(pf, "T", "accuracy", "scale"))
                     + "; the seeds of each point under the x axis)")
    fig.suptitle("How personal should pFedBBN's mixing be? Accuracy and W's same-domain share against the "
                 "temperature T", fontsize=plt.rcParams["axes.titlesize"])
    return fig


__all__ = ["curve_figure", "stored_claims", "TEMPERATURES", "SCALES", "ALPHAS", "HELD_OUT_SEED", "HELD_OUT_STEPS",
           "CHECK_SEED", "RUNNER_UP", "RESULTS_DIR", "temperature_variants", "reference_variants", "temperature_grid",
           "select_setting", "choice_reading", "choice_check", "choice_check_reading", "flipped_choices",
           "checked_claims", "with_setting", "settings_of", "setting_name", "FACTORS", "CHOICE_T", "pooled_shares",
           "whole_grid", "whole_grid_claims", "column_label", "at_alpha", "GRID_ALPHAS",
           "source_gains", "source_gains_reading", "curve", "pfedbbn_claims", "bbn_base", "SCALE_LABELS"]
