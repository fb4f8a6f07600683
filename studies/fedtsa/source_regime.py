"""Which regime the papers' source model is in: our source models' accuracy per corruption beside FedTSA's No-Adapt.

FedTSA reports 35.19% without adaptation on CIFAR-10-C for the Fling ResNet-8, ours scores 63.45% (the same
architecture; FedCTTA's Table I reports 58.47% for it). Two explanations predict different shapes: a model that is
*less robust* (e.g. one working at a higher resolution, hurt more by noise) loses most on some corruptions and
little on others, while a *weaker* model (lower clean accuracy, e.g. a shorter training) loses a similar fraction on
every corruption. This module lays the per-corruption accuracies of any of our source models (read from their
cards, ``data/checkpoints/*.json``) beside the paper's No-Adapt row (FedTSA Table 2, its per-corruption table of
the same protocol) and computes, per model, the paper's accuracy as a fraction of ours on each corruption (mean and
spread) and the rank correlation of the two profiles; the reading says which of our models is nearest in level.
Nothing here runs: train a model with ``python -m ftta_core train-source`` (its card carries the numbers).

``conclusions_by_model`` then asks which of our Table 1 conclusions change with the source model: the same protocol
run on the shipped model and on one in the paper's regime (``study fedtsa table --model NAME``), each strategy's gain over
Local paired by seed, and whether its sign (beyond a tie) is the same on both models.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import pandas as pd

from studies.paper import METHOD_LABELS, TTA_SETTINGS, paper_table, paper_tta
from studies.fedtsa.table1 import PAPER_T1_LABEL, source_model_label, step_text

PAPER = "fedtsa_table2"
PAPER_ROW = "No-Adapt"
PAPER_LABEL = "FedTSA No-Adapt"


def paper_profile(table: str = PAPER, method: str = PAPER_ROW) -> pd.Series:
    """The paper's accuracy per corruption (severity 5) for ``method`` (its printed mean left out)."""
    t = paper_table(table)
    rows = t[(t.method == method) & (t.corruption != "mean")]
    return rows.set_index("corruption")["accuracy"].astype(float)


def card_profile(name: str, directory: Path | str) -> Dict[str, object]:
    """A source model's card numbers: clean accuracy and accuracy per corruption at severity 5."""
    card = json.loads((Path(directory) / f"{name}.json").read_text())
    return {"clean": float(card["clean_test_accuracy"]),
            "corruptions": pd.Series(card["corrupted_accuracy_severity5"], dtype=float),
            "epochs": card.get("epochs", card.get("spec", {}).get("epochs"))}


def regime_table(names: Sequence[str], directory: Path | str) -> pd.DataFrame:
    """Rows: the 15 corruptions, then their mean and the clean accuracy; columns: each model, then the paper's."""
    paper = paper_profile()
    cols = {}
    for name in names:
        prof = card_profile(name, directory)
        acc = prof["corruptions"].reindex(paper.index)
        cols[name] = pd.concat([acc, pd.Series({"mean": acc.mean(), "clean": prof["clean"]})])
    cols[PAPER_LABEL] = pd.concat([paper, pd.Series({"mean": paper.mean(), "clean": float("nan")})])
    return pd.DataFrame(cols)


def regime_summary(names: Sequence[str], directory: Path | str) -> pd.DataFrame:
    """Per model: clean and mean corrupted accuracy; the paper's accuracy as a fraction of the model's on each
    corruption (median, mean, sd, min, max); the Spearman rank correlation of the two 15-corruption profiles; the mean
    absolute difference from the paper in points."""
    paper = paper_profile()
    rows = []
    for name in names:
        prof = card_profile(name, directory)
        acc = prof["corruptions"].reindex(paper.index)
        ratio = paper / acc
        rows.append({"model": name, "epochs": prof["epochs"], "clean": prof["clean"], "corrupted mean": acc.mean(),
                     "paper / model median": ratio.median(), "paper / model mean": ratio.mean(),
                     "paper / model sd": ratio.std(ddof=1),
                     "paper / model min": ratio.min(), "paper / model max": ratio.max(),
                     "spearman": acc.corr(paper, method="spearman"),
                     "mean |difference|": (acc - paper).abs().mean()})
    return pd.DataFrame(rows).set_index("model")


