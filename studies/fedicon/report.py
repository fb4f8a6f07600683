"""Tables beside the paper's numbers and the closing comparison for the FedICON notebook."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import pandas as pd

from studies.paper import paper_table
from ftta_core.stats import CHANCE_FACTOR, chance_caveat, comparison_phrase, near_chance
from ftta_core.tables import blank_missing
from ftta_core.fedicon.study import ABLATION, METHODS, ablation_name


def paper_columns(table: str, columns: Sequence[str], methods: Sequence[str]) -> pd.DataFrame:
    """Paper accuracies (methods x ``columns``) from ``data/paper_numbers/fedicon_<table>.csv``."""
    p = paper_table(f"fedicon_{table}")
    wide = p.pivot_table(index="method", columns="column", values="accuracy")
    return wide.reindex(index=[m for m in methods if m in wide.index], columns=list(columns))


def mean_by_method(rows: pd.DataFrame, shift: str = "shifted") -> pd.Series:
    """Mean over clients, then over seeds, of each method's accuracy."""
    r = rows[rows["shift"] == shift]
    return r.groupby(["method", "seed"]).accuracy.mean().groupby(level="method").mean()


def beside_paper(ours: pd.DataFrame, paper: pd.DataFrame, paper_label: str) -> pd.DataFrame:
    """Our table (strings) with the paper's columns appended, prefixed by ``paper_label``."""
    return blank_missing(ours.join(paper.add_prefix(f"{paper_label} ").round(2), how="left"))


def ablation_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Table 8: the eight (LIE, GIS, TTA) variants, our mean accuracy beside the paper's."""
    ours = mean_by_method(rows)
    paper = paper_table("fedicon_table8").set_index(["lie", "gis", "tta"]).accuracy
    out = []
    for flags in ABLATION:
        name = ablation_name(*flags)
        out.append({"local invariance extraction": "x" if flags[0] else "", "global invariance sharing":
                    "x" if flags[1] else "", "test-time adaptation": "x" if flags[2] else "",
                    "ours": round(float(ours.get(name, float("nan"))), 2),
                    "paper (Digit-5)": float(paper.loc[tuple(int(f) for f in flags)])})
    return pd.DataFrame(out)


def distinct_models(methods: Sequence[str]) -> List[str]:
    """The names in ``methods`` whose (models, test-time) spec in ``study.METHODS`` no earlier name has: the ones
    that need a run (Table 8's "ablation 000" is Local's spec, "ablation 111" FedICON's); ``fill_by_spec`` gives
    the others their rows."""
    seen, out = set(), []
    for m in dict.fromkeys(methods):
        if METHODS[m] not in seen:
            seen.add(METHODS[m])
            out.append(m)
    return out


def fill_by_spec(rows: pd.DataFrame, methods: Sequence[str]) -> pd.DataFrame:
    """``rows`` plus, for each name in ``methods`` that has no rows, a copy of the rows of a method with the same
    (models, test-time) spec in ``study.METHODS``: the same computation stored under another name."""
    have = list(dict.fromkeys(rows.method))
    extra = []
    for m in methods:
        if m in have:
            continue
        twin = next((h for h in have if METHODS.get(h) == METHODS[m]), None)
        if twin is not None:
            extra.append(rows[rows.method == twin].assign(method=m))
    return pd.concat([rows, *extra], ignore_index=True) if extra else rows


def shift_table(rows: pd.DataFrame, methods: Sequence[str]) -> pd.DataFrame:
    """Table 4 shape: mean accuracy on the original and the shifted test sets, and their difference."""
    orig, shifted = mean_by_method(rows, "original"), mean_by_method(rows, "shifted")
    idx = [m for m in methods if m in shifted.index]
    return pd.DataFrame({"original": orig.reindex(idx), "shifted": shifted.reindex(idx),
                         "delta": shifted.reindex(idx) - orig.reindex(idx)}).round(2)


# ---------------------------------------------------------------------------------------------------------------
# Readings computed from the notebook's own runs (no sentence is printed whatever the numbers are).

CHANCE = 10.0  # accuracy (%) of a uniform guess: every setting of the notebook has 10 classes
TTA_BASELINES = ("Tent", "EATA", "T3A")
PERSONALISED = ("FedRep", "FedTHE", "FedBN")


