#!/usr/bin/env python
"""Write the run presets under configs/ from the code's own config builders, and configs/README.md listing them.

    python configs/make_presets.py            # (re)write every preset and configs/README.md
    python configs/make_presets.py --check    # write nothing; exit 1 naming each file that differs or is stale

Each preset is one ``ExperimentConfig`` of a paper protocol (seed 0, the paper's own method as the strategy) for
``python -m ftta_core run --config FILE --out DIR``; its header names the paper, the table and what differs from the
paper, and how to get the table's other cells (``--strategy``, ``--seed``, ``--sh``, ...: flags override the file).
The configs come from the functions the notebooks and commands use (``fedtsa.table1.table1_config``, ``imbalance``'s
grid, the case-study and notebook parameters), so a preset run has the config hash of the stored run
(``workbook.config_key``). tests/test_presets.py checks that this script reproduces the committed files.

Fields a scenario does not read (``sh``, ``th``, ``n_steps`` outside the ``heterogeneity`` scenario) are left out;
floats are written so that any YAML loader reads them as floats (``1.0e-05``, not ``1e-5``).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

CONFIGS = Path(__file__).resolve().parent
REPO = CONFIGS.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from studies.pfedbbn import imbalance  # noqa: E402
from ftta_core.experiment import UNREAD_OUTSIDE_HETEROGENEITY, ExperimentConfig  # noqa: E402
from studies.paper import TTA_SETTINGS  # noqa: E402
from studies.fedtsa.table1 import table1_config
from ftta_core.workbook import config_key  # noqa: E402

WIDTH = 118
FEDTSA = "FedTSA (Zhang et al., 'Enabling Collaborative Test-Time Adaptation in Dynamic Environment via Federated " \
         "Learning', KDD 2024)"
FEDCTTA = "FedCTTA (Rajib et al., 'FedCTTA: A Collaborative Approach to Continual Test-Time Adaptation in Federated " \
          "Learning')"
PFEDBBN = "pFedBBN ('pFedBBN: A Personalized Federated Test-Time Adaptation with Balanced Batch Normalization for " \
          "Class-Imbalanced Data')"
# what differs from the papers wherever our CIFAR-10-C runs are concerned (README "Results so far")
OURS_CIFAR = ("our ResNet-8 source model (trained here: 82.7% clean, 63.5% on CIFAR-10-C severity 5 without "
              "adaptation; FedTSA's: 35.2%); our CIFAR-10 is a JPEG-compressed copy and CIFAR-10-C is generated on "
              "the fly (ftta_core.corruptions)")
TABLE1_STRATEGIES = ("local", "fedavg", "fedavg_ft", "fedprox", "fedavgm", "fedamp", "moon", "pfedsd", "pfedgraph",
                     "ldawa", "fedtsa", "fedctta")
SWEEP_SH = (0.05, 0.2, 0.5, 0.75)  # notebooks 11 and 20 (FedTSA Fig 4, FedCTTA Fig 2), TH fixed at 0.02
SWEEP_TH = (0.01, 0.02, 0.05, 0.1)  # SH fixed at 0.2
CASE_STUDY_STRATEGIES = ("local", "fedavg", "fedamp", "pfedgraph", "fedtsa", "fedctta")  # `study fedtsa case-study` default
GRAD_CELL_TEXT = {
    "bn": "TTA-bn (BN-adapt: batch statistics, nothing trained)",
    "grad": "TTA-grad (Tent on all parameters, SGD lr 1e-4, batch BN statistics: FedTSA's Sec. 5.1)",
    "grad-adam": "the TTA-grad 2x2 cell grad-adam (Tent, all parameters, Adam lr 1e-5 as FedTSA's reference code; "
                 "batch BN statistics)",
    "grad-running": "the TTA-grad 2x2 cell grad-running (Tent, all parameters, SGD lr 1e-4; BN running statistics "
                    "as FedTSA's reference clients: train-mode adaptation, eval-mode prediction, whole state mixed)",
    "grad-running-adam": "the TTA-grad 2x2 cell grad-running-adam (Tent, all parameters, Adam lr 1e-5, BN running "
                         "statistics as FedTSA's reference clients)",
}


@dataclass
class Preset:
    """One preset file: where it goes (relative to configs/), its config, and its header."""

    path: str
    cfg: ExperimentConfig
    title: str  # paper, table and cell
    differs: str  # what differs from the paper
    others: str  # how to get the table's other cells from this file
    source: str  # the builder it comes from
    stored: Optional[str] = None  # where the run of this config is stored ({key}: its config key), if anywhere
    stored_by: str = ""  # what stores it there
    group: str = ""  # configs/README.md section
    extra: List[str] = field(default_factory=list)  # more header paragraphs

    @property
    def key(self) -> str:
        return config_key(self.cfg)

    @property
    def command(self) -> str:
        return (f"python -m ftta_core run --config configs/{self.path} "
                f"--out runs/presets/{self.path.removesuffix('.yaml')}")

    @property
    def stored_path(self) -> Optional[str]:
        return self.stored.format(key=self.key) if self.stored else None

    def fields(self) -> Dict[str, Any]:
        """The config's fields as written (those the scenario reads)."""
        data = self.cfg.to_dict()
        if self.cfg.scenario != "heterogeneity":
            data = {k: v for k, v in data.items() if k not in UNREAD_OUTSIDE_HETEROGENEITY}
        return data

    def render(self) -> str:
        stored = (f"Stored by {self.stored_by} as {self.stored_path} (config key {self.key}, "
                  "ftta_core.workbook.config_key): a run of this file is that run." if self.stored else
                  f"Config key {self.key} (ftta_core.workbook.config_key).")
        paragraphs = [self.title, f"Differs from the paper: {self.differs}", f"Other cells: {self.others}",
                      *self.extra, stored,
                      f"Written by configs/make_presets.py from {self.source}; rerun that script, do not edit."]
        header = "\n".join(textwrap.fill(p, WIDTH, initial_indent="# ", subsequent_indent="#   ",
                                         break_on_hyphens=False, break_long_words=False) for p in paragraphs)
        header += f"\n# Run: {self.command}"  # one line, to copy
        body = yaml.safe_dump(self.fields(), sort_keys=False, default_flow_style=None, width=WIDTH)
        return f"{header}\n{body}"