def regime_reading(summary: pd.DataFrame, same_shape: float = 0.9) -> str:
    """What the summary says, computed: per model the paper's fraction of its accuracy and the rank correlation
    (``same_shape``: the Spearman correlation from which the two profiles are called the same ranking), and which
    model is nearest the paper in level."""
    if summary.empty:
        return "No source model card to compare."
    parts = []
    for name, r in summary.iterrows():
        ranking = "the same ranking of corruptions" if r["spearman"] >= same_shape else "a different ranking"
        parts.append(f"`{name}` (clean {r['clean']:.2f}%, corrupted mean {r['corrupted mean']:.2f}%): the paper's "
                     f"No-Adapt is {r['paper / model median']:.2f} of it on the median corruption (mean "
                     f"{r['paper / model mean']:.2f} ± {r['paper / model sd']:.2f}, from {r['paper / model min']:.2f} "
                     f"to {r['paper / model max']:.2f}), Spearman "
                     f"{r['spearman']:.2f} ({ranking}), {r['mean |difference|']:.2f} points apart on average")
    nearest = summary["mean |difference|"].idxmin()
    text = ("; ".join(parts) + f". Nearest to the paper in level: `{nearest}` "
            f"({summary.loc[nearest, 'mean |difference|']:.2f} points per corruption).")
    if len(summary) >= 3:  # does a weaker model (lower clean accuracy) sit nearer the paper's profile?
        level = summary["clean"].corr(summary["mean |difference|"], method="spearman")
        rank = summary["clean"].corr(summary["spearman"], method="spearman")
        nearer = ("the lower a model's clean accuracy, the nearer it is to the paper's level" if level > 0 else
                  "a lower clean accuracy does not bring a model nearer the paper's level")
        ranking = ("less" if rank > 0 else "more") + " its corruptions rank like the paper's"
        text += (f" Across these {len(summary)} models {nearer} (Spearman of clean accuracy and distance "
                 f"{level:+.2f}) and the {ranking} (Spearman of clean accuracy and rank correlation {rank:+.2f}; "
                 f"rank correlations from {summary['spearman'].min():.2f} to {summary['spearman'].max():.2f}).")
    return text


def adaptation_profiles(results_dir: Path | str, models: Sequence[str], reference: str = "resnet8_cifar10",
                        seeds: Sequence[int] = (0, 1, 2, 3, 4)) -> pd.DataFrame:
    """Per corruption, each model's accuracy without adaptation and with TTA-bn Local on the Table 1 protocol (read
    from the stored TTA-bn runs: every such run carries both, before any mixing; mean over the seeds stored, one run
    per seed), beside the paper's No-Adapt and Local rows (FedTSA Table 2). Long form: model, quantity
    (``no adaptation`` / ``TTA-bn Local``), corruption, accuracy, seeds, stale (runs made by code changed since)."""
    from studies.fedtsa.table1 import stored_table1_runs

    rows = []
    for model in models:
        grid = stored_table1_runs(results_dir, list(METHOD_LABELS), seeds, ttas=("bn",),
                                  model=None if model == reference else model, extra_keys=("accuracy_by_domain",))
        if grid.empty or "accuracy_by_domain" not in grid:
            continue
        grid = grid.dropna(subset=["accuracy_by_domain"])  # one run per seed, a current one where there is
        grid = grid.sort_values("code", key=lambda c: c.ne("current"), kind="stable").drop_duplicates("seed")
        stale = int((grid["code"] == "stale").sum())
        for quantity, key in (("no adaptation", "source"), ("TTA-bn Local", "local")):
            per_seed = pd.DataFrame([d[key] for d in grid["accuracy_by_domain"]])
            for corruption, acc in per_seed.mean().items():
                rows.append({"model": model, "quantity": quantity, "corruption": corruption, "accuracy": acc,
                             "seeds": len(per_seed), "stale": stale})
    paper = paper_table(PAPER)
    paper = paper[paper.corruption != "mean"]
    for quantity, row in (("no adaptation", PAPER_ROW), ("TTA-bn Local", "Local")):
        for _, r in paper[paper.method == row].iterrows():
            rows.append({"model": PAPER_ADAPT_LABEL, "quantity": quantity, "corruption": r["corruption"],
                         "accuracy": float(r["accuracy"]), "seeds": float("nan"), "stale": 0})
    return pd.DataFrame(rows, columns=["model", "quantity", "corruption", "accuracy", "seeds", "stale"])


PAPER_ADAPT_LABEL = "FedTSA (Table 2)"