def seed_means(rows: pd.DataFrame, shift: str = "shifted") -> pd.DataFrame:
    """Accuracy per seed (rows) and method (columns), each the mean over the clients of that seed."""
    r = rows[rows["shift"] == shift]
    return r.groupby(["seed", "method"]).accuracy.mean().unstack()


def paired_verdict(name: str, rows: pd.DataFrame, tta_methods: Sequence[str] = TTA_BASELINES) -> str:
    """One sentence from the tidy rows: FedICON against FedAvg and the best TTA baseline (by mean), each difference
    paired by seed with its 95% interval and ``stats.comparison`` (``stats.comparison_phrase``); with
    ``stats.chance_caveat`` when FedAvg is within ``stats.CHANCE_FACTOR`` times chance."""
    ps = seed_means(rows)
    if "FedICON" not in ps or "FedAvg" not in ps:
        return f"{name}: not run."
    m = ps.mean()
    text = (f"{name}: FedICON {m['FedICON']:.2f}% vs FedAvg {m['FedAvg']:.2f}% "
            f"({comparison_phrase(ps['FedICON'], ps['FedAvg'], 'FedICON', 'FedAvg')})")
    tta = [t for t in tta_methods if t in ps]
    if tta:
        best = max(tta, key=lambda t: m[t])
        text += (f"; best TTA baseline {best} {m[best]:.2f}% "
                 f"({comparison_phrase(ps['FedICON'], ps[best], 'FedICON', best)})")
    caveat = chance_caveat("FedAvg", m["FedAvg"], CHANCE)
    return text + (f". {caveat}" if caveat else ".")


def digits_reading(rows: pd.DataFrame, epoch_rows: Optional[pd.DataFrame], paper_means: Dict[str, float],
                   seeds: Sequence[int], clients: int, rounds: int, local_epochs: int,
                   budget_tested: bool = False) -> str:
    """The digit-domain reading: FedICON against FedAvg, the best TTA baseline, the best personalised method and
    itself without TTA (paired by seed); the order of FedICON, Tent and FedAvg beside the paper's Digit-5 means;
    and FedICON − FedAvg along the Fig 3 local-epoch sweep (``epoch_rows``: tidy rows with a column ``value`` = local
    epochs; ``budget_tested``: a larger-budget run exists, so the sweep's hint is not called untested)."""
    from studies.readings import ordering_phrase

    ps = seed_means(rows)
    if "FedICON" not in ps or "FedAvg" not in ps:
        return "No FedICON and FedAvg runs on the digit domains."
    m, sd = ps.mean(), ps.std(ddof=1)
    ms = (lambda k: f"{m[k]:.1f} ± {sd[k]:.1f}" if len(ps) > 1 else f"{m[k]:.1f}")  # noqa: E731
    diff = (lambda a, b: comparison_phrase(ps[a], ps[b], a, b))  # noqa: E731
    parts = [f"On the digit domains (a Digit-5 substitute, {clients} clients, {rounds} rounds of {local_epochs} "
             f"local epoch(s), seeds {list(seeds)}) FedICON scores **{ms('FedICON')}** against FedAvg "
             f"{ms('FedAvg')}: {diff('FedICON', 'FedAvg')}."]
    tta = [t for t in TTA_BASELINES if t in ps]
    pfl = [p for p in PERSONALISED if p in ps]
    said = []
    if tta:
        best = max(tta, key=lambda t: m[t])
        said.append(f"the best TTA baseline on the FedAvg model is {best} ({ms(best)}; {diff('FedICON', best)})")
    if pfl:
        best = max(pfl, key=lambda p: m[p])
        said.append(f"the best personalised method is {best} ({ms(best)}; {diff(best, 'FedAvg')})")
    if said:
        joined = " and ".join(said)
        parts.append(joined[0].upper() + joined[1:] + ".")
    if "FedICON w/o TTA" in ps:
        parts.append(f"FedICON's contrastive test-time adaptation: {diff('FedICON', 'FedICON w/o TTA')}.")
    shared = [k for k in ("FedICON", "Tent", "FedAvg") if k in ps and k in paper_means]
    if len(shared) >= 2:
        theirs = ordering_phrase({k: paper_means[k] for k in shared}, digits=1)
        parts.append(f"Order here: {ordering_phrase(m[shared], digits=1)}; the paper's Digit-5 means (100 rounds of 5 "
                     f"local epochs on full datasets): {theirs}.")
    if epoch_rows is not None and len(epoch_rows):
        gaps, phrases = {}, []
        for e, g in epoch_rows.groupby("value"):
            pe = seed_means(g)
            if "FedICON" in pe and "FedAvg" in pe:
                gaps[e] = float((pe["FedICON"] - pe["FedAvg"]).mean())
                said_e = comparison_phrase(pe["FedICON"], pe["FedAvg"], "FedICON", "FedAvg")
                phrases.append(f"{e:g} local epoch(s): {said_e}")
        if phrases:
            parts.append("Along the Fig 3 local-epoch sweep (its smaller training sets): " + "; ".join(phrases) + ".")
            signs = [e for a, e in zip(list(gaps)[:-1], list(gaps)[1:]) if (gaps[a] > 0) != (gaps[e] > 0)]
            if signs:
                parts.append(f"The mean gap changes sign on the way to {', '.join(f'{e:g}' for e in signs)} local "
                             "epochs." + ("" if budget_tested else " **Untested hypothesis**: that the paper's budget "
                             "(100 rounds of 5 local epochs on full datasets) would also put FedICON ahead in the main "
                             "setting; no run here uses it."))
    return " ".join(parts)


