"""Former code records, still read: definition records (what turned a stored run stale: an edited or removed
definition, a new builtin-shadowing name, a new module statement; what did not: a new function, registry entry or
imported name), the migration of whole-module records through the git history, and of current definition records to
semantic unit records (``ftta_core.units``; the unit records themselves: ``tests/test_units.py``)."""
import ast
import json
import subprocess
from pathlib import Path

import pytest

import ftta_core.runstore as runstore
from ftta_core.record_migration import GitSources, migrate, migrate_record
from ftta_core.runstore import LEGACY_KEY, MODULE_KEY, definition_hashes, source_hash, stale_modules

V1 = '''"""A module."""
from typing import Dict
import math

SPECS = {"a": dict(lr=0.1), "b": dict(lr=0.2)}


def f(x):
    """Doc."""
    return math.sqrt(x)


class C:
    def g(self):
        return f(4)
'''


def _record_against(monkeypatch, recorded_source: str, current_source: str):
    """What ``stale_modules`` says of a record of module ``m`` made at ``recorded_source`` when ``m`` is now
    ``current_source``."""
    monkeypatch.setattr(runstore, "module_definitions", lambda name: definition_hashes(current_source))
    monkeypatch.setattr(runstore, "module_hash", lambda name: source_hash(current_source))
    return stale_modules({"definitions": {"m": definition_hashes(recorded_source)}})


@pytest.mark.parametrize("edit", [
    lambda s: s.replace("from typing import Dict", "from typing import Dict, List"),  # one more imported name
    lambda s: s + "\n\ndef h():\n    return 1\n",  # a new function
    lambda s: s.replace('"b": dict(lr=0.2)}', '"b": dict(lr=0.2), "c": dict(lr=0.3)}'),  # a new registry entry
    lambda s: s.replace('"""Doc."""', '"""Other words."""  # and a comment'),  # docs and comments
])
def test_additions_and_docs_leave_a_run_current(monkeypatch, edit):
    assert _record_against(monkeypatch, V1, edit(V1)) == []


@pytest.mark.parametrize("edit, changed", [
    (lambda s: s.replace("math.sqrt(x)", "math.sqrt(x) + 1"), ["m:f"]),  # an edited function
    (lambda s: s.replace("return f(4)", "return f(9)"), ["m:C"]),  # an edited method: its class
    (lambda s: s.replace('"b": dict(lr=0.2)', '"b": dict(lr=0.5)'), ["m:SPECS['b']"]),  # an edited entry
    (lambda s: s.replace(', "b": dict(lr=0.2)', ""), ["m:SPECS['b']"]),  # a removed entry
    (lambda s: s.replace("import math", "import cmath as math"), ["m:math"]),  # a name bound to other code
    (lambda s: s + "\nmath.pi = 3\n", ["m:" + MODULE_KEY]),  # a first statement outside definitions
    (lambda s: s + "\n\ndef len(x):\n    return 0\n", ["m:len"]),  # a new name shadowing a builtin
])
def test_edits_removals_and_shadowing_make_a_run_stale(monkeypatch, edit, changed):
    assert _record_against(monkeypatch, V1, edit(V1)) == changed


def test_a_gone_module_and_a_whole_module_hash_are_still_checked(monkeypatch):
    monkeypatch.setattr(runstore, "module_definitions", lambda name: None)
    assert stale_modules({"definitions": {"m": {"f": "x"}}}) == ["m"]
    monkeypatch.setattr(runstore, "module_definitions", lambda name: definition_hashes(V1))
    monkeypatch.setattr(runstore, "module_hash", lambda name: source_hash(V1))
    assert stale_modules({"definitions": {"m": {LEGACY_KEY: source_hash(V1)}}}) == []
    assert stale_modules({"definitions": {"m": {LEGACY_KEY: "0" * 16}}}) == ["m"]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