def notebook_parameters(name: str) -> Dict[str, Any]:
    """The literal assignments of a notebook's papermill ``parameters`` cell (its defaults)."""
    from ftta_core.notebooks import notebook_parameters as defaults

    return defaults(REPO / "notebooks" / f"{name}.ipynb")


def labels(strategies: Sequence[str]) -> str:
    """Strategy names as alternatives for --strategy."""
    return " | ".join(strategies)


def case_study_config(orders: str = "fedtsa", tta: str = "bn", seed: int = 0) -> ExperimentConfig:
    """The base config of ``python -m ftta_core study fedtsa case-study`` (studies.fedtsa.commands.run_case_study; tests/test_presets.py checks the
    command builds this)."""
    return ExperimentConfig(dataset="cifar10", scenario="case_study" if orders == "fedtsa" else "case_study_fedctta",
                            clients=10, batch_size=10, images_per_client=500, severity=5, device="auto",
                            max_steps=None, seed=seed, **TTA_SETTINGS[tta])


def fedtsa_presets() -> List[Preset]:
    out = []
    for tta in TTA_SETTINGS:
        for setting in ("niid", "iid"):
            column = {"niid": "NIID column (4 areas of clients, each on its own corruption order)",
                      "iid": "IID column (every client on the same corruption order)"}[setting]
            cell = GRAD_CELL_TEXT[tta]
            in_paper = tta in ("bn", "grad")
            out.append(Preset(
                f"fedtsa/table1_{setting}_{tta}.yaml",
                dataclasses.replace(table1_config("cifar10", setting, tta), strategy="fedtsa", seed=0),
                title=(f"{FEDTSA}, Table 1: CIFAR-10-C, {column}, {cell}; the FedTSA row, seed 0 of the table's 5. "
                       "20 clients, batch 10, 500 images per client and corruption, 15 corruptions at severity 5."
                       + ("" if in_paper else " Not a cell of the paper: one of the four TTA-grad settings we "
                                               "compare (studies.paper.TTA_SETTINGS, notebook 10).")),
                differs=OURS_CIFAR + ("." if setting == "niid" or tta != "bn" else
                                      "; Table 2 (per corruption, IID, TTA-bn) reads these runs' accuracy per "
                                      "domain."),
                others=("--strategy NAME for the other rows: "
                        f"{' | '.join(s for s in TABLE1_STRATEGIES if s != 'fedtsa')}; --seed 1 .. 4 for the other "
                        f"seeds. The whole table: python -m ftta_core study fedtsa table --tta {tta} ... (README)."),
                source=f'studies.fedtsa.table1.table1_config("cifar10", "{setting}", "{tta}") with strategy fedtsa, seed 0',
                stored="figures/fedtsa_table1/runs/{key}.json",
                stored_by=f"`python -m ftta_core study fedtsa table --tta {tta}`" + (" (make paper-runs)" if in_paper else ""),
                group="FedTSA"))
    base = table1_config("cifar10", "niid", "bn")
    out.append(Preset(
        "fedtsa/table3_sh0.25.yaml",
        dataclasses.replace(base, scenario="heterogeneity", sh=0.25, th=1.0, strategy="fedtsa", seed=0),
        title=(f"{FEDTSA}, Table 3: spatial heterogeneity SH = 0.25, temporal IID (TH = 1: a new corruption at every "
               "step), 5 clusters of 4 clients, CIFAR-10-C, TTA-bn; the FedTSA row, seed 0."),
        differs=OURS_CIFAR + "; our heterogeneity scenario draws the clusters' corruptions (ftta_core.scenarios).",
        others=f"--strategy NAME for the other rows ({labels(['local', 'fedavg', 'fedamp', 'pfedgraph'])}).",
        source='notebook 11_fedtsa_ablations (table3_cfg: table1_config("cifar10", "niid", "bn") with scenario '
               'heterogeneity, sh 0.25, th 1.0), strategy fedtsa, seed 0',
        stored="figures/fedtsa_ablations/runs/{key}.json", stored_by="notebook 11_fedtsa_ablations",
        group="FedTSA"))
    out.append(Preset(
        "fedtsa/table4_case_study.yaml", dataclasses.replace(case_study_config("fedtsa"), strategy="fedtsa"),
        title=(f"{FEDTSA}, Table 4 and Figs 5-6: the case study, 10 clients in 3 groups (clients 1-4 walk the "
               "corruptions in order, 5-7 one slot ahead, 8-10 in reverse), 500 images per client and corruption, "
               "batch 10, severity 5, TTA-bn; the FedTSA row, seed 0."),
        differs=("CIFAR-10-C (the paper's Table 4 is on CIFAR-100-C, not available here); TTA-bn (the paper does not "
                 "say); " + OURS_CIFAR + "."),
        others=(f"--strategy NAME for the other rows ({labels([s for s in CASE_STUDY_STRATEGIES if s != 'fedtsa'])});"
                " the table with every strategy: python -m ftta_core study fedtsa case-study --out DIR."),
        source='the config of `python -m ftta_core study fedtsa case-study --tta bn` (studies.fedtsa.commands.run_case_study), strategy fedtsa',
        stored="figures/case_study/cifar10_bn/fedtsa/summary.json",
        stored_by="`python -m ftta_core study fedtsa case-study --out figures/case_study/cifar10_bn`",
        group="FedTSA"))
    out.append(Preset(
        "fedtsa/fig4_heterogeneity.yaml",
        dataclasses.replace(base, scenario="heterogeneity", sh=0.2, th=0.02, strategy="fedtsa", seed=0),
        title=(f"{FEDTSA}, Fig 4 (robustness to heterogeneity): CIFAR-10-C, TTA-bn, the heterogeneity scenario at "
               "SH = 0.2, TH = 0.02 (4 clusters of 5 clients, 50-step slots: the point both curves share); the FedTSA curve, seed 0."),
        differs=OURS_CIFAR + "; our heterogeneity scenario draws the clusters' corruptions (ftta_core.scenarios).",
        others=(f"the SH curve: --sh {' | '.join(map(str, SWEEP_SH))} (TH stays 0.02); the TH curve: --th "
                f"{' | '.join(map(str, SWEEP_TH))} (SH stays 0.2); --strategy NAME for the other curves "
                f"({labels(['fedavg', 'fedamp', 'pfedgraph'])})."),
        source='ftta_core.workbook.heterogeneity_sweep on table1_config("cifar10", "niid", "bn") (notebook '
               '11_fedtsa_ablations), strategy fedtsa, seed 0',
        stored="figures/fedtsa_ablations/runs/{key}.json", stored_by="notebook 11_fedtsa_ablations",
        group="FedTSA"))
    return out


