"""Strict config types: a wrongly typed field, a non-mapping config file or a model that does not fit the dataset
is refused with one line naming it; the command line reports config and data errors without a traceback."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ftta_core import experiment
from ftta_core.cli import main, read_config
from ftta_core.cli_config import key_values as _key_values
from ftta_core.data.cache import DataIntegrityError
from ftta_core.experiment import DATASET_DEFAULTS, ExperimentConfig
from ftta_core.workbook import summary_config

REPO = Path(__file__).resolve().parent.parent


class Captured(Exception):
    """Raised by the stand-in for ``run_experiment``: carries the config the CLI built (nothing runs)."""


@pytest.fixture
def captured(monkeypatch):
    """``run --config ...`` builds its config and stops there; returns a function giving that config."""

    def fake_run(cfg, **kwargs):
        raise Captured(cfg)

    monkeypatch.setattr(experiment, "run_experiment", fake_run)

    def run(tmp_path: Path, *argv: str) -> ExperimentConfig:
        with pytest.raises(Captured) as exc:
            main(["run", *argv, "--out", str(tmp_path / "out")])
        return exc.value.args[0]

    return run


def run_cli(tmp_path: Path, capsys, yaml_text: str | None, *argv: str) -> tuple[int, str]:
    """``run --config FILE`` (FILE holding ``yaml_text``; None: no file); returns (status, stderr)."""
    config = tmp_path / "config.yaml"
    if yaml_text is not None:
        config.write_text(yaml_text)
    rc = main(["run", "--config", str(config), *argv, "--out", str(tmp_path / "out")])
    return rc, capsys.readouterr().err


def one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------------------------------------------------------
# field types


@pytest.mark.parametrize("field, value, message", [
    ("smoke", "false", "'smoke': must be true or false, got 'false' (str)"),
    ("smoke", 0, "'smoke': must be true or false, got 0 (int)"),
    ("seed", 1.5, "'seed': must be an integer, got 1.5 (float)"),
    ("clients", True, "'clients': must be an integer, got True (bool)"),
    ("severity", 5.0, "'severity': must be an integer, got 5.0 (float); write 5"),
    ("batch_size", "10", "'batch_size': must be an integer, got '10' (str)"),
    ("max_steps", False, "'max_steps': must be an integer or null, got False (bool)"),
    ("n_steps", 2.0, "'n_steps': must be an integer or null"),
    ("sh", "0.2", "'sh': must be a number, got '0.2' (str)"),
    ("participation", True, "'participation': must be a number, got True (bool)"),
    ("label_alpha", "0.5", "'label_alpha': must be a number or null, got '0.5' (str)"),
    ("device", 0, "'device': must be a string, got 0 (int)"),
    ("model", 3, "'model': must be a string or null"),
    ("local_params", None, "'local_params': must be a mapping"),
    ("strategy_params", ["window", 3], "'strategy_params': must be a mapping"),
    ("corruptions", 5, "'corruptions': must be 'all', a comma-separated string or a list of names"),
    ("corruptions", ["fog", 3], "'corruptions': must be 'all'"),
])
def test_wrongly_typed_field_is_refused_naming_it(field, value, message):
    with pytest.raises(ValueError) as exc:
        ExperimentConfig(**{field: value})
    assert str(exc.value).startswith(f"config field {message}")


def test_right_types_are_kept_and_numpy_scalars_become_python_ones():
    cfg = ExperimentConfig(sh=1, th=0.5, participation=1, label_alpha=2, seed=np.int64(3), clients=np.int32(4),
                           smoke=np.bool_(True), max_steps=None)
    assert (cfg.sh, cfg.participation, cfg.label_alpha) == (1, 1, 2)  # ints are valid floats, left as written
    assert type(cfg.seed) is int and type(cfg.clients) is int and cfg.smoke is True
    assert json.loads(json.dumps(cfg.to_dict()))["seed"] == 3
    assert ExperimentConfig(sh=np.float32(0.5)).sh == 0.5 and type(ExperimentConfig(sh=np.float32(0.5)).sh) is float


@pytest.mark.parametrize("data, got", [(None, "nothing"), ([], "a list"), ([{"seed": 1}], "a list"),
                                       ("seed: 1", "a str"), (3, "a int")])
def test_from_dict_refuses_a_non_mapping(data, got):
    with pytest.raises(ValueError, match=f"a config must be a mapping of field names to values, got {got}"):
        ExperimentConfig.from_dict(data)


def test_from_dict_names_unknown_fields_even_with_non_string_keys():
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['1', 'sede'\]"):
        ExperimentConfig.from_dict({"sede": 1, 1: 2})


# ------------------------------------------------------------------------------------------------------------------
# model / dataset compatibility


def test_model_that_does_not_fit_the_dataset_is_refused_naming_both():
    with pytest.raises(ValueError) as exc:
        ExperimentConfig(dataset="embedded_digits", model="resnet8_cifar10")
    msg = str(exc.value)
    assert msg.startswith("config field 'model': ") and "'resnet8_cifar10'" in msg and "'embedded_digits'" in msg
    assert "trained on cifar10" in msg and "['digits_cnn_embedded']" in msg and "\n" not in msg
    with pytest.raises(ValueError, match="'digits_cnn_embedded' was trained on embedded_digits.*'digits/usps'"):
        ExperimentConfig(dataset="digits/usps", model="digits_cnn_embedded")
    with pytest.raises(ValueError, match="'cnn2_digits' was trained on digits/mnistm at size 32.*'cifar10'"):
        ExperimentConfig(dataset="cifar10", model="cnn2_digits")


@pytest.mark.parametrize("dataset", sorted(DATASET_DEFAULTS))
def test_every_dataset_accepts_its_default_model_named_explicitly(dataset):
    default = DATASET_DEFAULTS[dataset]["model"]
    assert ExperimentConfig(dataset=dataset, model=default).model_name == default
    assert ExperimentConfig(dataset=dataset).model_name == default


# ------------------------------------------------------------------------------------------------------------------
# the command line


@pytest.mark.parametrize("yaml_text, message", [
    ("smoke: \"false\"\n", "config field 'smoke': must be true or false, got 'false' (str)"),
    ("seed: 1.5\n", "config field 'seed': must be an integer, got 1.5 (float)"),
    ("clients: true\n", "config field 'clients': must be an integer, got True (bool)"),
    ("severity: 5.0\n", "config field 'severity': must be an integer, got 5.0 (float); write 5"),
])
def test_cli_refuses_wrongly_typed_yaml_field_naming_field_and_file(tmp_path, capsys, yaml_text, message):
    rc, err = run_cli(tmp_path, capsys, yaml_text)
    assert rc == 2
    assert one_line(err) == f"error: {message} (in config file '{tmp_path / 'config.yaml'}')\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("yaml_text, got", [("", "nothing"), ("   \n# only a comment\n", "nothing"),
                                            ("null\n", "nothing"), ("- seed: 1\n- smoke: true\n", "a list"),
                                            ("just words\n", "a str")])
def test_cli_refuses_a_config_file_that_is_not_a_mapping_naming_it(tmp_path, capsys, yaml_text, got):
    rc, err = run_cli(tmp_path, capsys, yaml_text)
    assert rc == 2
    assert one_line(err).startswith(f"error: config file '{tmp_path / 'config.yaml'}' must hold a mapping of "
                                    f"config fields ('field: value' lines), got {got}")


def test_cli_names_a_missing_or_malformed_config_file(tmp_path, capsys):
    rc, err = run_cli(tmp_path, capsys, None)
    assert rc == 2 and one_line(err) == f"error: config file '{tmp_path / 'config.yaml'}' does not exist\n"
    rc, err = run_cli(tmp_path, capsys, "seed: 1\nlocal_params: {lr: 0.1\n")
    assert rc == 2
    assert one_line(err).startswith(f"error: config file '{tmp_path / 'config.yaml'}' is not valid YAML: ")
    assert "line 3" in err
    with pytest.raises(ValueError, match="is not valid YAML"):
        read_config(tmp_path / "config.yaml")


def test_cli_refuses_a_model_that_does_not_fit_the_dataset(tmp_path, capsys):
    rc = main(["run", "--dataset", "embedded_digits", "--model", "resnet8_cifar10", "--out", str(tmp_path / "o")])
    err = one_line(capsys.readouterr().err)
    assert rc == 2 and "'resnet8_cifar10'" in err and "'embedded_digits'" in err and "in config file" not in err


def test_key_values_parse_yaml_scalars_and_floats_without_a_dot():
    values = _key_values(["lr=1e-4", "b=1E-5", "c=-2e3", "d=1.0e-3", "m=0.1", "on=true", "n=3", "s=abc",
                          "l=[1, 2]", "e=1e"], "--local-param")
    assert values == {"lr": 1e-4, "b": 1e-5, "c": -2000.0, "d": 1e-3, "m": 0.1, "on": True, "n": 3, "s": "abc",
                      "l": [1, 2], "e": "1e"}
    assert [type(values[k]) for k in ("lr", "b", "c", "m", "on", "n")] == [float, float, float, float, bool, int]
    with pytest.raises(SystemExit, match=r"--local-param 'lr=\[1': the value is not valid YAML"):
        _key_values(["lr=[1"], "--local-param")


def test_cli_local_param_1e_minus_4_reaches_the_method_as_a_float(tmp_path, captured):
    cfg = captured(tmp_path, "--local", "tent", "--local-param", "lr=1e-4", "--local-param", "steps=2",
                   "--strategy", "fedtsa", "--strategy-param", "window=3")
    assert cfg.local_params == {"lr": 1e-4, "steps": 2} and type(cfg.local_params["lr"]) is float
    assert cfg.strategy_params == {"window": 3}


def test_cli_yaml_config_reads_floats_without_a_dot_and_merges_flags(tmp_path, captured):
    config = tmp_path / "c.yaml"
    config.write_text("local: tent\nlocal_params: {lr: 1E-5, optimizer: adam}\nseed: 2\nsmoke: false\n")
    cfg = captured(tmp_path, "--config", str(config), "--local-param", "steps=2")
    assert cfg.local_params == {"lr": 1e-5, "optimizer": "adam", "steps": 2}
    assert (cfg.seed, cfg.smoke) == (2, False)


def test_cli_refuses_adding_params_to_a_non_mapping(tmp_path, capsys):
    rc, err = run_cli(tmp_path, capsys, "local: tent\nlocal_params: [lr]\n", "--local-param", "lr=0.1")
    assert rc == 2 and "'local_params': must be a mapping" in one_line(err) and "in config file" in err


@pytest.mark.parametrize("error, shown", [
    (FileNotFoundError("source checkpoint data/checkpoints/x.pt is missing"), "source checkpoint data/checkpoints"),
    (DataIntegrityError("cifar10: data decoded from 'a.npz' do not match\nMANIFEST.json"), "'a.npz' do not match "
                                                                                             "MANIFEST.json"),
    (KeyError("accuracy"), "missing key 'accuracy'"),
])
def test_data_errors_end_as_one_line_and_keep_a_traceback_with_ftta_debug(tmp_path, capsys, monkeypatch,
                                                                          error, shown):
    def fail(cfg, **kwargs):
        raise error

    monkeypatch.setattr(experiment, "run_experiment", fail)
    monkeypatch.delenv("FTTA_DEBUG", raising=False)
    assert main(["run", "--out", str(tmp_path / "o")]) == 2
    err = one_line(capsys.readouterr().err)
    assert err.startswith("error: ") and shown in err and "FTTA_DEBUG=1" in err
    monkeypatch.setenv("FTTA_DEBUG", "1")
    with pytest.raises(type(error)):
        main(["run", "--out", str(tmp_path / "o")])


def test_real_bugs_are_not_swallowed(tmp_path, monkeypatch):
    def fail(cfg, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(experiment, "run_experiment", fail)
    with pytest.raises(ZeroDivisionError):
        main(["run", "--out", str(tmp_path / "o")])


def test_other_commands_that_build_configs_report_one_line(tmp_path, capsys):
    assert main(["study", "fedtsa", "case-study", "--dataset", "nope", "--out", str(tmp_path)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "config field 'dataset': unknown dataset 'nope'" in err
    assert main(["study", "fedtsa", "table", "--tta", "bn", "--strategies", "fedavg", "--dataset", "nope", "--results",
                 str(tmp_path / "r"), "--table", str(tmp_path / "t")]) == 2
    assert "unknown dataset 'nope'" in one_line(capsys.readouterr().err)


@pytest.mark.slow  # starts real processes: make test, not make test-fast
def test_python_m_ftta_core_reports_a_bad_config_without_a_traceback(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("smoke: \"false\"\n")
    out = subprocess.run([sys.executable, "-m", "ftta_core", "run", "--config", str(config), "--out",
                          str(tmp_path / "o")], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode != 0
    assert out.stderr == (f"error: config field 'smoke': must be true or false, got 'false' (str) (in config file "
                          f"'{config}')\n")


# ------------------------------------------------------------------------------------------------------------------
# stored configs


@pytest.fixture
def example_plugin():
    """The methods of ``examples/my_plugin.py`` registered for one test (notebook 60's stored runs name them), the
    registries restored afterwards."""
    from ftta_core import plugins
    from ftta_core.strategies import STRATEGIES
    from ftta_core.tta import LOCAL_METHODS

    saved = [(d, dict(d)) for d in (LOCAL_METHODS, STRATEGIES, plugins._LOADED)]
    plugins.load_plugins([str(REPO / "examples" / "my_plugin.py")])
    yield
    for d, copy in saved:
        d.clear()
        d.update(copy)


def test_every_stored_config_under_figures_still_loads_unchanged(example_plugin):
    """The workbook reads stored summaries back with ``summary_config``: each one must pass the strict checks and
    round-trip to the values stored."""
    loaded = 0
    for path in sorted((REPO / "figures").rglob("*.json")):
        summary = json.loads(path.read_text())
        if not (isinstance(summary, dict) and "config" in summary):
            continue
        stored = summary["config"]
        assert isinstance(stored, dict), path
        cfg = summary_config(summary)
        again = cfg.to_dict()
        assert {k: again[k] for k in stored} == stored, path
        assert all(type(again[k]) is type(v) for k, v in stored.items()), path
        loaded += 1
    if not (REPO / "figures").is_dir():
        pytest.skip("no figures/ folder in this checkout")
    assert loaded > 0


@pytest.mark.parametrize("field, value, message", [
    ("label_alpha", float("inf"), "config field 'label_alpha': must be finite or null, got inf"),
    ("sh", float("nan"), "config field 'sh': must be finite, got nan"),
    ("images_per_client", 1, "config field 'images_per_client': must be at least batch_size (10)"),
    ("batch_size", 1000, "config field 'images_per_client': must be at least batch_size (1000)"),
])
def test_numeric_fields_are_finite_and_in_range_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=re_escape(message)):
        ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", **{field: value})


@pytest.mark.parametrize("params, message", [
    ({"lr": float("inf")}, "local_params['lr'] for 'tent': must be finite, got inf"),
    ({"lr": "abc"}, "local_params['lr'] for 'tent': must be a number (its default is 0.0001), got 'abc'"),
])
def test_method_parameters_are_finite_numbers_naming_the_parameter(params, message):
    with pytest.raises(ValueError, match=re_escape(message)):
        ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", local="tent", local_params=params)


@pytest.mark.parametrize("field, value, message", [
    ("clients", 0, "config field 'clients': must be a positive integer, got 0"),
    ("batch_size", -1, "config field 'batch_size': must be a positive integer, got -1"),
    ("images_per_client", 0, "config field 'images_per_client': must be a positive integer, got 0"),
    ("severity", 6, "config field 'severity': must be one of (1, 2, 3, 4, 5), got 6"),
    ("severity", 0, "config field 'severity': must be one of (1, 2, 3, 4, 5), got 0"),
    ("participation", 0.0, "config field 'participation': must be in (0, 1]"),
    ("participation", 1.5, "config field 'participation': must be in (0, 1]"),
    ("sh", 0.0, "config field 'sh': must be in (0, 1], got 0.0"),
    ("th", 2.0, "config field 'th': must be in (0, 1], got 2.0"),
    ("n_steps", 0, "config field 'n_steps': must be a positive integer or None, got 0"),
    ("slot_steps", -3, "config field 'slot_steps': must be a positive integer or None, got -3"),
    ("max_steps", 0, "config field 'max_steps': must be a positive integer or None, got 0"),
    ("label_alpha", 0.0, "config field 'label_alpha': must be positive or None (IID), got 0.0"),
    ("seed", -1, "config field 'seed': must be an integer >= 0, got -1"),
])
def test_every_numeric_field_is_range_checked_naming_the_field_and_the_value(field, value, message):
    with pytest.raises(ValueError, match=re_escape(message)):
        ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", **{field: value})


@pytest.mark.parametrize("local, strategy, params, message", [
    ("tent", "fedavg", {"lr": 0}, "local_params for 'tent': optimizer.lr must be positive, got 0"),
    ("tent", "fedavg", {"lr": -1e-3}, "local_params for 'tent': optimizer.lr must be positive, got -0.001"),
    ("tent", "fedavg", {"momentum": 1.5}, "local_params['momentum'] for 'tent': must be in [0, 1], got 1.5"),
    ("tent", "fedavg", {"weight_decay": -1.0}, "local_params['weight_decay'] for 'tent': must be >= 0, got -1.0"),
    ("eata", "fedavg", {"fisher_samples": 0}, "local_params for 'eata': fisher_samples and fisher_batch must be >= 1"),
    ("pl", "fedavg", {"bn_momentum": 1.5}, "local_params['bn_momentum'] for 'pl': must be in [0, 1], got 1.5"),
    ("bn", "fedtsa", {"lr": -1.0}, "strategy_params for 'fedtsa': lr must be positive, got -1.0"),
    ("bn", "fedtsa", {"window": 2.5}, "strategy_params['window'] for 'fedtsa': must be an integer >= 1, got 2.5"),
    ("bn", "fedamp", {"temperature": -2.0}, "strategy_params for 'fedamp': temperature must be positive, got -2.0"),
    ("rotta", "fedavg", {"seed": -1}, "local_params['seed'] for 'rotta': must be an integer >= 0, got -1"),
    ("bn", "fedctta", {"seed": 1.5}, "strategy_params['seed'] for 'fedctta': must be an integer >= 0, got 1.5"),
    ("bn", "moon", {"tau": 0.0}, "strategy_params for 'moon': tau must be positive, got 0.0"),
])
def test_method_parameters_are_range_checked_naming_the_parameter_and_the_value(local, strategy, params, message):
    """By the method itself, or, for parameters with one meaning in every method (``experiment.PARAM_RANGES``),
    by the config before the method is built."""
    key = "local_params" if message.startswith("local") else "strategy_params"
    with pytest.raises(ValueError, match=re_escape(message)):
        ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity", local=local, strategy=strategy,
                         **{key: params})


def test_a_method_parameter_out_of_range_is_one_line_on_the_command_line(tmp_path, capsys):
    assert main(["run", "--local", "tent", "--local-param", "momentum=2", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "local_params['momentum'] for 'tent': must be in [0, 1], got 2" in err[0], err


def test_a_yaml_key_given_twice_is_refused_naming_it(tmp_path, capsys):
    path = tmp_path / "dup.yaml"
    path.write_text("dataset: embedded_digits\nscenario: heterogeneity\nclients: 2\nclients: 3\n")
    assert main(["run", "--config", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "key 'clients' is given twice (first at line 3)" in err[0]


def re_escape(text: str) -> str:
    import re

    return re.escape(text)
