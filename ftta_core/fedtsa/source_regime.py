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
run on the shipped model and on one in the paper's regime (``fedtsa-table --model NAME``), each strategy's gain over
Local paired by seed, and whether its sign (beyond a tie) is the same on both models.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional, Sequence

import pandas as pd

from ..paper import METHOD_LABELS, paper_table

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


def _sign(x: float, tie: float) -> str:
    return "tie" if pd.isna(x) or abs(x) < tie else ("+" if x > 0 else "-")


def conclusions_by_model(grids: Dict[str, pd.DataFrame], reference: str, tie: float = 0.5) -> pd.DataFrame:
    """Each strategy's gain over Local per (tta, setting) on every source model, from ``grids`` (model name ->
    ``table1.stored_table1_runs`` of that model): mean over the seeds both Local and the strategy have on that
    model (paired), the seeds, and whether the sign (``tie``: |gain| below it is a tie) equals the one on
    ``reference`` (the model the workbook's other tables use). One row per (tta, setting, strategy, model), for the
    (tta, setting, strategy) that have runs on ``reference`` and on another model."""
    rows = []
    for model, grid in grids.items():
        if grid.empty:
            continue
        for (tta, setting), g in grid.groupby(["tta", "setting"]):
            by = g.pivot_table(index="seed", columns="strategy", values="accuracy")
            local = g[g.strategy == "local"].set_index("seed")["accuracy_local"] if "local" not in by else by["local"]
            for strategy in by.columns:
                if strategy == "local":
                    continue
                gain = (by[strategy] - local).dropna()
                rows.append({"tta": tta, "setting": setting, "method": METHOD_LABELS.get(strategy, strategy),
                             "model": model, "gain over Local": gain.mean() if len(gain) else float("nan"),
                             "seeds": len(gain)})
    if not rows:
        return pd.DataFrame(columns=["tta", "setting", "method", "model", "gain over Local", "seeds", "same sign"])
    table = pd.DataFrame(rows)
    on_models = table.groupby(["tta", "setting", "method"])["model"].transform("nunique")
    table = table[(on_models > 1) & table.groupby(["tta", "setting", "method"])["model"].transform(
        lambda m: (m == reference).any())]  # only what can be compared with the reference
    ref = table[table.model == reference].set_index(["tta", "setting", "method"])["gain over Local"]
    table["same sign"] = [
        None if key not in ref.index or pd.isna(r) else _sign(r, tie) == _sign(ref[key], tie)
        for key, r in zip(zip(table.tta, table.setting, table.method), table["gain over Local"])]
    return table.sort_values(["tta", "setting", "method", "model"]).reset_index(drop=True)


def conclusions_reading(table: pd.DataFrame, reference: str, tie: float = 0.5) -> str:
    """Which gains over Local keep their sign when the source model changes, computed from
    ``conclusions_by_model``; names the cells with fewer than two seeds."""
    other = table[(table.model != reference) & table["same sign"].notna()]
    if other.empty:
        return (f"No (tta, setting, method) has runs on both `{reference}` and another source model yet: "
                "nothing to compare.")
    ref = table[table.model == reference].set_index(["tta", "setting", "method"])
    parts, changed, few = [], [], 0
    for _, r in other.iterrows():
        key = (r["tta"], r["setting"], r["method"])
        ref_seeds = int(ref.loc[key, "seeds"])
        line = (f"TTA-{r['tta']} {r['setting'].upper()} {r['method']} − Local: {ref.loc[key, 'gain over Local']:+.2f} "
                f"({_seeds(ref_seeds)}) on `{reference}`, {r['gain over Local']:+.2f} ({_seeds(r['seeds'])}) on "
                f"`{r['model']}`")
        parts.append(line)
        changed += [line] if not r["same sign"] else []
        few += min(r["seeds"], ref_seeds) < 2
    verdict = (f"{len(changed)} of {len(other)} gains over Local change sign (or turn into / out of a tie of "
               f"±{tie}) with the source model" + (": " + "; ".join(changed) if changed else "") + ".")
    return (verdict + " " + _best_reading(table, reference) + " All compared: " + "; ".join(parts) + "."
            + (f" {few} of them rest on a single seed on one model." if few else ""))


def _seeds(n: int) -> str:
    return f"{int(n)} seed" + ("" if int(n) == 1 else "s")


def _best_reading(table: pd.DataFrame, reference: str) -> str:
    """Per (tta, setting): the method with the largest gain over Local on each model, and its margin over the
    runner-up, so a change of winner is visible next to how close the race was."""
    lines = []
    for (tta, setting), g in table.groupby(["tta", "setting"]):
        by_model = {}
        for model, m in g.dropna(subset=["gain over Local"]).groupby("model"):
            ranked = m.sort_values("gain over Local", ascending=False)
            margin = (ranked["gain over Local"].iloc[0] - ranked["gain over Local"].iloc[1]
                      if len(ranked) > 1 else float("nan"))
            by_model[model] = (ranked["method"].iloc[0], margin)
        if reference not in by_model or len(by_model) < 2:
            continue
        others = [f"`{model}` {best} (by {margin:.2f})" for model, (best, margin) in by_model.items()
                  if model != reference]
        ref_best, ref_margin = by_model[reference]
        same = all(best == ref_best for model, (best, _) in by_model.items())
        lines.append(f"TTA-{tta} {setting.upper()}: best over Local on `{reference}` {ref_best} (by "
                     f"{ref_margin:.2f}), on " + ", ".join(others) + ("" if same else " (a different method)"))
    return ("Best method per cell: " + "; ".join(lines) + ".") if lines else ""


__all__ = ["paper_profile", "card_profile", "regime_table", "regime_summary", "regime_reading",
           "conclusions_by_model", "conclusions_reading"]
