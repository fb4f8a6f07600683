"""The run presets under configs/: they load, they are what configs/make_presets.py writes, a preset of a stored
protocol has the stored run's config hash (so `run --config PRESET` is that run), and one runs end to end."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ftta_core.experiment import ExperimentConfig, identity_of
from studies.paper import TTA_SETTINGS
from studies.fedtsa.table1 import table1_config
from ftta_core.workbook import config_key, stored_path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
PRESET_FILES = sorted(CONFIGS.rglob("*.yaml"))
PAPERS = ("FedTSA", "FedCTTA", "pFedBBN", "Quickstart")
NUMBER = re.compile(r"^[-+]?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?$")
SMOKE_TIMEOUT_S = 600


def make_presets():
    """configs/make_presets.py as a module (configs/ is not a package)."""
    name = "ftta_make_presets"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, CONFIGS / "make_presets.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file executes
        spec.loader.exec_module(module)
    return sys.modules[name]


def load(rel: str) -> dict:
    return yaml.safe_load((CONFIGS / rel).read_text())


def preset(rel: str, **overrides) -> ExperimentConfig:
    """The config of configs/REL as `run --config` builds it, with flags ``overrides``."""
    return ExperimentConfig.from_dict({**load(rel), **overrides})


def strings_that_look_like_numbers(value, where=""):
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings_that_look_like_numbers(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [s for i, v in enumerate(value) for s in strings_that_look_like_numbers(v, f"{where}[{i}]")]
    return [f"{where}: {value!r}"] if isinstance(value, str) and NUMBER.match(value) else []


def test_there_is_a_preset_for_each_protocol():
    names = {str(p.relative_to(CONFIGS)) for p in PRESET_FILES}
    expected = {"quickstart.yaml", "fedtsa/table3_sh0.25.yaml", "fedtsa/table4_case_study.yaml",
                "fedtsa/fig4_heterogeneity.yaml", "fedctta/table3_case_study.yaml", "fedctta/fig2_heterogeneity.yaml",
                "fedctta/table4_digits.yaml"}
    expected |= {f"fedtsa/table1_{s}_{t}.yaml" for s in ("niid", "iid") for t in TTA_SETTINGS}
    expected |= {f"fedctta/table1_{s}_{t}.yaml" for s in ("niid", "iid") for t in ("bn", "grad")}
    expected |= {f"pfedbbn/table1_{a}_{m}.yaml" for a in ("iid", "alpha0.1", "alpha0.01", "alpha0.001")
                 for m in ("tent", "cotta", "roid", "rotta", "bbn", "pfedbbn")}
    assert expected <= names, f"missing presets: {sorted(expected - names)}"


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_preset_loads_with_safe_load_and_says_what_it_is(path):
    text = path.read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert text.startswith("# ") and any(p in text.splitlines()[0] for p in PAPERS), "first line: the paper"
    assert any(line.startswith("# Differs from the paper:") for line in header)
    rel = path.relative_to(CONFIGS)
    assert f"# Run: python -m ftta_core run --config configs/{rel} --out " in text
    data = yaml.safe_load(text)  # plain PyYAML, not the CLI's loader: floats must be written as YAML 1.1 floats
    assert not strings_that_look_like_numbers(data), "numbers that YAML reads as strings (write 1.0e-4, not 1e-4)"
    cfg = ExperimentConfig.from_dict(data)
    assert cfg.seed == 0 and not cfg.smoke
    assert f"config key {config_key(cfg)}" in " ".join(h.lstrip("# ") for h in header).lower()


def test_presets_are_what_make_presets_writes(tmp_path):
    mp = make_presets()
    files = mp.rendered()
    for rel, text in files.items():
        assert (CONFIGS / rel).is_file(), f"configs/{rel} missing: run python configs/make_presets.py"
        assert (CONFIGS / rel).read_text() == text, f"configs/{rel} differs: run python configs/make_presets.py"
    assert mp.stale(CONFIGS, files) == [], "YAML files under configs/ that make_presets.py does not write"
    # and the script itself writes them (into another folder here)
    assert mp.main(["--out-dir", str(tmp_path)]) == 0
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == sorted(files)
    assert mp.main(["--check", "--out-dir", str(tmp_path)]) == 0
    (tmp_path / "quickstart.yaml").write_text("seed: 1\n")
    assert mp.main(["--check", "--out-dir", str(tmp_path)]) == 1


@pytest.mark.parametrize("tta", list(TTA_SETTINGS))
@pytest.mark.parametrize("setting", ["niid", "iid"])
def test_fedtsa_table1_preset_is_the_table1_config(setting, tta):
    rel = f"fedtsa/table1_{setting}_{tta}.yaml"
    base = table1_config("cifar10", setting, tta)
    assert config_key(preset(rel)) == config_key(dataclasses.replace(base, strategy="fedtsa", seed=0))
    # --strategy / --seed give the other cells, as `study fedtsa table` stores them (run_grid, run_strategy_grid)
    for strategy, seed in (("local", 0), ("fedavg", 3), ("fedctta", 4)):
        want = dataclasses.replace(base, strategy=strategy, strategy_params={}, seed=seed)
        assert config_key(preset(rel, strategy=strategy, seed=seed)) == config_key(want)


@pytest.mark.parametrize("tta", ["bn", "grad"])
@pytest.mark.parametrize("setting", ["niid", "iid"])
def test_fedctta_table1_preset_is_the_table1_config(setting, tta):
    want = dataclasses.replace(table1_config("cifar10", setting, tta), strategy="fedctta", seed=0)
    assert config_key(preset(f"fedctta/table1_{setting}_{tta}.yaml")) == config_key(want)


class Captured(Exception):
    """Raised by a patched grid function to stop a command once its config is built."""


def test_fedtsa_table_command_builds_the_presets_config(monkeypatch, tmp_path):
    """`study fedtsa table` (which stores the Table 1 runs) builds table1_config, so the presets name its runs."""
    import ftta_core.workbook as workbook
    from ftta_core import cli

    def capture(base, *args, **kwargs):
        raise Captured(base)

    monkeypatch.setattr(workbook, "run_grid", capture)
    monkeypatch.setattr(workbook, "run_strategy_grid", capture)
    for tta in TTA_SETTINGS:
        for setting in ("niid", "iid"):
            with pytest.raises(Captured) as got:
                cli.main(["study", "fedtsa", "table", "--tta", tta, "--strategies", "fedtsa", "--seeds", "0", "--settings",
                          setting, "--results", str(tmp_path / "r"), "--table", str(tmp_path / "t")])
            base = got.value.args[0]
            assert config_key(dataclasses.replace(base, strategy="fedtsa", seed=0)) == \
                config_key(preset(f"fedtsa/table1_{setting}_{tta}.yaml"))


@pytest.mark.parametrize("orders, rel", [("fedtsa", "fedtsa/table4_case_study.yaml"),
                                         ("fedctta", "fedctta/table3_case_study.yaml")])
def test_case_study_presets_are_the_case_study_command(monkeypatch, tmp_path, orders, rel):
    import ftta_core.workbook as workbook
    from ftta_core import cli

    def capture(base, strategies, out_dir, *args, **kwargs):
        raise Captured(base)

    monkeypatch.setattr(workbook, "run_stored", capture)
    with pytest.raises(Captured) as got:
        cli.main(["study", "fedtsa", "case-study", "--orders", orders, "--out", str(tmp_path)])
    cfg = preset(rel)
    # `study fedtsa case-study` keeps each strategy's run under OUT/<strategy>/ with base's config and that strategy
    assert cfg.identity() == dataclasses.replace(got.value.args[0], strategy=cfg.strategy).identity()


@pytest.mark.parametrize("rel, strategy", [("fedtsa/fig4_heterogeneity.yaml", "fedtsa"),
                                           ("fedctta/fig2_heterogeneity.yaml", "fedctta")])
def test_heterogeneity_presets_give_every_point_of_the_sweeps(rel, strategy):
    """`--sh V` / `--th V` on the preset give the configs heterogeneity_sweep stores (FedTSA Fig 4, FedCTTA Fig 2)."""
    mp = make_presets()
    base = table1_config("cifar10", "niid", "bn")  # notebooks 11 and 20
    for field, values, fixed in (("sh", mp.SWEEP_SH, {"th": 0.02}), ("th", mp.SWEEP_TH, {"sh": 0.2})):
        for v in values:
            want = dataclasses.replace(base, scenario="heterogeneity", **{field: v, **fixed}, strategy=strategy,
                                       strategy_params={}, seed=0)
            assert config_key(preset(rel, **{field: v})) == config_key(want), (field, v)


def test_pfedbbn_presets_are_the_table1_grid():
    from studies.pfedbbn import imbalance

    base = imbalance.pfedbbn_config()
    variants = imbalance.table1_variants(base)
    for alpha in imbalance.TABLE1_ALPHAS:
        tag = "iid" if alpha is None else f"alpha{alpha:g}"
        setting = imbalance.setting_label(alpha)
        for method in (*imbalance.TABLE1_METHODS, "pfedbbn"):
            name = "bbn+pfedbbn" if method == "pfedbbn" else f"{method}+local"
            want = dataclasses.replace(base, **variants[f"{name} {setting}"], seed=0)  # as run_grid builds it
            rel = f"pfedbbn/table1_{tag}_{method}.yaml"
            assert config_key(preset(rel)) == config_key(want), rel
            if method != "pfedbbn":  # --strategy gives the method's row under each server
                for s in imbalance.TABLE1_STRATEGIES:
                    other = dataclasses.replace(base, **variants[f"{method}+{s} {setting}"], seed=0)
                    assert config_key(preset(rel, strategy=s)) == config_key(other), (rel, s)


def test_quickstart_preset_is_the_quickstart_notebooks_config():
    params = make_presets().notebook_parameters("00_quickstart")
    cfg = preset("quickstart.yaml")
    assert (cfg.clients, cfg.local, cfg.corruption_list, cfg.seed) == \
        (params["clients"], params["local"], params["corruptions"], params["seed"])
    assert cfg.strategy in params["strategies"] and cfg.dataset == "embedded_digits"


@pytest.mark.parametrize("rel", ["fedtsa/table1_niid_bn.yaml", "fedtsa/table1_iid_bn.yaml",
                                 "fedtsa/table1_niid_grad.yaml", "fedtsa/table1_iid_grad.yaml",
                                 "fedctta/table1_niid_bn.yaml", "fedctta/table1_iid_grad.yaml",
                                 "pfedbbn/table1_alpha0.01_pfedbbn.yaml"])
def test_stored_paper_runs_are_found_by_the_presets_config(rel):
    """The committed run of a preset's config is where the grids look for it, with the preset's config."""
    stored = next(p for p in make_presets().presets() if p.path == rel).stored
    folder = REPO / Path(stored).parent
    if not folder.is_dir():
        pytest.skip(f"no stored runs under {folder}")
    cfg = preset(rel)
    found = stored_path(cfg, folder)
    assert found is not None, f"{rel}: no stored run {config_key(cfg)}.json under {folder}"
    assert identity_of(json.loads(found.read_text())["config"]) == cfg.identity()


def test_quickstart_preset_runs_end_to_end_in_smoke_mode(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "ftta_core", "run", "--config", "configs/quickstart.yaml", "--out",
                           str(out), "--smoke", "--server-threads", "0"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=SMOKE_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"] == {**preset("quickstart.yaml").to_dict(), "smoke": True}
    assert summary["n_predictions"] > 0 and 0 <= summary["accuracy"] <= 100
    assert (out / "steps.csv").is_file() and (out / "collaboration.npz").is_file()
