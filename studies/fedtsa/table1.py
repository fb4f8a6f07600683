"""FedTSA Table 1 (Zhang et al.): the protocol's configs (``table1_config``, the runs ``study fedtsa table`` stores), the
stored runs read back per column, our numbers beside the paper's with its claims checked, and the TTA-grad 2x2
(BatchNorm on batch vs running statistics x SGD vs Adam). FedCTTA's Table I is the same protocol
(``fedctta.tables``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

import pandas as pd

from ftta_core import stats
from ftta_core.experiment import UNREAD_OUTSIDE_HETEROGENEITY, ExperimentConfig, identity_of
from studies.paper import METHOD_LABELS, TTA_SETTINGS, paper_table, paper_tta
from ftta_core.runstore import read_summary, run_status
from ftta_core.tables import mean_std_text
from ftta_core.workbook import SUMMARY_KEYS


def beside_fedtsa_table1(grid: pd.DataFrame, dataset: str, tta: str, methods: Sequence[str]) -> pd.DataFrame:
    """Rows = methods (plus No-Adapt), columns = ours (mean ± std over seeds) and paper, for NIID and IID.

    ``grid`` has one row per run with columns strategy, setting ('niid'/'iid'), seed, accuracy, accuracy_source.
    """
    paper = paper_table("fedtsa_table1")
    paper = paper[(paper.dataset == dataset) & (paper.tta == paper_tta(tta))].set_index(["method", "setting"])
    rows = []
    for setting in ("niid", "iid"):
        g = grid[grid.setting == setting]
        if g.empty:
            continue
        src = g.groupby("seed")["accuracy_source"].first()
        entries = [("No-Adapt", src)]
        if tta == "bn" and "local" not in methods:
            # under TTA-bn a client's prediction before mixing does not depend on the strategy (no state is
            # carried between steps), so every run's accuracy_local is the Local number of its seed
            entries.append(("Local", g.groupby("seed")["accuracy_local"].first()))
        entries += [(METHOD_LABELS.get(m, m), g[g.strategy == m]["accuracy"]) for m in methods]
        for label, values in entries:
            if values.empty:
                continue
            key = (label, setting)
            rows.append({"method": label, "setting": setting, "ours_mean": values.mean(),
                         "ours_std": values.std(ddof=1) if len(values) > 1 else 0.0, "seeds": len(values),
                         "paper_mean": paper.loc[key, "mean"] if key in paper.index else float("nan"),
                         "paper_std": paper.loc[key, "std"] if key in paper.index else float("nan")})
    out = pd.DataFrame(rows)
    out["difference"] = out["ours_mean"] - out["paper_mean"]
    return out


def _per_seed(grid: pd.DataFrame, strategy: str, tta: str) -> pd.Series:
    """Accuracy per seed of ``strategy`` in ``grid`` (Local under TTA-bn falls back to any run's pre-mixing
    accuracy, which is Local's: see ``beside_fedtsa_table1``)."""
    runs = grid[grid.strategy == strategy].groupby("seed")["accuracy"].first()
    if runs.empty and strategy == "local" and tta == "bn" and len(grid):
        runs = grid.groupby("seed")["accuracy_local"].first()
    return runs


# FedTSA's Table 1 claims per setting: (the other strategies, the claim in words, its kind for ``stats.verdict``)
TABLE1_CLAIMS = {"niid": (("local", "fedavg"), "beats", "direction"), "iid": (("fedavg",), "matches", "tie")}


def fedtsa_claims_reading(grid: pd.DataFrame, tta: str, dataset: str = "cifar10") -> str:
    """FedTSA's Table 1 claims checked on our runs of one TTA mode: in NIID it beats Local and FedAvg (a direction
    claim), in IID it matches FedAvg (a tie claim). ``grid`` as for ``beside_fedtsa_table1``. Each difference is
    paired by seed (a seed fixes the stream), with its 95% interval, and decided by ``stats.verdict``: 'beats' holds
    when the interval lies above 0, 'matches' when it lies inside +-``stats.MARGIN``; undetermined under
    ``stats.MIN_SEEDS`` paired seeds."""
    paper = paper_table("fedtsa_table1")
    paper = paper[(paper.dataset == dataset) & (paper.tta == tta)].set_index(["method", "setting"])["mean"]
    parts = []
    for setting, (others, claim, kind) in TABLE1_CLAIMS.items():
        g = grid[grid.setting == setting]
        ours = _per_seed(g, "fedtsa", tta)
        if ours.empty:
            parts.append(f"{setting.upper()}: no FedTSA run stored yet.")
            continue
        said = []
        for other in others:
            theirs, label = _per_seed(g, other, tta), METHOD_LABELS[other]
            est = stats.paired(ours, theirs)
            if not est.n:
                said.append(f"no {label} run at FedTSA's seeds")
                continue
            same = ", identical at every seed" if est.identical else ""
            said.append(f"{label} {theirs[list(est.seeds)].mean():.2f} (FedTSA - {label} = {est.text()}; "
                        f"'{claim}': {stats.verdict(est, None, kind=kind)}{same})")
        label = lambda m: f"{paper.get((m, setting), float('nan')):.2f}"  # noqa: E731
        quoted = ", ".join(f"{METHOD_LABELS[m]} {label(METHOD_LABELS[m])}" for m in others)
        parts.append(f"{setting.upper()}: FedTSA {ours.mean():.2f} against " + " and ".join(said) +
                     f"; the paper: FedTSA {label('FedTSA')}, {quoted}.")
    return f"**TTA-{tta}.** " + " ".join(parts)


def to_markdown(table: pd.DataFrame) -> str:
    """A compact markdown rendering: 'mean ± std (seeds)' for ours (no spread from one seed), 'mean ± std' for the
    paper, and the difference."""
    lines = ["| method | setting | ours (mean ± std, seeds) | paper (mean ± std) | ours − paper |", "|---|---|---|---|---|"]
    for r in table.itertuples():
        paper = "–" if pd.isna(r.paper_mean) else f"{r.paper_mean:.2f} ± {r.paper_std:.2f}"
        diff = "–" if pd.isna(r.difference) else f"{r.difference:+.2f}"
        lines.append(f"| {r.method} | {r.setting.upper()} | {mean_std_text(r.ours_mean, r.ours_std, r.seeds)} | "
                     f"{paper} | {diff} |")
    return "\n".join(lines) + "\n"



TABLE1_SETTINGS = ("niid", "iid")


def table1_config(dataset: str, setting: str, tta: str, device: str = "auto", model: Optional[str] = None,
                  backend: str = "vectorized", max_steps: Optional[int] = None,
                  lr: Optional[float] = None) -> ExperimentConfig:
    """The base config of one Table I column, exactly as ``python -m ftta_core study fedtsa table`` builds it (so its
    stored runs are found by config hash): 20 clients, batch 10, 500 images per client and corruption, severity 5;
    ``model``: the source model (None: the dataset's shipped one, ``training.SOURCE_MODELS``); ``lr``: the TTA-grad
    cell's step size instead of its own (the step-size axis of ``tta_grad_cells``; TTA-bn has none)."""
    settings = TTA_SETTINGS[tta]
    if lr is not None:
        if tta == "bn":
            raise ValueError("lr: TTA-bn takes no gradient step; give a TTA-grad cell (grad, grad-adam, ...)")
        settings = {**settings, "local_params": {**settings["local_params"], "lr": float(lr)}}
    return ExperimentConfig(dataset=dataset, scenario=f"fedtsa_{setting}", clients=20, batch_size=10,
                            images_per_client=500, severity=5, device=device, backend=backend, max_steps=max_steps,
                            model=model, **settings)


# config fields a FedTSA-protocol scenario does not read (their defaults changed over time: older stored runs carry
# th = 1/15, newer ones 0.02); ignored when matching stored runs to a Table I column
UNREAD_BY_FEDTSA_SCENARIOS = UNREAD_OUTSIDE_HETEROGENEITY


def _matches_column(config: dict, base: dict, strategies: Sequence[str], seeds: Sequence[int],
                    strategy_params: Optional[Mapping[str, Any]] = None) -> bool:
    ignore = {"strategy", "seed", "strategy_params", *UNREAD_BY_FEDTSA_SCENARIOS}
    ours, wanted = identity_of(config), identity_of(base)  # fields added later count only away from their default
    return (config.get("strategy") in strategies and config.get("seed") in seeds
            and dict(config.get("strategy_params") or {}) == dict(strategy_params or {})
            and all(ours.get(k) == wanted.get(k) for k in (set(ours) | set(wanted)) - ignore))


def stored_table1_runs(results_dir: Path | str, strategies: Sequence[str], seeds: Sequence[int],
                       dataset: str = "cifar10", ttas: Sequence[str] = ("bn", "grad"),
                       settings: Sequence[str] = TABLE1_SETTINGS,
                       strategy_params: Optional[Mapping[str, Any]] = None,
                       model: Optional[str] = None, extra_keys: Sequence[str] = (),
                       lr: Optional[float] = None) -> pd.DataFrame:
    """The Table I runs already stored under ``results_dir`` by ``study fedtsa table`` (nothing runs): one row per run
    with columns tta, setting, strategy, seed and the summary's numbers (accuracy, accuracy_local, ..., and the
    summary keys named in ``extra_keys``, e.g. ``accuracy_by_domain``).
    ``strategy_params``: the runs of the strategies with these parameters (e.g. ``{"probe_bn": "eval"}``, planned
    with ``run-plan``) instead of their defaults; ``model``: the runs on this source model (None: the shipped one);
    ``lr``: the TTA-grad runs at this step size instead of each cell's own (TTA-bn runs are read unchanged).

    ``code``: the run's ``runstore.run_status`` (current, stale: made by code that changed since, unrecorded).

    A stored summary counts for a column when its config equals ``table1_config`` for that column in every field
    the scenario reads (the strategy at its defaults); the file names are config hashes, which also change with
    fields the FedTSA scenarios ignore (``UNREAD_BY_FEDTSA_SCENARIOS``), so the configs are compared instead.
    """


    summaries = [read_summary(p) for p in sorted(Path(results_dir).glob("*.json"))]
    rows = []
    for tta in ttas:
        for setting in settings:
            base = table1_config(dataset, setting, tta, model=model, lr=None if tta == "bn" else lr).to_dict()
            for s in summaries:
                c = s.get("config", {})
                if _matches_column(c, base, strategies, seeds, strategy_params):
                    rows.append({"tta": tta, "setting": setting, "strategy": c["strategy"], "seed": c["seed"],
                                 **{k: s[k] for k in (*SUMMARY_KEYS, *extra_keys) if k in s},
                                 "code": run_status(s)})
    columns = ["tta", "setting", "strategy", "seed", *SUMMARY_KEYS, *extra_keys, "code"]
    grid = pd.DataFrame(rows, columns=columns) if not rows else pd.DataFrame(rows)
    if len(grid):  # one run per (column, strategy, seed): a rerun under a newer default replaces nothing twice
        grid = grid.drop_duplicates(["tta", "setting", "strategy", "seed"], keep="last")
    return grid.sort_values(["tta", "setting", "strategy", "seed"]).reset_index(drop=True) if len(grid) else grid


def missing_table1_runs(grid: pd.DataFrame, strategies: Sequence[str], seeds: Sequence[int],
                        ttas: Sequence[str] = ("bn", "grad"),
                        settings: Sequence[str] = TABLE1_SETTINGS) -> pd.DataFrame:
    """Which (tta, setting, strategy) still lack which seeds in ``grid`` (from ``stored_table1_runs``)."""
    have = set(zip(grid.get("tta", []), grid.get("setting", []), grid.get("strategy", []), grid.get("seed", [])))
    rows = []
    for tta in ttas:
        for setting in settings:
            for s in strategies:
                missing = [seed for seed in seeds if (tta, setting, s, seed) not in have]
                if missing:
                    rows.append({"tta": tta, "setting": setting, "method": METHOD_LABELS.get(s, s),
                                 "missing_seeds": " ".join(map(str, missing)), "stored": len(seeds) - len(missing)})
    return pd.DataFrame(rows, columns=["tta", "setting", "method", "missing_seeds", "stored"])


GRAD_CELLS = ("grad", "grad-adam", "grad-running", "grad-running-adam")


def tta_grad_cells(dataset: str = "cifar10", results_dir: Path | str = "figures/fedtsa_table1/runs",
                   seeds: Sequence[int] = (0, 1, 2, 3, 4), settings: Sequence[str] = TABLE1_SETTINGS,
                   strategies: Sequence[str] = ("local", "fedavg", "fedtsa"), cells: Sequence[str] = GRAD_CELLS,
                   lrs: Sequence[Optional[float]] = (None,), model: Optional[str] = None) -> pd.DataFrame:
    """The TTA-grad 2x2 (BatchNorm {batch, running} x optimiser {SGD 1e-4, Adam 1e-5}) from stored Table 1 runs.

    One row per (cell, step size, setting): the cell's local settings, the seeds with a Local run, Local's accuracy,
    and, paired by seed, Local(grad) - Local(bn) (TTA-bn's Local is any TTA-bn run's pre-mixing accuracy) and
    ``<strategy> - Local`` for the other strategies, each beside the paper's (FedTSA Table 1), with the standard
    deviation of the paired differences (``... sd``, NaN below 2 seeds), the 95 % t half-width (``... ci95``) and
    each direction's ``stats.verdict`` (``local - local(bn) below``, ``<strategy> - local above``) and, last, the
    seeds each difference is paired over (``... seed ids``). NaN where a run is missing. ``stale runs``:
    how many of the cell's runs were made by code that has changed since (``python -m ftta_core reproduce`` them).
    ``lrs``: the step sizes to read for each cell (None: the cell's own; others: runs planned with
    ``study fedtsa table --tta CELL --lr X``); ``model``: the source model (None: the shipped one)."""
    paper = paper_table("fedtsa_table1")
    paper = paper[paper.dataset == dataset].set_index(["method", "setting", "tta"])["mean"]
    bn_grid = stored_table1_runs(results_dir, list(strategies), list(seeds), dataset, ("bn",), settings, model=model)
    rows = []
    for cell in cells:
        for lr in lrs:
            grid = stored_table1_runs(results_dir, list(strategies), list(seeds), dataset, (cell,), settings,
                                      model=model, lr=lr)
            params = table1_config(dataset, "niid", cell, lr=lr).local_params
            for setting in settings:
                g = grid[grid.setting == setting] if len(grid) else grid
                bn = bn_grid[bn_grid.setting == setting] if len(bn_grid) else bn_grid
                rows.append(_grad_cell_row(cell, params, setting, g, bn, strategies, paper))
    return pd.DataFrame(rows)


def _grad_cell_row(cell: str, params: Mapping[str, Any], setting: str, g: pd.DataFrame, bn: pd.DataFrame,
                   strategies: Sequence[str], paper: pd.Series) -> Dict[str, Any]:
    """One row of ``tta_grad_cells``: the stored runs ``g`` of a cell and setting against TTA-bn's ``bn``."""
    local = _per_seed(g, "local", "grad") if len(g) else pd.Series(dtype=float)
    local_bn = bn.groupby("seed")["accuracy_local"].first() if len(bn) else pd.Series(dtype=float)
    row = {"cell": cell, "bn": params.get("bn", "batch"), "optimizer": f"{params['optimizer']} {params['lr']:g}",
           "lr": float(params["lr"]), "setting": setting, "seeds": len(local), "local": local.mean() if len(local) else float("nan")}
    gap = stats.paired(local, local_bn)
    row["local - local(bn)"] = gap.mean
    row["local - local(bn) sd"] = gap.sd
    row["local - local(bn) ci95"] = gap.half_width
    seed_ids: Dict[str, tuple] = {}  # which seeds each paired difference rests on (the last columns)
    row["local - local(bn) below"] = stats.verdict(gap, None, kind="direction", side=-1)
    row["paper: local - local(bn)"] = (paper.get(("Local", setting, "grad"), float("nan"))
                                       - paper.get(("Local", setting, "bn"), float("nan")))
    for s in strategies:
        if s == "local":
            continue
        theirs = _per_seed(g, s, "grad") if len(g) else pd.Series(dtype=float)
        label = METHOD_LABELS.get(s, s)
        diff = stats.paired(theirs, local)
        row[f"{label} - local"] = diff.mean
        row[f"{label} - local sd"] = diff.sd
        row[f"{label} - local ci95"] = diff.half_width
        row[f"{label} - local above"] = stats.verdict(diff, None, kind="direction", side=1)
        row[f"{label} seeds"] = diff.n
        row[f"paper: {label} - local"] = (paper.get((label, setting, "grad"), float("nan"))
                                          - paper.get(("Local", setting, "grad"), float("nan")))
        seed_ids[f"{label} - local seed ids"] = diff.seeds
    row["stale runs"] = int((g["code"] == "stale").sum()) if len(g) else 0
    return {**row, "local - local(bn) seed ids": gap.seeds, **seed_ids}


def _row_name(d: Mapping[str, Any]) -> str:
    """A ``tta_grad_cells`` row's name in readings: the cell and setting, then its step size where it is not the
    cell's own and its source model where the row names one."""
    own = float(TTA_SETTINGS[d["cell"]]["local_params"]["lr"])
    extra = ([] if d["lr"] == own else [d["optimizer"]]) + ([str(d["model"])] if d.get("model") else [])
    return f"{d['cell']} ({', '.join([d['setting'].upper(), *extra])})"


def _side_text(est_mean: float, ci95: float, seeds: int, a: str, b: str) -> str:
    """'A below B (-1.23 [-2.00, -0.46], 5 seeds)': the side ``stats.comparison`` gives a paired difference."""
    if pd.isna(est_mean):
        return f"no {a} run paired with {b}"
    if seeds < 2 or pd.isna(ci95):
        return f"{a} - {b} {est_mean:+.2f} (1 seed: undetermined)"
    lo, hi = est_mean - ci95, est_mean + ci95
    side = ("above" if lo > 0 else "below" if hi < 0 else
            f"within the {stats.MARGIN:g}-point margin of" if -stats.MARGIN <= lo and hi <= stats.MARGIN else
            "undetermined against")
    if seeds < stats.MIN_SEEDS:
        side = "undetermined against"
    return f"{a} {side} {b} ({est_mean:+.2f} [{lo:+.2f}, {hi:+.2f}], {seeds} seeds)"


def _pattern(d: Mapping[str, Any]) -> str:
    """The paper's TTA-grad pattern in one row (``stats.verdict`` of two direction claims): Local(grad) below
    Local(bn) and FedAvg above Local: 'holds' when both hold, 'does not hold' when either does not, else
    'undetermined'."""
    parts = [d.get("local - local(bn) below", "no run"), d.get("FedAvg - local above", "no run")]
    if all(p == "holds" for p in parts):
        return "holds"
    if any(p == "does not hold" for p in parts):
        return "does not hold"
    return "undetermined"


def tta_grad_cells_reading(table: pd.DataFrame) -> str:
    """Which cells of ``tta_grad_cells`` show the paper's TTA-grad pattern (Local(grad) below Local(bn) and FedAvg
    above Local, each a direction claim read by ``stats.verdict`` on the 95 % interval over paired seeds; fewer
    than 3 seeds: undetermined), computed from the table; names the cells without runs."""
    parts = []
    for d in table.to_dict("records"):
        name = _row_name(d)
        gap, gain = d["local - local(bn)"], d.get("FedAvg - local", float("nan"))
        if pd.isna(gap) and pd.isna(gain):
            parts.append(f"{name}: no stored run")
            continue
        stale = int(d.get("stale runs", 0) or 0)
        parts.append(f"{name}, {d['seeds']} seed(s): "
                     + _side_text(gap, d.get("local - local(bn) ci95"), d["seeds"], "Local(grad)", "Local(bn)")
                     + ", " + _side_text(gain, d.get("FedAvg - local ci95"), int(d.get("FedAvg seeds", 0) or 0),
                                         "FedAvg", "Local")
                     + f": the paper's pattern {_pattern(d)}"
                     + (f" ({stale} of its runs made by code that has changed since)" if stale else ""))
    return "; ".join(parts) + "."


def degraded_local_reading(table: pd.DataFrame) -> str:
    """Whether FedAvg gains over Local where Local's TTA-grad falls below its TTA-bn (the paper's situation), read
    from the rows of ``tta_grad_cells`` (any cells, step sizes or source models): which rows have Local(grad)
    below Local(bn) (``stats.verdict``: the 95 % interval below 0, at least 3 seeds), and FedAvg - Local in each."""
    rows = [d for d in table.to_dict("records") if not pd.isna(d["local - local(bn)"])]
    if not rows:
        return "No row has both a TTA-grad and a TTA-bn Local run yet."

    def paper(col: str) -> str:
        values = {d["setting"]: d[f"paper: {col}"] for d in rows}
        return ", ".join(f"{v:+.2f} {k.upper()}" for k, v in sorted(values.items()) if not pd.isna(v)) or "none"

    low = [d for d in rows if d.get("local - local(bn) below") == "holds"]
    if not low:
        return (f"In none of the {len(rows)} row(s) with runs is Local(grad) below Local(bn) with a 95 % interval "
                f"under 0 and at least {stats.MIN_SEEDS} seeds (the paper: {paper('local - local(bn)')}), so the "
                "situation of the paper's FedAvg gain is not established here.")
    said = [f"{_row_name(d)}: "
            + _side_text(d["local - local(bn)"], d.get("local - local(bn) ci95"), d["seeds"], "Local(grad)",
                         "Local(bn)") + ", "
            + _side_text(d.get("FedAvg - local", float("nan")), d.get("FedAvg - local ci95"),
                         int(d.get("FedAvg seeds", 0) or 0), "FedAvg", "Local") for d in low]
    gains = [d for d in low if d.get("FedAvg - local above") == "holds"]
    return (f"Local(grad) is below Local(bn) in {len(low)} of {len(rows)} row(s) ({'; '.join(said)}); FedAvg is "
            f"above Local there in {len(gains)} of them (the paper: {paper('FedAvg - local')}).")


SHIPPED_MODEL = "resnet8_cifar10"  # the source model every table uses unless it names another
PAPER_T1_LABEL = "FedTSA (Table 1)"  # the paper's series in the figures that set its Table 1 gains beside ours


def step_text(lr: float) -> str:
    """A step size as figures write it: 3e-4, 1e-5, 0.5."""
    import numpy as np

    return np.format_float_scientific(lr, trim="-", exp_digits=1) if lr < 1e-2 else f"{lr:g}"


def source_model_label(name: Optional[str], directory: Optional[Path] = None) -> str:
    """A source model's name for a figure's key, from its card (``data/checkpoints/NAME.json``): its recipe and
    clean accuracy, e.g. "shipped: 15 epochs, 82.7 % clean", "1 epoch on 10,000 images, 46.6 % clean"; the
    checkpoint id itself where there is no card. "shipped" and None name the shipped model."""
    import json

    from ftta_core.training import CHECKPOINT_DIR

    card_name = SHIPPED_MODEL if name in (None, "shipped") else str(name)
    path = Path(directory or CHECKPOINT_DIR) / f"{card_name}.json"
    if not path.exists():
        return str(name)
    card = json.loads(path.read_text())
    epochs = f"{card['epochs']} epoch" + ("s" if card["epochs"] != 1 else "")
    images = f" on {card['train_images']:,} images" if "train_images" in card else ""
    shipped = "shipped: " if card_name == SHIPPED_MODEL else ""
    return f"{shipped}{epochs}{images}, {card['clean_test_accuracy']:.1f} % clean"


def step_size_figure(table: pd.DataFrame) -> "Any":
    """Local(grad) − Local(bn) and FedAvg − Local against the step size, from rows of ``tta_grad_cells`` of one cell
    (several ``lrs``), one panel per setting on a shared y-scale: the 95 % t interval over paired seeds where a
    point has several (open marker: one seed), the seeds of every point in rows under the axis (``... seed ids``,
    ``style.seed_strip``), the paper's two gaps as dashed horizontal references. Rows with a ``model`` column
    (several source models) draw one line style and marker per model (the first model solid with circles), named
    from its card (``source_model_label``). One key below the panels. Returns the figure."""
    import matplotlib.pyplot as plt

    from ftta_core import style

    rows = table[table.seeds > 0]
    settings = [s for s in TABLE1_SETTINGS if s in set(rows["setting"])]
    fig, axes = plt.subplots(1, max(len(settings), 1), figsize=(style.MAX_WIDTH, 4.8), sharex=True, sharey=True,
                             squeeze=False, layout="constrained")
    models = list(pd.unique(rows["model"])) if "model" in rows else [None]
    looks = dict(zip(models, [("o", "-"), ("s", ":"), ("^", "-."), ("D", (0, (5, 1)))]))
    quantities = [("local - local(bn)", "Local (gradient TTA) − Local (TTA-bn)"),
                  ("FedAvg - local", "FedAvg − Local (gradient TTA)")]
    any_single = False
    for ax, setting in zip(axes[0], settings):
        here = rows[rows.setting == setting].sort_values("lr")
        strip = []
        for (col, label), (colour, _) in zip(quantities, style.distinct(len(quantities))):
            for model in models:
                mine = here if model is None else here[here["model"] == model]
                mine = mine[mine[col].notna()]
                marker, ls = looks[model]
                half = mine[col + " ci95"]
                name = f"{label}, ours" + ("" if model is None else f" ({source_model_label(model)})")
                single = half.isna()
                any_single = any_single or bool(single.any())
                if single.all():  # no interval anywhere: a line of open markers (its key shows no bar)
                    ax.plot(mine["lr"], mine[col], marker=marker, ls=ls, mfc="white", color=colour, label=name)
                else:
                    ax.errorbar(mine["lr"], mine[col], yerr=half.fillna(0), marker=marker, ls=ls, capsize=3,
                                color=colour, label=name)
                    ax.plot(mine["lr"][single], mine[col][single], ls="none", marker=marker, mfc="white",
                            color=colour, zorder=3)
                ids = (mine[f"{col} seed ids"] if f"{col} seed ids" in mine
                       else mine["seeds"].map(lambda n: f"n={n}"))  # a table from before the seed columns
                strip.append((marker, colour, dict(zip(mine["lr"], ids))))
            ax.axhline(here[f"paper: {col}"].iloc[0], color=colour, ls="--", lw=1, label=f"{label}, paper")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xscale("log")
        ax.set_title(f"{setting.upper()} clients")
        style.seed_strip(ax, strip, glyphs=ax is axes[0, 0])
        if len(rows):
            ax.set_xlabel(f"{rows['optimizer'].iloc[0].split()[0].capitalize()} step size (log scale)")
    axes[0, 0].set_ylabel("accuracy difference (points)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    note = ("bars: 95 % t interval over paired seeds; under the axis: the seeds of each point"
            + ("; open marker: one seed, no interval" if any_single else ""))
    fig.legend(handles, labels, loc="outside lower center", ncols=2, title=note, frameon=False)
    if len(rows):
        fig.suptitle(f"Gradient TTA as the reference clients ran it ({rows['cell'].iloc[0]}): where Local falls "
                     "below TTA-bn, does FedAvg gain?", fontsize=plt.rcParams["axes.titlesize"])
    return fig


def grad_drift_figure(gains: pd.DataFrame, runs: Optional[pd.DataFrame] = None, cell: str = "grad-running-adam",
                      lr: float = 3e-4) -> "Any":
    """Each strategy's gain over Local (``fidelity.strategy_gains`` rows: ours with its 95 % interval over paired
    seeds) beside FedTSA's Table 1 gain (black crosses), one panel per setting on one y-scale
    (``plots.gains_by_panel``): a strategy far off all the others (FedAvgM's collapse) is marked at the axis edge
    with its value instead of squashing the rest; the ±``stats.MARGIN`` equivalence band is shaded. ``runs``
    (``stored_table1_runs`` of the same cell): each strategy's seeds paired with Local's are named. Returns the
    figure."""
    import matplotlib.pyplot as plt

    from ftta_core import plots

    ran = gains.dropna(subset=["ours"])
    strategy_of = {v: k for k, v in METHOD_LABELS.items()}

    def seeds_beside_local(r: pd.Series) -> tuple:
        if runs is None or not len(runs):
            return ()
        here = runs[runs.setting == r["setting"]]
        mine = set(here.loc[here.strategy == strategy_of.get(r["method"], r["method"]), "seed"])
        return tuple(sorted(int(s) for s in mine & set(here.loc[here.strategy == "local", "seed"])))

    ours_label = f"ours, Adam {step_text(lr)}"
    ours = ran.assign(numbers=ours_label, ci95=(ran["high"] - ran["low"]) / 2)
    if runs is not None and len(runs):
        ours = ours.assign(**{"seed ids": [seeds_beside_local(r) for _, r in ran.iterrows()]})
    shown = pd.concat([ours, ran.assign(numbers=PAPER_T1_LABEL, ours=ran["paper"], seeds=5, ci95=float("nan"))])
    shown = shown.rename(columns={"ours": "gain over Local"}).assign(
        setting=lambda d: d.setting.str.upper() + " clients")
    axes = plots.gains_by_panel(shown, ["setting"], hue="numbers", err="ci95", marker_hue=PAPER_T1_LABEL,
                                tie=stats.MARGIN, clip_outliers=True, ncols=1, panel_size=(9.0, 3.0),
                                err_label="bar: 95 % t interval over paired seeds", key_title="")
    axes[0].figure.suptitle(f"What each server strategy adds over clients adapting alone (Local), gradient TTA "
                            f"({cell}, Adam {step_text(lr)});\na cell chosen after seeing results, where Local "
                            "drifts below TTA-bn as in the paper", fontsize=plt.rcParams["axes.titlesize"])
    return axes[0].figure