def fedctta_presets() -> List[Preset]:
    out = []
    for tta in ("bn", "grad"):
        for setting in ("niid", "iid"):
            column = {"niid": "NIID column (4 clusters, SH = 0.2)", "iid": "IID column (one cluster)"}[setting]
            lr_note = ("; TTA-grad uses FedTSA's SGD lr 1e-4 (the FedCTTA paper states 1e-5): Table I is read from "
                       "the FedTSA Table 1 runs" if tta == "grad" else "")
            out.append(Preset(
                f"fedctta/table1_{setting}_{tta}.yaml",
                dataclasses.replace(table1_config("cifar10", setting, tta), strategy="fedctta", seed=0),
                title=(f"{FEDCTTA}, Table I: the FedTSA Table 1 protocol (20 clients, batch 10, 500 images per "
                       f"client and corruption, severity 5) on CIFAR-10-C, {column}, {GRAD_CELL_TEXT[tta]}; the "
                       "FedCTTA row, seed 0 of 5."
                       + (" Table II (per corruption, IID, TTA-bn) reads these runs' accuracy per domain."
                          if (setting, tta) == ("iid", "bn") else "")),
                differs=OURS_CIFAR + lr_note + ".",
                others=("--strategy NAME for the other rows: "
                        f"{' | '.join(s for s in TABLE1_STRATEGIES if s != 'fedctta')}; --seed 1 .. 4."),
                source=(f'studies.fedtsa.table1.table1_config("cifar10", "{setting}", "{tta}") with strategy fedctta, '
                        'seed 0'),
                stored="figures/fedtsa_table1/runs/{key}.json",
                stored_by=f"`python -m ftta_core study fedtsa table --tta {tta}` (make paper-runs)", group="FedCTTA"))
    out.append(Preset(
        "fedctta/table3_case_study.yaml", dataclasses.replace(case_study_config("fedctta"), strategy="fedctta"),
        title=(f"{FEDCTTA}, Table III: the case study with FedCTTA's corruption orders (clients 5-7 four "
               "corruptions ahead), 10 clients in 3 groups, 500 images per client and corruption, batch 10, "
               "severity 5, TTA-bn; the FedCTTA row, seed 0."),
        differs="TTA-bn assumed (the paper does not say); " + OURS_CIFAR + ".",
        others=("--strategy NAME for the other rows (local, fedavg, pfedgraph, fedtsa); the table: python -m "
                "ftta_core study fedtsa case-study --orders fedctta --out DIR."),
        source='the config of `python -m ftta_core study fedtsa case-study --orders fedctta` (studies.fedtsa.commands.run_case_study), strategy '
               'fedctta',
        stored="figures/case_study/cifar10_bn_fedctta/fedctta/summary.json",
        stored_by="`python -m ftta_core study fedtsa case-study --orders fedctta --out figures/case_study/cifar10_bn_fedctta`",
        group="FedCTTA"))
    base = table1_config("cifar10", "niid", "bn")
    out.append(Preset(
        "fedctta/fig2_heterogeneity.yaml",
        dataclasses.replace(base, scenario="heterogeneity", sh=0.2, th=0.02, strategy="fedctta", seed=0),
        title=(f"{FEDCTTA}, Fig 2 (spatial and temporal heterogeneity): CIFAR-10-C, TTA-bn, the heterogeneity "
               "scenario at SH = 0.2, TH = 0.02 (4 clusters of 5 clients, 50-step slots: the point both sweeps share); the FedCTTA curve, seed 0."),
        differs=OURS_CIFAR + "; our heterogeneity scenario draws the clusters' corruptions (ftta_core.scenarios).",
        others=(f"the SH sweep: --sh {' | '.join(map(str, SWEEP_SH))} (TH stays 0.02); the TH sweep: --th "
                f"{' | '.join(map(str, SWEEP_TH))} (SH stays 0.2); --strategy NAME for the other curves "
                f"({labels(['local', 'fedavg', 'fedamp', 'pfedgraph', 'fedtsa'])})."),
        source='ftta_core.workbook.heterogeneity_sweep on table1_config("cifar10", "niid", "bn") (notebook '
               '20_fedctta), strategy fedctta, seed 0',
        stored="figures/fedtsa_ablations/runs/{key}.json", stored_by="notebooks 11_fedtsa_ablations and 20_fedctta",
        group="FedCTTA"))
    p = notebook_parameters("20_fedctta")
    digits = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", clients=p["clients"], sh=0.5,
                              corruptions=["fog", "contrast", "frost", "glass_blur", "impulse_noise", "brightness"],
                              images_per_client=p["images_per_client"], slot_steps=p["slot_steps"], local="bn",
                              device="cpu", seed=p["seed"], strategy="fedctta")
    out.append(Preset(
        "fedctta/table4_digits.yaml", digits,
        title=(f"{FEDCTTA}, Table IV (probe data x statistic x distance) and Fig 5 (aggregation interval), as "
               "notebook 20 runs them: the embedded digits stream (8 clients in 4 clusters, SH = 0.5, 6 "
               "corruptions, 6-step slots), TTA-bn; FedCTTA at its defaults (random-noise probes, logits, Euclidean: the "
               "paper's choice), seed 0."),
        differs=("the paper runs Table IV on CIFAR-10-C under TTA-grad, NIID; ours is the small digits stream under "
                 "TTA-bn (notebook 20 says why); probes of clean images need a tensor of images, which a config "
                 "cannot hold (notebook 20 passes one to the strategy)."),
        others=("--strategy-param distance=kl | cross_entropy | cosine, --strategy-param on=features (with "
                "euclidean or cosine): the other Table IV cells on noise probes; --strategy-param interval=K: Fig 5a; "
                "--strategy local | fedavg: the references."),
        source="the stream config of notebook 20_fedctta (its parameters cell), strategy fedctta",
        group="FedCTTA"))
    return out