def adaptation_summary(profiles: pd.DataFrame) -> pd.DataFrame:
    """Per model (from ``adaptation_profiles``): mean accuracy without adaptation and with TTA-bn Local over the 15
    corruptions, Local's gain over no adaptation, no adaptation as a fraction of Local (mean over corruptions), and,
    for each quantity, the Spearman rank correlation with the paper's profile and the mean absolute difference."""
    wide = profiles.pivot_table(index="corruption", columns=["quantity", "model"], values="accuracy")
    meta = profiles.groupby("model")[["seeds", "stale"]].max()
    rows = []
    for model in profiles["model"].unique():
        na, local = wide[("no adaptation", model)], wide[("TTA-bn Local", model)]
        row = {"model": model, "seeds": meta.loc[model, "seeds"], "stale runs": meta.loc[model, "stale"],
               "no adaptation": na.mean(), "TTA-bn Local": local.mean(), "Local gain": (local - na).mean(),
               "no adaptation / Local": (na / local).mean()}
        for quantity, short in (("no adaptation", "no adapt."), ("TTA-bn Local", "Local")):
            mine, paper = wide[(quantity, model)], wide[(quantity, PAPER_ADAPT_LABEL)]
            row[f"{short} spearman"] = mine.corr(paper, method="spearman")
            row[f"{short} mean |difference|"] = (mine - paper).abs().mean()
        rows.append(row)
    return pd.DataFrame(rows).set_index("model")


def adaptation_reading(summary: pd.DataFrame, near: float = 5.0) -> str:
    """Computed from ``adaptation_summary``: how much TTA-bn Local adds over no adaptation for the paper and for
    each model, and which model is nearest the paper's Local in level and in ranking; ``near``: the mean
    per-corruption distance (points) under which a model counts as at the paper's level."""
    if PAPER_ADAPT_LABEL not in summary.index or len(summary) < 2:
        return "No stored TTA-bn run to set beside the paper's No-Adapt and Local rows."
    paper, ours = summary.loc[PAPER_ADAPT_LABEL], summary.drop(PAPER_ADAPT_LABEL)
    parts = [f"`{m}` {r['no adaptation']:.2f} -> {r['TTA-bn Local']:.2f} ({r['Local gain']:+.2f}, "
             f"{seeds_text(r['seeds'])}{', ' + str(int(r['stale runs'])) + ' stale' if r['stale runs'] else ''})"
             for m, r in ours.iterrows()]
    text = (f"TTA-bn Local over no adaptation, mean of 15 corruptions: the paper {paper['no adaptation']:.2f} -> "
            f"{paper['TTA-bn Local']:.2f} ({paper['Local gain']:+.2f}; no adaptation is "
            f"{paper['no adaptation / Local']:.2f} of Local); ours " + "; ".join(parts) + ". ")
    larger = ours[ours["Local gain"] >= paper["Local gain"]]
    text += (f"{len(larger)} of our {len(ours)} models gain as much from TTA-bn as the paper's model. "
             if len(larger) else
             f"None of our {len(ours)} models gains as much from TTA-bn as the paper's model (largest gain "
             f"{ours['Local gain'].max():+.2f}, `{ours['Local gain'].idxmax()}`). ")
    level, rank = ours["Local mean |difference|"].idxmin(), ours["Local spearman"].idxmax()
    text += (f"Nearest the paper's Local in level: `{level}` ({ours.loc[level, 'Local mean |difference|']:.2f} "
             f"points per corruption); in ranking: `{rank}` (Spearman {ours.loc[rank, 'Local spearman']:.2f}). ")
    both = ours[(ours["Local mean |difference|"] < near) & (ours["no adapt. mean |difference|"] < near)]
    text += (("Within " + f"{near:g} points of the paper on both rows: " + ", ".join(f"`{m}`" for m in both.index)
              + ".") if len(both) else
             f"No model of ours is within {near:g} points per corruption of the paper on both rows.")
    return text


def _sign(x: float, tie: float) -> str:
    return "tie" if pd.isna(x) or abs(x) < tie else ("+" if x > 0 else "-")


CONCLUSION_COLUMNS = ["tta", "setting", "method", "model", "gain over Local", "sd", "seeds", "same sign", "seed ids"]
LOCAL_VS_BN = "Local (vs TTA-bn Local)"  # a gradient cell's Local minus TTA-bn's Local, in the gain column
STEP_SEPARATOR = " @ "  # "grad-running-adam @ 0.0003": a gradient cell at a step size other than its own


def step_label(cell: str, lr: Optional[float] = None) -> str:
    """The ``tta`` label of a TTA cell in the conclusions' tables: the cell's name, with `` @ lr`` when it ran at a
    step size other than its own (``fidelity.DRIFT_STEP``'s 3e-4 for ``grad-running-adam``)."""
    return cell if lr is None else f"{cell}{STEP_SEPARATOR}{lr:g}"


