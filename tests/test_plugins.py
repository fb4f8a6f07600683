"""Methods of your own: registration, plugins (file, module, $FTTA_PLUGINS, entry points, --plugin on the command
line and in run-plan's spawned workers) and the backend-agreement contract a user runs on their method."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ftta_core
from ftta_core import load_plugins, plugins, register_local, register_strategy
from ftta_core.contract import check_backends_agree
from ftta_core.experiment import ExperimentConfig
from ftta_core.strategies import STRATEGIES, FedAvg, Strategy, build_strategy
from ftta_core.tta import LOCAL_METHODS, BatchNormAdapt, Tent, build_local

REPO = Path(__file__).resolve().parents[1]

# the README's example, near enough: a strategy and a local method in a plugin file
PLUGIN = textwrap.dedent('''
    import torch
    from ftta_core import register_local, register_strategy
    from ftta_core.strategies import Strategy
    from ftta_core.tta import Tent, entropy


    @register_strategy("mystrat")
    class IndicatorSoftmax(Strategy):
        """W = row-softmax of the negative (mean-scaled) distances between the clients' indicators."""
        needs = ("indicator",)

        def __init__(self, temperature: float = 0.1):
            self.temperature = temperature

        def collaboration(self, inputs):
            d = torch.cdist(inputs.uploads["indicator"].double(), inputs.uploads["indicator"].double())
            return torch.softmax(-d / (self.temperature * d.mean().clamp_min(1e-12)), dim=1).float()


    @register_local("mine")
    class ConfidentTent(Tent):
        """Tent on the BN affine parameters, on the confident predictions only."""

        def __init__(self, threshold: float = 0.5, lr: float = 1e-3):
            super().__init__(params="bn_affine", optimizer="sgd", lr=lr)
            self.threshold = threshold

        def loss(self, out, params, x, clients):
            keep = (out.logits.softmax(-1).amax(-1) >= self.threshold).float()
            return (entropy(out.logits) * keep).sum(1) / keep.sum(1).clamp_min(1)