def pfedbbn_presets() -> List[Preset]:
    base = imbalance.pfedbbn_config()
    variants = imbalance.table1_variants(base)
    out = []
    for alpha in imbalance.TABLE1_ALPHAS:
        setting = imbalance.setting_label(alpha)
        tag = "iid" if alpha is None else f"alpha{alpha:g}"
        col = imbalance.paper_column(alpha)
        column = ("IID column (no label skew)" if alpha is None else
                  f"Non-IID column {col} (Dirichlet label skew alpha = {alpha:g}, ASSUMED for that column: the "
                  "paper's alphas were lost in extraction, studies.pfedbbn.imbalance.PAPER_NONIID_ALPHAS)")
        rows = [(m, "local") for m in imbalance.TABLE1_METHODS] + [imbalance.FULL_METHOD]
        for method, strategy in rows:
            name = f"{method}+{strategy} {setting}"
            mlabel, slabel = imbalance.METHOD_LABELS[method], imbalance.STRATEGY_LABELS[strategy]
            full = (method, strategy) == imbalance.FULL_METHOD
            figures = (" Table 3 and Figs 3-5 (with Table 6 beside Fig 3) are read from the alpha = 0.01 runs."
                       if alpha == 0.01 else "")
            out.append(Preset(
                f"pfedbbn/table1_{tag}_{'pfedbbn' if full else method}.yaml",
                dataclasses.replace(base, **variants[name], seed=0),
                title=(f"{PFEDBBN}, Table 1: CIFAR-10-C, {column}; the row {mlabel} + {slabel}"
                       + (" (the full method)" if full else " (local adaptation, no server)")
                       + ", seed 0. 10 clients, batch 200, 1,000 images per client and corruption (5 rounds each, "
                         "75 in all), 15 corruptions at severity 5." + figures),
                differs=("our ResNet-8 source model (the paper: WideResNet-28); the clients walk the corruptions in "
                         "FedTSA's 4-area map (at any time 4 corruptions are live); local methods at the "
                         "continual benchmark's settings (studies.centralized.REFERENCE_PARAMS); our CIFAR-10 is a "
                         "JPEG-compressed copy and CIFAR-10-C is generated on the fly."),
                others=("the row's other servers: --strategy "
                        f"{' | '.join(s for s in imbalance.TABLE1_STRATEGIES if s != 'local')}"
                        + ("" if full else f" (the {mlabel} row of each server)")
                        + ". Other methods and columns: the other configs/pfedbbn/table1_*.yaml files."),
                source=(f"studies.pfedbbn.imbalance.pfedbbn_config() with the table1_variants variant {name!r}, seed 0 "
                        "(notebook 30_pfedbbn's full grid)"),
                stored="figures/pfedbbn/runs/{key}.json", stored_by="notebook 30_pfedbbn's grid",
                group="pFedBBN"))
    return out