def test_migration_finds_the_recorded_source_in_git_and_keeps_unknown_ones_whole(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "pkg" / "m.py").write_text(V1)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "v1")
    v2 = V1.replace("math.sqrt(x)", "math.sqrt(x) + 1")
    (repo / "pkg" / "m.py").write_text(v2)
    _git(repo, "commit", "-qam", "v2")
    (repo / "pkg" / "m.py").write_text(v2 + "\n\ndef h():\n    return 2\n")  # uncommitted
    legacy = {"modules": {"pkg.m": source_hash(V1), "pkg.m:f": source_hash('def f(x):\n    return math.sqrt(x)\n'),
                          "pkg.gone": "0" * 16, "ftta_core.runstore": "1" * 16},
              "git": "abc"}
    migrated, missing = migrate_record(legacy, GitSources(repo))
    assert migrated["definitions"]["pkg.m"] == definition_hashes(V1)  # the whole module (finer than one function)
    assert migrated["definitions"]["pkg.gone"] == {LEGACY_KEY: "0" * 16} and missing == ["pkg.gone"]
    assert "ftta_core.runstore" not in migrated["definitions"] and migrated["git"] == "abc"
    assert migrate_record(migrated, GitSources(repo)) == (migrated, [])  # a definition record stays as it is
    # a stored file: rewritten in place, its layout kept, other files untouched
    stored = tmp_path / "runs"
    stored.mkdir()
    (stored / "a.json").write_text(json.dumps({"accuracy": 1.0, "code": legacy}, indent=1))
    (stored / "b.json").write_text(json.dumps({"accuracy": 2.0}, indent=1))
    report = migrate([stored], GitSources(repo))
    assert report == {"files": 2, "migrated": 1, "kept_whole": {"pkg.gone": 1}}
    rewritten = json.loads((stored / "a.json").read_text())
    assert rewritten["accuracy"] == 1.0 and rewritten["code"] == migrated
    assert (stored / "a.json").read_text().startswith('{\n "')
    assert migrate([stored], GitSources(repo))["migrated"] == 0


def test_a_summary_with_a_definition_record_is_written_one_line_per_module():
    from ftta_core.build import RUN_ROOTS
    from ftta_core.runstore import definition_record_of, dumps_summary

    record = definition_record_of([f"{runstore.PACKAGE}.{r}" for r in RUN_ROOTS])
    summary = {"accuracy": 70.0, "config": {"seed": 0}, "code": record}
    text = dumps_summary(summary)
    assert json.loads(text) == summary
    assert len(text.splitlines()) < 20 + len(summary["code"]["definitions"])
    assert dumps_summary({"accuracy": 1.0}) == json.dumps({"accuracy": 1.0}, indent=1)


def test_exports_are_not_recorded_and_the_package_has_no_star_import(monkeypatch):
    """``__all__`` matters only to ``from m import *``: listing a new function there leaves runs current, which is
    sound only while no module of the package star-imports."""
    with_all = V1 + '\n__all__ = ["f", "C"]\n'
    assert _record_against(monkeypatch, with_all, with_all.replace('"C"]', '"C", "h"]') + "\n\ndef h():\n    pass\n") == []
    star = [str(path) for path in runstore.PACKAGE_DIR.rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)]
    assert star == []


def test_checkpoint_writing_definitions_are_not_recorded_and_no_run_calls_them(monkeypatch, tmp_path):
    """The ``units.NON_SEMANTIC`` definitions of ``training`` (writing and describing source checkpoints) belong to
    no unit, which is sound only while no run calls them: an experiment runs with each of them disabled, and its
    record names the source-model unit and the checkpoint it loaded by digest."""
    import ftta_core.training as training
    from ftta_core import units
    from ftta_core.experiment import ExperimentConfig, run_experiment

    exempt = units.NON_SEMANTIC["training"]
    members = units.unit_members("source_models")
    assert not {m.split(":")[1] for m in members} & exempt and "training:load_source_model" in members

    def disabled(*args, **kwargs):
        raise AssertionError("a run called a definition that belongs to no unit")

    for name in exempt:
        if callable(getattr(training, name)):
            monkeypatch.setattr(training, name, disabled)
    cfg = ExperimentConfig(dataset="cifar10", scenario="fedtsa_niid", clients=4, batch_size=4, images_per_client=8,
                           corruptions=["gaussian_noise", "contrast", "fog", "snow"], local="tent", strategy="fedavg",
                           device="cpu", max_steps=2)
    results = run_experiment(cfg, out=tmp_path / "run")  # loads the shipped source model, adapts, mixes
    assert results.summary["n_predictions"] == 2 * 4 * 4
    code = results.summary["code"]
    assert "source_models" in code["units"] and "checkpoint:resnet8_cifar10" in code["inputs"]
    assert "data.office" not in code["units"] and "models.cnn" not in code["units"]  # only what the run used