def budget_reading(budgets: Dict[str, pd.DataFrame], paper_means: Dict[str, float],
                   domain: str = "mnistm") -> str:
    """FedICON against FedAvg and the best other method at each training budget (tidy rows per budget label, in the
    order given), paired by seed, overall and on ``domain`` (the client whose domain decides the gap); with the
    paper's Digit-5 difference beside them."""
    parts = []
    for label, rows in budgets.items():
        ps = seed_means(rows)
        if "FedICON" not in ps or "FedAvg" not in ps:
            parts.append(f"- {label}: no FedICON and FedAvg runs.")
            continue
        m = ps.mean()
        others = [k for k in ps if k not in ("FedICON", "FedAvg") and not k.startswith("FedICON")]
        text = (f"- {label} (seeds {sorted(int(s) for s in ps.index)}): FedICON {m['FedICON']:.1f}, FedAvg "
                f"{m['FedAvg']:.1f}; {comparison_phrase(ps['FedICON'], ps['FedAvg'], 'FedICON', 'FedAvg')}")
        if others:
            best = max(others, key=lambda k: m[k])
            text += (f"; best other method {best} {m[best]:.1f} "
                     f"({comparison_phrase(ps['FedICON'], ps[best], 'FedICON', best)})")
        one = rows[rows.client == domain]
        if len(one):
            pd_ = seed_means(one)
            if "FedICON" in pd_ and "FedAvg" in pd_:
                text += (f"; on {domain} alone FedICON {pd_['FedICON'].mean():.1f}, FedAvg {pd_['FedAvg'].mean():.1f} "
                         f"({comparison_phrase(pd_['FedICON'], pd_['FedAvg'], 'FedICON', 'FedAvg')})")
        parts.append(text + ".")
    if "FedICON" in paper_means and "FedAvg" in paper_means:
        parts.append(f"- The paper (Digit-5, 100 rounds of 5 local epochs): FedICON − FedAvg = "
                     f"{paper_means['FedICON'] - paper_means['FedAvg']:+.2f}.")
    return "\n".join(parts)


TABLE8_PARTS = {"local invariance extraction": 0, "global invariance sharing": 1, "test-time adaptation": 2}