def quickstart_preset() -> Preset:
    p = notebook_parameters("00_quickstart")
    cfg = ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", corruptions=p["corruptions"],
                           severity=5, clients=p["clients"], batch_size=10, images_per_client=100, sh=0.5, th=0.1,
                           local=p["local"], device="auto", seed=p["seed"], strategy="fedamp")
    return Preset(
        "quickstart.yaml", cfg,
        title=("Quickstart (notebook 00_quickstart, `make quickstart`): no paper's table; a small federated TTA "
               "experiment on the embedded digits (scikit-learn's 1,797 digits at 16x16, no download): 8 clients in "
               "4 clusters (SH = 0.5) on 6 corruptions, a new one every 10 steps (TH = 0.1), TTA-bn, FedAMP; "
               "seconds on a CPU."),
        differs="not a paper protocol (the paper presets are under configs/fedtsa, fedctta and pfedbbn).",
        others=f"--strategy {' | '.join(s for s in p['strategies'] if s != 'fedamp')} (the notebook's other "
               "strategies); --smoke runs a few steps.",
        source="the parameters and base config of notebook 00_quickstart, strategy fedamp", group="Quickstart")


def presets() -> List[Preset]:
    """Every preset, in configs/README.md order."""
    return [quickstart_preset(), *fedtsa_presets(), *fedctta_presets(), *pfedbbn_presets()]


