"""The command line's experiment options are generated from ExperimentConfig: every field has an option and a help
string, a new field gets one without code, old flag spellings keep working, registries (plugins included) are listed,
and the example plugin runs through ``python -m ftta_core run --plugin``."""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

from ftta_core import experiment
from ftta_core.cli import build_parser, main, read_config
from ftta_core.cli_config import FIELD_HELP, add_config_options, config_values, flag
from ftta_core.experiment import ExperimentConfig

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_PLUGIN = REPO / "examples" / "my_plugin.py"
FIELDS = [f.name for f in dataclasses.fields(ExperimentConfig)]


class Captured(Exception):
    """Raised by the stand-in for ``run_experiment``: carries the config the command line built."""


@pytest.fixture
def captured(monkeypatch, tmp_path):
    """``main(["run", *argv])`` builds its config and stops there; returns a function giving that config."""
    def fake_run(cfg, **kwargs):
        raise Captured(cfg)

    monkeypatch.setattr(experiment, "run_experiment", fake_run)

    def run(*argv: str) -> ExperimentConfig:
        with pytest.raises(Captured) as exc:
            main(["run", *argv, "--out", str(tmp_path / "out")])
        return exc.value.args[0]

    return run


def command_parser(name: str):
    """The sub-parser of command ``name`` with its generated options added."""
    parser = build_parser()
    for word in name.split():  # "study fedtsa table": the sub-parser of each word in turn
        parser = parser._subparsers._group_actions[0].choices[word]
    return parser.complete([])


def sample_argv(name: str, config: type = ExperimentConfig) -> list:
    """A command line giving field ``name`` a valid non-default value."""
    values = {"dataset": "cifar10", "scenario": "fedtsa_iid", "corruptions": "fog,contrast", "local": "tent",
              "strategy": "fedamp", "model": "resnet8_cifar10", "backend": "loop", "device": "cpu", "severity": "3",
              "local_params": "lr=0.001", "strategy_params": "window=3", "smoke": None,
              "images_per_client": "30",  # at least batch_size (10)
              "robust_mixing": "median", "attack": "bn_x5:1"}
    kind = {f.name: f.type for f in dataclasses.fields(config)}[name]
    value = values.get(name, "0.5" if "float" in str(kind) else "3")
    return [flag(name)] + ([] if value is None else [value])


def test_every_config_field_has_a_help_string():
    assert sorted(FIELD_HELP) == sorted(FIELDS), "FIELD_HELP (ftta_core/cli_config.py) must have one entry per field"
    assert all(text.strip() for text in FIELD_HELP.values())


@pytest.mark.parametrize("name", FIELDS)
def test_every_config_field_is_an_option_that_reaches_the_config(name, captured):
    parser = command_parser("run")
    assert flag(name) in parser._option_string_actions, f"run has no option for config field {name!r}"
    assert FIELD_HELP[name] in parser._option_string_actions[flag(name)].help
    needs = {"model": ["--dataset", "cifar10"], "local_params": ["--local", "tent"],
             "strategy_params": ["--strategy", "fedtsa"]}  # a value valid only with another field
    argv = sample_argv(name) + needs.get(name, [])
    cfg = captured(*argv)
    default = ExperimentConfig()
    assert getattr(cfg, name) != getattr(default, name), f"{' '.join(argv)} did not reach the config"


def test_participation_reaches_the_config(captured):
    assert captured("--participation", "0.5").participation == 0.5
    assert captured().participation == 1.0


def test_a_new_field_gets_an_option_without_code():
    @dataclasses.dataclass
    class Extended:
        depth: int = 3
        rate: Optional[float] = None
        verbose: bool = False
        name: str = "a"
        extra_params: Dict[str, Any] = dataclasses.field(default_factory=dict)

    import argparse

    parser = argparse.ArgumentParser()
    add_config_options(parser, Extended, choices={"name": ["a", "b"]}, help_text={"depth": "how deep"})
    args = parser.parse_args(["--depth", "5", "--rate", "none", "--verbose", "--name", "b", "--extra-param", "k=1e-3",
                              "--extra-param", "s=x"])
    assert config_values(args, Extended) == {"depth": 5, "rate": None, "verbose": True, "name": "b",
                                             "extra_params": {"k": 1e-3, "s": "x"}}
    assert config_values(parser.parse_args(["--no-verbose"]), Extended) == {"verbose": False}  # only what was given
    assert "how deep" in parser.format_help() and "one of: a, b" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--depth", "x"])