def cell_of(label: str) -> str:
    """The TTA cell (a ``paper.TTA_SETTINGS`` key) a ``step_label`` names."""
    return label.split(STEP_SEPARATOR)[0]


def stored_by_step(results_dir: Path | str, strategies: Sequence[str], seeds: Sequence[int],
                   steps: Sequence[tuple], model: Optional[str] = None) -> pd.DataFrame:
    """``table1.stored_table1_runs`` of one source model for several (cell, lr) pairs (lr None: the cell's own),
    their ``tta`` column set to ``step_label(cell, lr)``, so one cell at two step sizes stays two columns."""
    from studies.fedtsa.table1 import stored_table1_runs
    parts = [stored_table1_runs(results_dir, strategies, seeds, ttas=(cell,), model=model, lr=lr)
             .assign(tta=step_label(cell, lr)) for cell, lr in steps]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def paper_table1_gains(dataset: str = "cifar10") -> pd.DataFrame:
    """The paper's gain over Local per (tta, setting, method) from its Table 1 means (rows as in
    ``conclusions_by_model``, model ``PAPER_T1_LABEL``; seeds: the paper's 5). Our TTA cells are compared with the
    paper's TTA mode they stand for (``paper.paper_tta``)."""
    paper = paper_table("fedtsa_table1")
    paper = paper[paper.dataset == dataset]
    rows = []
    for (tta, setting), g in paper.groupby(["tta", "setting"]):
        means = g.set_index("method")["mean"]
        if "Local" not in means:
            continue
        rows += [{"tta": tta, "setting": setting, "method": m, "model": PAPER_T1_LABEL,
                  "gain over Local": float(v - means["Local"]), "seeds": 5}
                 for m, v in means.items() if m not in ("Local", "No-Adapt")]
        bn = paper[(paper.tta == "bn") & (paper.setting == setting) & (paper.method == "Local")]["mean"]
        if tta != "bn" and len(bn):
            rows.append({"tta": tta, "setting": setting, "method": LOCAL_VS_BN, "model": PAPER_T1_LABEL,
                         "gain over Local": float(means["Local"] - bn.iloc[0]), "seeds": 5})
    return pd.DataFrame(rows, columns=["tta", "setting", "method", "model", "gain over Local", "seeds"])


def conclusions_by_model(grids: Dict[str, pd.DataFrame], reference: str, tie: float = 0.5) -> pd.DataFrame:
    """Each strategy's gain over Local per (tta, setting) on every source model, from ``grids`` (model name ->
    ``table1.stored_table1_runs`` of that model): mean over the seeds both Local and the strategy have on that
    model (paired), its sd over those seeds (NaN with one seed, and for the paper's rows), the seeds (how many, and
    last which: ``seed ids``), and whether the sign (``tie``: |gain| below it is a tie) equals the one on
    ``reference`` (the model the workbook's other tables use). One row per (tta, setting, strategy, model), for the
    (tta, setting, strategy) that have runs on ``reference`` and on another model, plus the paper's gain in that cell
    (model ``PAPER_T1_LABEL``, from ``paper_table1_gains``) where its Table 1 has the method. In a gradient cell a
    row ``LOCAL_VS_BN`` holds Local minus TTA-bn's Local (paired by seed; the paper's: its TTA-grad Local minus its
    TTA-bn Local)."""
    rows = []
    for model, grid in grids.items():
        if grid.empty:
            continue
        for (tta, setting), g in grid.groupby(["tta", "setting"]):
            by = g.pivot_table(index="seed", columns="strategy", values="accuracy")
            if "local" in by:
                local = by["local"]
            else:  # under TTA-bn every run's accuracy before mixing is Local's; under a gradient cell it is not
                local = (g.groupby("seed")["accuracy_local"].first() if tta == "bn"
                         else pd.Series(dtype=float, index=pd.Index([], name="seed")))
            gains = {METHOD_LABELS.get(s, s): by[s] - local for s in by.columns if s != "local"}
            bn = grid[(grid.tta == "bn") & (grid.setting == setting)].groupby("seed")["accuracy_local"].first()
            if tta != "bn" and len(bn):  # TTA-bn's Local is any TTA-bn run's accuracy before mixing
                gains[LOCAL_VS_BN] = local - bn
            for method, gain in gains.items():
                gain = gain.dropna()
                rows.append({"tta": tta, "setting": setting, "method": method, "model": model,
                             "gain over Local": gain.mean() if len(gain) else float("nan"),
                             "sd": gain.std() if len(gain) > 1 else float("nan"), "seeds": len(gain),
                             "seed ids": tuple(int(seed) for seed in gain.index)})
    if not rows:
        return pd.DataFrame(columns=CONCLUSION_COLUMNS)
    table = pd.DataFrame(rows)
    table = table[table.seeds > 0]  # a method with no seed paired with Local says nothing
    if table.empty:
        return pd.DataFrame(columns=CONCLUSION_COLUMNS)
    paper = paper_table1_gains()  # the paper's gains in the same cells, its TTA mode standing for our cells
    paper = [paper[paper.tta == paper_tta(cell_of(tta))].assign(tta=tta) for tta in table.tta.unique()
             if cell_of(tta) in TTA_SETTINGS]
    if paper:
        paper = pd.concat(paper, ignore_index=True)
        keys = set(zip(table.tta, table.setting, table.method))
        table = pd.concat([table, paper[[k in keys for k in zip(paper.tta, paper.setting, paper.method)]]],
                          ignore_index=True)
    on_models = table.groupby(["tta", "setting", "method"])["model"].transform(
        lambda m: m[m != PAPER_T1_LABEL].nunique())
    table = table[(on_models > 1) & table.groupby(["tta", "setting", "method"])["model"].transform(
        lambda m: (m == reference).any())]  # only what can be compared with the reference
    ref = table[table.model == reference].set_index(["tta", "setting", "method"])["gain over Local"]
    table["same sign"] = [
        None if key not in ref.index or pd.isna(r) else _sign(r, tie) == _sign(ref[key], tie)
        for key, r in zip(zip(table.tta, table.setting, table.method), table["gain over Local"])]
    return table.sort_values(["tta", "setting", "method", "model"]).reset_index(drop=True)[CONCLUSION_COLUMNS]