''')

SMOKE_FLAGS = ["--dataset", "embedded_digits", "--scenario", "heterogeneity", "--clients", "4", "--corruptions",
               "gaussian_noise,contrast", "--seed", "0", "--device", "cpu", "--images-per-client", "40",
               "--batch-size", "8", "--sh", "0.5", "--th", "0.5", "--smoke"]


@pytest.fixture(autouse=True)
def clean_registries(monkeypatch):
    """Every test leaves the registries, the loaded plugins and $FTTA_PLUGINS as it found them (other test modules
    enumerate the registries)."""
    local, strategies = dict(LOCAL_METHODS), dict(STRATEGIES)
    loaded, scanned = dict(plugins._LOADED), plugins._SCANNED_PATH
    monkeypatch.setenv(plugins.PLUGINS_ENV, "")
    yield
    LOCAL_METHODS.clear()
    LOCAL_METHODS.update(local)
    STRATEGIES.clear()
    STRATEGIES.update(strategies)
    plugins._LOADED.clear()
    plugins._LOADED.update(loaded)
    plugins._SCANNED_PATH = scanned
    for name in [m for m in sys.modules if m.startswith("ftta_plugin_") or m.startswith("ftta_test_plugin")]:
        del sys.modules[name]


@pytest.fixture
def plugin_file(tmp_path):
    path = tmp_path / "myplugin.py"
    path.write_text(PLUGIN)
    return path


def child_env(**extra):
    """The environment of a command-line subprocess: this one's, without plugins or a plan, one torch thread."""
    env = {k: v for k, v in os.environ.items() if k not in (plugins.PLUGINS_ENV, "FTTA_PLAN")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def test_register_decorators_write_into_the_registries_every_lookup_reads():
    @register_local("tiny_bn")
    class TinyBN(BatchNormAdapt):
        pass

    @register_strategy("tiny_avg")
    def tiny_avg(scale: float = 1.0):  # a factory function works too
        return FedAvg()

    assert LOCAL_METHODS["tiny_bn"] is TinyBN and TinyBN.name == "tiny_bn"
    assert isinstance(build_local("tiny_bn"), TinyBN)
    assert isinstance(build_strategy("tiny_avg", scale=2.0), FedAvg)
    cfg = ExperimentConfig(local="tiny_bn", strategy="tiny_avg", strategy_params={"scale": 2.0})
    assert (cfg.local, cfg.strategy) == ("tiny_bn", "tiny_avg")
    with pytest.raises(ValueError, match="strategy_params for 'tiny_avg'.*nope"):
        ExperimentConfig(local="tiny_bn", strategy="tiny_avg", strategy_params={"nope": 1})


def test_a_name_clash_is_one_clear_line_and_replace_overrides_it():
    with pytest.raises(ValueError) as err:
        @register_local("tent")
        class OtherTent(Tent):
            pass
    message = str(err.value)
    assert "'tent'" in message and "ftta_core.tta.basic" in message and "replace=True" in message
    assert "\n" not in message
    assert LOCAL_METHODS["tent"] is Tent

    @register_local("tent", replace=True)
    class MyTent(Tent):
        pass

    assert LOCAL_METHODS["tent"] is MyTent and MyTent.name == "tent"  # (the fixture puts Tent back)

    @register_strategy("twice")
    class First(FedAvg):
        pass

    with pytest.raises(ValueError, match=r"'twice' is already registered by .*First"):
        register_strategy("twice", FedAvg)

    def define():  # the same definition again (a re-run notebook cell, a plugin imported twice) just replaces it
        @register_strategy("again")
        class Again(FedAvg):
            pass
        return Again

    first, second = define(), define()
    assert STRATEGIES["again"] is second is not first


def test_registration_checks_what_it_registers():
    with pytest.raises(TypeError, match="not a subclass of ftta_core.tta.base.LocalMethod"):
        register_local("wrong_kind", FedAvg)
    with pytest.raises(TypeError, match="abstract: it does not implement collaboration"):
        register_strategy("abstract", type("Abstract", (Strategy,), {}))
    with pytest.raises(ValueError, match="non-empty string without spaces"):
        register_local("two words", Tent)


def test_plugin_file_module_and_env_load_once(plugin_file, tmp_path, monkeypatch):
    assert "mine" not in LOCAL_METHODS
    loaded = load_plugins([str(plugin_file)])
    assert str(plugin_file.resolve()) in loaded
    assert LOCAL_METHODS["mine"].__name__ == "ConfidentTent" and STRATEGIES["mystrat"].__name__ == "IndicatorSoftmax"
    module = sys.modules[LOCAL_METHODS["mine"].__module__]
    load_plugins([str(plugin_file)])  # idempotent: not imported again
    assert sys.modules[LOCAL_METHODS["mine"].__module__] is module

    (tmp_path / "ftta_test_plugin_mod.py").write_text(
        "from ftta_core import register_local\nfrom ftta_core.tta import BatchNormAdapt\n"
        "register_local('mod_bn', type('ModBN', (BatchNormAdapt,), {}))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(plugins.PLUGINS_ENV, "ftta_test_plugin_mod")
    assert ExperimentConfig(local="mod_bn").local == "mod_bn"  # a config loads $FTTA_PLUGINS before it rejects


def test_a_broken_plugin_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    broken = tmp_path / "broken_plugin.py"
    broken.write_text("import torch\nraise RuntimeError('boom\\nsecond line')\n")
    with pytest.raises(plugins.PluginError) as err:
        load_plugins([str(broken)])
    assert "broken_plugin.py" in str(err.value) and "RuntimeError: boom second line" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(plugins.PluginError, match="'no_such_plugin_module'.*not importable from here"):
        load_plugins(["no_such_plugin_module"])
    with pytest.raises(plugins.PluginError, match="no such file"):
        load_plugins([str(tmp_path / "missing.py")])

    from ftta_core.cli import main

    assert main(["run", "--plugin", str(broken), "--out", str(tmp_path / "x")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "broken_plugin.py" in lines[0] and "boom" in lines[0]
    assert os.environ[plugins.PLUGINS_ENV] == ""  # a plugin that failed is not handed to child processes


def test_every_command_that_builds_runs_takes_plugin_and_exports_it(plugin_file, monkeypatch):
    from ftta_core.cli import PLUGIN_COMMANDS, build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    assert {"run", "run-plan", "notebooks", "study"} <= set(PLUGIN_COMMANDS)
    for name in PLUGIN_COMMANDS:
        assert "--plugin" in commands[name]._option_string_actions, name
    monkeypatch.chdir(plugin_file.parent)
    monkeypatch.setenv(plugins.PLUGINS_ENV, "some_module")
    plugins.export_plugins(["myplugin.py", "some_module"])  # what --plugin does once its plugins loaded
    # child processes (notebook kernels run in notebooks/) get the file's absolute path, once
    assert os.environ[plugins.PLUGINS_ENV] == os.pathsep.join(["some_module", str(plugin_file.resolve())])


def test_unknown_names_point_at_plugins():
    with pytest.raises(ValueError, match="config field 'local'.*--plugin.*FTTA_PLUGINS"):
        ExperimentConfig(local="not_registered_anywhere")
    with pytest.raises(ValueError, match="strategy: unknown 'nope'.*--plugin"):
        build_strategy("nope")


def _write_distribution(root: Path) -> None:
    """An installed distribution (its dist-info on sys.path) with two 'ftta.plugins' entry points: a module, and
    a function to call."""
    (root / "ftta_test_plugin_ep.py").write_text(textwrap.dedent('''
        from ftta_core import register_local, register_strategy
        from ftta_core.strategies import FedAvg
        from ftta_core.tta import BatchNormAdapt

        register_local("ep_bn", type("EpBN", (BatchNormAdapt,), {}))

        def setup():
            register_strategy("ep_avg", type("EpAvg", (FedAvg,), {}))
    '''))
    info = root / "ftta_test_plugin_ep-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ftta-test-plugin-ep\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ftta.plugins]\nbn = ftta_test_plugin_ep\n"
                                           "avg = ftta_test_plugin_ep:setup\n")


def test_entry_points_load_modules_and_call_functions(tmp_path, monkeypatch):
    _write_distribution(tmp_path)
    assert "ep_bn" not in LOCAL_METHODS
    monkeypatch.syspath_prepend(str(tmp_path))
    load_plugins()
    assert LOCAL_METHODS["ep_bn"].__name__ == "EpBN" and STRATEGIES["ep_avg"].__name__ == "EpAvg"
    assert any(k.startswith("entry point avg = ftta_test_plugin_ep:setup") for k in plugins.loaded_plugins())


def test_a_broken_entry_point_names_it(monkeypatch):
    from importlib.metadata import EntryPoint

    monkeypatch.setattr(plugins, "_entry_points", lambda: [EntryPoint("bad", "no_such_module_xyz", "ftta.plugins")])
    monkeypatch.setattr(plugins, "_SCANNED_PATH", None)
    with pytest.raises(plugins.PluginError, match="entry point 'bad' = 'no_such_module_xyz' in group 'ftta.plugins'"):
        load_plugins()


def test_cli_run_with_a_plugin_file(plugin_file, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "ftta_core", "run", "--plugin", str(plugin_file), "--local", "mine",
                           "--local-param", "threshold=0.3", "--strategy", "mystrat", *SMOKE_FLAGS, "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, env=child_env(FTTA_CACHE_DIR=str(tmp_path / "c")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["config"]["local"], summary["config"]["strategy"]) == ("mine", "mystrat")
    assert "mine + mystrat" in proc.stdout


def test_run_plan_workers_load_the_plugin(plugin_file, tmp_path, monkeypatch):
    from ftta_core.plan import PLAN_ENV, add_to_plan
    from ftta_core.workbook import config_key

    load_plugins([str(plugin_file)])  # to validate the configs here, as the notebook that plans them would
    plan, results = tmp_path / "plan.jsonl", tmp_path / "results"
    monkeypatch.setenv(PLAN_ENV, str(plan))
    configs = [ExperimentConfig(dataset="embedded_digits", scenario="fedtsa_niid", clients=4, batch_size=5,
                                images_per_client=10, corruptions=["fog", "contrast", "frost", "glass_blur"],
                                local=local, strategy="mystrat", device="cpu", max_steps=2) for local in ("mine", "bn")]
    for cfg in configs:
        add_to_plan(cfg.to_dict(), results)
    proc = subprocess.run([sys.executable, "-m", "ftta_core", "run-plan", str(plan), "--workers", "2", "--threads", "1",
                           "--plugin", str(plugin_file)], capture_output=True, text=True, cwd=REPO,
                          env=child_env(FTTA_CACHE_DIR=str(tmp_path / "c")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ran 2 runs" in proc.stdout and "0 failed" in proc.stdout
    for cfg in configs:
        assert json.loads((results / f"{config_key(cfg)}.json").read_text())["config"]["strategy"] == "mystrat"


def test_the_contract_passes_for_the_plugin_methods(plugin_file, one_thread):
    load_plugins([str(plugin_file)])
    report = check_backends_agree(local="mine", strategy="mystrat", local_params={"threshold": 0.3, "lr": 1e-2})
    assert report["steps"] == 3 and report["max_weights_diff"] <= 1e-5 and report["max_state_diff"] <= 1e-4
    assert ftta_core.check_backends_agree is check_backends_agree


def test_the_contract_fails_for_a_backend_dependent_method(one_thread):
    from ftta_core.engine.bank import LoopBank

    class LoopShifted(BatchNormAdapt):
        """Shares BN statistics, but nudges them on the loop backend only: a backend-dependent bug."""

        def shared_state(self, bank):
            state = super().shared_state(bank)
            return {k: v + 1e-2 for k, v in state.items()} if isinstance(bank, LoopBank) else state

    with pytest.raises(AssertionError, match=r"LoopShifted' \+ strategy 'fedavg': loop and vectorized backends "
                                               r"disagree at step 0: shared state '.*' differs by up to 0.01"):
        check_backends_agree(local=LoopShifted, strategy="fedavg")