def components_reading(budgets: Dict[str, pd.DataFrame]) -> str:
    """Tables 8 and 9 at each training budget (tidy rows per budget label holding the ablation variants and Table 9's
    methods): what each part of FedICON adds (the full method minus it with that part off, paired by seed) beside
    the paper's, the best of the eight variants, and FedICON against FedICON-us and FedICON-us against FedAvg."""
    paper8 = paper_table("fedicon_table8").set_index(["lie", "gis", "tta"]).accuracy
    paper9 = paper_columns("table9", ["Digit-5"], ["FedAvg", "FedICON", "FedICON-us"])["Digit-5"]
    full = ablation_name(True, True, True)
    parts = []
    for label, rows in budgets.items():
        ps = seed_means(rows)
        if full not in ps:
            parts.append(f"- {label}: no Table 8 runs.")
            continue
        said = []
        for part, i in TABLE8_PARTS.items():
            off = tuple(j != i for j in range(3))
            name = ablation_name(*off)
            if name in ps:
                theirs = float(paper8.loc[(1, 1, 1)] - paper8.loc[tuple(int(f) for f in off)])
                said.append(f"{part}: {comparison_phrase(ps[full], ps[name], 'all three', 'without it')} (paper "
                            f"{theirs:+.2f})")
        variants = [ablation_name(*f) for f in ABLATION if ablation_name(*f) in ps]
        m = ps[variants].mean()
        tops = [v for v in variants if m[v] == m.max()]
        named = [", ".join(p for p, i in TABLE8_PARTS.items() if v.split()[-1][i] == "1") or "no part" for v in tops]
        text = (f"- {label} (seeds {sorted(int(s) for s in ps.index)}): what each part adds to the other two: "
                + "; ".join(said) + f". Best of the eight variants (by mean): {' = '.join(f'[{n}]' for n in named)} "
                f"({m.max():.2f}; the paper's best: all three, {float(paper8.loc[(1, 1, 1)]):.2f})")
        if {"FedICON", "FedICON-us", "FedAvg"} <= set(ps):
            text += (f". Table 9: {comparison_phrase(ps['FedICON'], ps['FedICON-us'], 'FedICON', 'FedICON-us')} "
                     f"(paper {paper9['FedICON'] - paper9['FedICON-us']:+.2f}); "
                     f"{comparison_phrase(ps['FedICON-us'], ps['FedAvg'], 'FedICON-us', 'FedAvg')} "
                     f"(paper {paper9['FedICON-us'] - paper9['FedAvg']:+.2f})")
        parts.append(text + ".")
    return "\n".join(parts)


def other_settings_reading(settings: Dict[str, pd.DataFrame]) -> str:
    """FedICON against FedAvg and Local in each further setting (tidy rows per name), paired by seed
    (``stats.comparison_phrase``), and the settings where FedAvg is within ``stats.CHANCE_FACTOR`` times chance (10
    classes: ``stats.near_chance``)."""
    cells, low = [], []
    for name, rows in settings.items():
        ps = seed_means(rows)
        if "FedICON" not in ps or "FedAvg" not in ps:
            continue
        m = ps.mean()
        cell = f"{name}: FedICON {m['FedICON']:.1f}, FedAvg {m['FedAvg']:.1f}"
        phrases = [comparison_phrase(ps["FedICON"], ps["FedAvg"], "FedICON", "FedAvg")]
        if "Local" in ps:
            cell += f", Local {m['Local']:.1f}"
            phrases.append(comparison_phrase(ps["FedICON"], ps["Local"], "FedICON", "Local"))
        cells.append(f"- {cell} ({'; '.join(phrases)})")
        if near_chance(m["FedAvg"], CHANCE):
            low.append(f"{name} ({m['FedAvg']:.1f})")
    if not cells:
        return ""
    text = "\n".join(cells)
    if low:
        text += (f"\n\nFedAvg is within {CHANCE_FACTOR:g}x chance ({CHANCE:g}%, 10 classes) in: "
                 + ", ".join(low) + ". **Untested hypothesis**: there FedICON's lead measures what its personalised "
                 "classifier recovers from a weak shared encoder rather than the paper's comparison of trained "
                 "models; no run here isolates the classifier (Table 8's ablation is on the digit domains only).")
    return text


def shift_cost_reading(table4: pd.DataFrame, paper4: pd.DataFrame, alphas: Sequence[float]) -> str:
    """How much the test-time shift moves each method's accuracy (shifted − original), ours (``shift_table``
    columns prefixed 'dir<alpha> ') beside the paper's Table 4 (columns 'dir<alpha>_original' / '_shifted')."""
    parts = []
    for a in alphas:
        key = f"dir{a:g}"
        if f"{key} delta" not in table4:
            continue
        ours = table4[f"{key} delta"].astype(float)
        text = f"Dir({a:g}): shifted − original here {ours.min():+.1f} to {ours.max():+.1f} points"
        if f"{key}_original" in paper4 and f"{key}_shifted" in paper4:
            theirs = (paper4[f"{key}_shifted"] - paper4[f"{key}_original"]).dropna()
            if len(theirs):
                text += f", in the paper's Table 4 {theirs.min():+.1f} to {theirs.max():+.1f}"
        parts.append(text)
    return ("Effect of the shift on each method (our stand-in for CIFAR-10.1 is severity-1 corruptions): "
            + "; ".join(parts) + ".") if parts else ""