def conclusions_reading(table: pd.DataFrame, reference: str, tie: float = 0.5) -> str:
    """Which gains over Local keep their sign when the source model changes, computed from
    ``conclusions_by_model``; names the cells with fewer than two seeds."""
    paper = table[table.model == PAPER_T1_LABEL].set_index(["tta", "setting", "method"])["gain over Local"]
    table = table[table.model != PAPER_T1_LABEL]
    other = table[(table.model != reference) & table["same sign"].notna()]
    if other.empty:
        return (f"No (tta, setting, method) has runs on both `{reference}` and another source model yet: "
                "nothing to compare.")
    ref = table[table.model == reference].set_index(["tta", "setting", "method"])
    parts, changed, few = [], [], 0
    for key, rows in other.groupby(["tta", "setting", "method"], sort=True):
        ref_seeds = int(ref.loc[key, "seeds"])
        quantity = "Local − TTA-bn Local" if key[2] == LOCAL_VS_BN else f"{key[2]} − Local"
        head = (f"TTA-{key[0]} {key[1].upper()} {quantity}: {ref.loc[key, 'gain over Local']:+.2f} "
                f"({seeds_text(ref_seeds)}) on `{reference}`")
        on = {r["model"]: f"{r['gain over Local']:+.2f} ({seeds_text(r['seeds'])}) on `{r['model']}`"
              for _, r in rows.iterrows()}
        parts.append(head + ", " + ", ".join(on.values()))
        changed += [f"{head}, {on[r['model']]}" for _, r in rows.iterrows() if not r["same sign"]]
        few += int((rows["seeds"].clip(upper=ref_seeds) < 2).sum())
    verdict = (f"{len(changed)} of {len(other)} gains over Local change sign (or turn into / out of a tie of "
               f"±{tie}) with the source model" + (": " + "; ".join(changed) if changed else "") + ".")
    agree = []
    for model, m in table.groupby("model", sort=False):
        keyed = [(k, g) for k, g in zip(zip(m.tta, m.setting, m.method), m["gain over Local"]) if k in paper.index]
        same = [k for k, g in keyed if _sign(g, tie) == _sign(paper[k], tie)]
        if keyed:
            agree.append(f"`{model}` {len(same)} of {len(keyed)}")
    against = (f" Signs that agree with the paper's Table 1 gain over Local in the same cell: " + ", ".join(agree)
               + "." if agree else "")
    return (verdict + against + " " + _best_reading(pd.concat([table, paper.reset_index().assign(
        model=PAPER_T1_LABEL)]), reference) + " All compared: " + "; ".join(parts) + "."
            + (f" {few} of them rest on a single seed on one model." if few else ""))