def readme(items: Sequence[Preset]) -> str:
    """configs/README.md: every preset, what it is and its command."""
    lines = ["# Run presets", "",
             "Written by `python configs/make_presets.py` (do not edit; `tests/test_presets.py` checks the files "
             "match it). Each file is one config of a paper protocol for `python -m ftta_core run --config FILE "
             "--out DIR`; its header says which table and cell it is, what differs from the paper and which flags "
             "give the table's other cells (flags override the file: `--strategy`, `--seed`, `--sh`, `--th`, "
             "`--strategy-param`, `--smoke`). The table of paper tables to presets is in the top-level README "
             "(\"Presets\").", ""]
    for group in dict.fromkeys(p.group for p in items):
        lines += [f"## {group}", "", "| file | config key | its run is stored as |", "|---|---|---|"]
        for p in (q for q in items if q.group == group):
            stored = f"`{p.stored_path}`" if p.stored else "-"
            lines.append(f"| [`{p.path}`]({p.path}) | `{p.key}` | {stored} |")
        lines.append("")
    lines += ["Run any of them: `python -m ftta_core run --config configs/FILE --out runs/presets/NAME` (add `--smoke` "
              "for a few steps)."]
    return "\n".join(lines) + "\n"


def rendered(items: Optional[Sequence[Preset]] = None) -> Dict[str, str]:
    """{path relative to configs/: text} of every file this script writes."""
    items = presets() if items is None else items
    paths = [p.path for p in items]
    duplicates = sorted({p for p in paths if paths.count(p) > 1})
    if duplicates:
        raise ValueError(f"two presets share a path: {duplicates}")
    return {**{p.path: p.render() for p in items}, "README.md": readme(items)}


def stale(out_dir: Path, files: Dict[str, str]) -> List[str]:
    """YAML files under ``out_dir`` this script does not write (renamed or removed presets)."""
    return sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*.yaml") if str(p.relative_to(out_dir))
                  not in files)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    parser.add_argument("--out-dir", type=Path, default=CONFIGS, help="where to write (default: configs/)")
    args = parser.parse_args(argv)
    files = rendered()
    if args.check:
        bad = [p for p, text in files.items()
               if not (args.out_dir / p).is_file() or (args.out_dir / p).read_text() != text]
        extra = stale(args.out_dir, files)
        for p in bad:
            print(f"differs from make_presets.py: {p}")
        for p in extra:
            print(f"not written by make_presets.py (stale?): {p}")
        if bad or extra:
            print("rerun: python configs/make_presets.py")
            return 1
        print(f"{len(files)} files up to date")
        return 0
    for p, text in files.items():
        path = args.out_dir / p
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")
    for p in stale(args.out_dir, files):
        print(f"not written by make_presets.py (remove it if stale): {args.out_dir / p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