def test_old_flag_spellings_still_work(captured):
    cfg = captured("--dataset", "embedded_digits", "--scenario", "heterogeneity", "--clients", "4", "--batch-size", "8",
                   "--images-per-client", "40", "--corruptions", "gaussian_noise,contrast", "--severity", "4",
                   "--sh", "0.5", "--th", "0.5", "--label-alpha", "0.1", "--local", "tent", "--local-param",
                   "lr=1e-4", "--strategy", "fedtsa", "--strategy-param", "window=3", "--seed", "2", "--backend",
                   "loop", "--device", "cpu", "--max-steps", "3", "--smoke")
    assert (cfg.batch_size, cfg.images_per_client, cfg.label_alpha, cfg.max_steps, cfg.smoke) == (8, 40, 0.1, 3, True)
    assert cfg.local_params == {"lr": 1e-4} and cfg.strategy_params == {"window": 3}


def test_flags_override_a_config_file_also_back_to_none_or_false(tmp_path, captured):
    config = tmp_path / "c.yaml"
    config.write_text("label_alpha: 0.1\nsmoke: true\nlocal: tent\nlocal_params: {lr: 1E-5}\n")
    cfg = captured("--config", str(config), "--label-alpha", "none", "--no-smoke", "--local-param", "steps=2")
    assert (cfg.label_alpha, cfg.smoke, cfg.local) == (None, False, "tent")
    assert cfg.local_params == {"lr": 1e-5, "steps": 2}


@pytest.mark.parametrize("preset", sorted((REPO / "configs").rglob("*.yaml"))[:6], ids=lambda p: p.name)
def test_presets_run_unchanged_through_the_command_line(preset, captured):
    assert captured("--config", str(preset)) == ExperimentConfig.from_dict(read_config(preset))


def test_the_help_lists_every_scenario_and_registered_method():
    from ftta_core.experiment import SCENARIOS
    from ftta_core.strategies import STRATEGIES
    from ftta_core.tta import LOCAL_METHODS

    text = " ".join(command_parser("run").format_help().split())
    for names in (SCENARIOS, LOCAL_METHODS, STRATEGIES):
        assert all(name in text for name in names)


@pytest.mark.parametrize("command, fields", [("study fedtsa table", ("dataset", "device", "backend", "max_steps")),
                                             ("study fedtsa case-study", ("seed", "dataset", "device", "max_steps")),
                                             ("study centralized table", ("dataset", "batch_size", "severity",
                                                                          "corruptions", "seed", "device", "backend"))])
def test_commands_that_build_configs_share_the_generated_options(command, fields):
    parser = command_parser(command)
    for name in fields:
        assert FIELD_HELP[name] in parser._option_string_actions[flag(name)].help, (command, name)


def _class_sources(path: Path) -> Dict[str, str]:
    """The source of every class defined at the top level of ``path`` (a notebook source or a module)."""
    tree = ast.parse(path.read_text())
    return {node.name: ast.unparse(node) for node in tree.body if isinstance(node, ast.ClassDef)}


def test_the_notebook_loads_the_example_plugin_and_defines_no_copy():
    plugin = _class_sources(EXAMPLE_PLUGIN)
    assert set(plugin) == {"PriorBN", "IndicatorSoftmax"}
    notebook = REPO / "notebooks" / "60_your_method.py"
    assert not _class_sources(notebook), "notebook 60 must load examples/my_plugin.py, not repeat its classes"
    assert '"../examples/my_plugin.py"' in notebook.read_text()


def child_env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FTTA_PLUGINS", "FTTA_PLAN")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.slow  # starts real processes: make test, not make test-fast
def test_the_example_plugin_runs_and_is_listed_through_the_command_line(tmp_path):
    base = [sys.executable, "-m", "ftta_core", "run", "--plugin", str(EXAMPLE_PLUGIN.relative_to(REPO))]
    out = tmp_path / "run"
    proc = subprocess.run([*base, "--local", "prior_bn", "--local-param", "prior=8", "--strategy",
                           "indicator_softmax", "--dataset", "embedded_digits", "--scenario", "heterogeneity",
                           "--clients", "4", "--corruptions", "gaussian_noise,contrast", "--images-per-client", "40",
                           "--batch-size", "8", "--sh", "0.5", "--th", "0.5", "--device", "cpu", "--participation",
                           "0.5", "--max-steps", "4", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, env=child_env(FTTA_CACHE_DIR=str(tmp_path / "c")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((out / "summary.json").read_text())["config"]
    assert (config["local"], config["strategy"], config["local_params"]) == ("prior_bn", "indicator_softmax",
                                                                             {"prior": 8})
    assert config["participation"] == 0.5
    listed = subprocess.run([*base, "--help"], capture_output=True, text=True, cwd=REPO, env=child_env())
    text = " ".join(listed.stdout.split())
    assert listed.returncode == 0 and "prior_bn" in text and "indicator_softmax" in text