def step_name(cell: str, lr: Optional[float] = None) -> str:
    """A TTA cell at a step size in words for a figure: "TTA-bn", "gradient TTA, Adam 1e-05"."""
    if cell == "bn":
        return "TTA-bn"
    params = TTA_SETTINGS[cell]["local_params"]
    return f"gradient TTA, {str(params['optimizer']).capitalize()} {step_text(params['lr'] if lr is None else lr)}"


def conclusions_figure(table: pd.DataFrame, steps: Sequence[tuple]) -> "Any":
    """``conclusions_by_model`` as one panel per setting (NIID above IID) on one y-scale: the TTA cells at their step
    sizes (``steps``: (cell, lr) pairs, in this order) as groups of methods, each source model a series named from
    its card (``table1.source_model_label``) with the 95 % t interval over its paired seeds (the seeds named in the
    key, or under each point where a model's points rest on different seeds), the paper's Table 1 gain as black
    crosses, the ±0.5 tie band shaded. Returns the figure."""
    import matplotlib.pyplot as plt

    from ftta_core import plots, stats, style

    names = {step_label(cell, lr): step_name(cell, lr) for cell, lr in steps}
    shown = table[table.tta.isin(list(names))].copy()
    shown = shown.sort_values("tta", key=lambda t: t.map(list(names).index), kind="stable")
    shown["ci95"] = stats.t_half_width(shown["sd"], shown["seeds"])
    shown = shown.assign(tta=shown.tta.map(names), setting=shown.setting.str.upper() + " clients",
                         model=[m if m == PAPER_T1_LABEL else source_model_label(m) for m in shown.model])
    shown = shown.sort_values("setting", ascending=False, kind="stable")  # NIID first, as the paper's columns
    axes = plots.gains_by_panel(shown, ["setting"], group="tta", err="ci95", marker_hue=PAPER_T1_LABEL,
                                tie=stats.MARGIN, ncols=1, sort=False, panel_size=(style.MAX_WIDTH, 3.6),
                                x_labels={LOCAL_VS_BN: "Local − TTA-bn Local"}, key_title="source model",
                                err_label="bar: 95 % t interval over paired seeds")
    axes[0].figure.suptitle("Do our conclusions change with the source model? Each method's gain over Local, paired "
                            "by seed", fontsize=plt.rcParams["axes.titlesize"])
    return axes[0].figure


def _model_label(model: str) -> str:
    return "the paper" if model == PAPER_T1_LABEL else f"`{model}`"


def seeds_text(n: int) -> str:
    """``n`` seeds in words: "1 seed", "3 seeds"."""
    return f"{int(n)} seed" + ("" if int(n) == 1 else "s")


def _best_reading(table: pd.DataFrame, reference: str) -> str:
    """Per (tta, setting): the method with the largest gain over Local on each model, and its margin over the
    runner-up, so a change of winner is visible next to how close the race was."""
    lines = []
    for (tta, setting), g in table[table.method != LOCAL_VS_BN].groupby(["tta", "setting"]):
        by_model = {}
        for model, m in g.dropna(subset=["gain over Local"]).groupby("model"):
            ranked = m.sort_values("gain over Local", ascending=False)
            if len(ranked) > 1:  # a race needs two methods
                by_model[model] = (ranked["method"].iloc[0],
                                   ranked["gain over Local"].iloc[0] - ranked["gain over Local"].iloc[1])
        if reference not in by_model or len(by_model) < 2:
            continue
        ref_best, ref_margin = by_model[reference]
        others = [f"{_model_label(model)} {best} (by {margin:.2f}{'; a different method' if best != ref_best else ''})"
                  for model, (best, margin) in by_model.items() if model != reference]
        lines.append(f"TTA-{tta} {setting.upper()}: best over Local on `{reference}` {ref_best} (by "
                     f"{ref_margin:.2f}), on " + ", ".join(others))
    return ("Best method per cell: " + "; ".join(lines) + ".") if lines else ""


__all__ = ["paper_profile", "card_profile", "regime_table", "regime_summary", "regime_reading",
           "adaptation_profiles", "adaptation_summary", "adaptation_reading", "conclusions_by_model",
           "conclusions_reading", "seeds_text", "step_label", "cell_of", "stored_by_step", "conclusions_figure",
           "step_name", "PAPER_T1_LABEL", "source_model_label"]