def test_a_source_checkpoint_and_its_card_are_written_whole_and_the_card_names_its_images(tmp_path):
    import torch

    from ftta_core.training import SOURCE_MODELS, load_source_model, render_cards, save_checkpoint
    from ftta_core.models import build_model

    spec = SOURCE_MODELS["resnet8_cifar10_e1_n4000"]
    model = build_model(spec.arch, num_classes=10)
    card = {"name": spec.name, "spec": {"arch": spec.arch, "dataset": spec.dataset, "batch_size": 128, "lr": 0.1,
                                        "weight_decay": 5e-4, "crop_padding": 4, "flip": True},
            "seed": 0, "epochs": 1, "train_images": 4000, "train_wall_s": 1.0, "device": "cpu", "torch": "x",
            "command": "python -m ftta_core train-source --model resnet8_cifar10 --train-images 4000",
            "clean_test_accuracy": 37.2}
    save_checkpoint(model, spec, card, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{spec.name}.json", f"{spec.name}.pt"]  # no temporaries
    loaded = load_source_model(spec.name, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
    assert "trained on `cifar10` (first 4,000 images of the train split)" in render_cards(tmp_path)


def test_study_records_name_their_computing_code_and_current_definition_records_migrate_to_units(tmp_path):
    """A FedICON result and a stored leakage table record the units that compute them, not the reporting code that
    imports the workbook; ``runs --migrate`` rewrites a current definition record as the unit record a record made
    now would hold (narrowed to today's scope), and leaves a stale one as it is (and stale)."""
    from ftta_core import leakage, units
    from ftta_core.experiment import ExperimentConfig
    from ftta_core.fedicon import study
    from ftta_core.runstore import definition_record_of

    scope = study.record_scope()
    assert {"fedicon.training", "fedicon.adaptation"} <= scope["units"].keys()
    assert "workbook" not in scope["units"] and "fedicon.report" not in scope["units"]
    cfg = ExperimentConfig(dataset="cifar10", scenario="fedtsa_niid", clients=4, local="bn", strategy="fedctta")
    leak = leakage.record_scope(cfg)
    assert "workbook" not in leak["units"] and {"leakage", "strategies.fedctta"} <= leak["units"].keys()

    current = definition_record_of(list(study.CODE_ROOTS))
    stale = {**current, "definitions": {**current["definitions"],
                                        "ftta_core.fedicon.training": {"local_update": "an older version"}}}
    (tmp_path / "r.json").write_text(json.dumps({"setting": {"seed": 0}, "accuracy": {"MNIST": 90.0}, "wall_s": 1.0,
                                                  "code": current}, indent=1))
    (tmp_path / "s.json").write_text(json.dumps({"setting": {"seed": 1}, "accuracy": {"MNIST": 91.0}, "wall_s": 1.0,
                                                  "code": stale}, indent=1))
    assert migrate([tmp_path])["migrated"] == 1
    migrated = json.loads((tmp_path / "r.json").read_text())
    assert migrated["code"]["units"] == {u: units.version_of(u) for u in scope["units"]}
    assert migrated["code"]["migrated"]["from"] == "definition record" and stale_modules(migrated["code"]) == []
    assert json.loads((tmp_path / "s.json").read_text())["code"] == stale
    assert study.is_record(migrated)
