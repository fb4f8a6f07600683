"""Semantic units (``ftta_core.units``): every implementation certified by its oracles, a version bump turning exactly
the stored runs that used the unit stale, an uncertified change caught, and records that name only what a run used."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ftta_core import units
from ftta_core.runstore import definition_hashes, run_status, scan, stale_modules

REPO = Path(__file__).resolve().parents[1]
FIGURES = REPO / "figures"


def _summary_of(entry) -> dict:
    path = entry.path / "summary.json" if entry.path.is_dir() else entry.path
    return json.loads(path.read_text())


def test_every_unit_implementation_is_certified():
    """A unit whose code changed without its oracles passing (``units certify``) or its version being bumped fails
    here: run ``python -m ftta_core units certify --changed`` (it runs the oracles) or ``units bump NAME``."""
    missing = units.uncertified()
    assert missing == [], (f"not certified: {', '.join(missing)}; run `python -m ftta_core units certify --changed` "
                           "(runs their oracle tests) or, for a change of meaning, `units bump NAME`")


def test_the_lock_holds_exactly_the_units_records_can_name_and_each_has_oracles():
    lock = units.read_lock()
    assert sorted(lock["units"]) == units.every_unit()
    for unit in units.every_unit():
        oracles = units.oracles_of(unit)
        assert oracles and all((REPO / t.split("::")[0]).is_file() for t in oracles), (unit, oracles)


def test_every_record_the_package_writes_names_only_locked_units():
    from ftta_core import leakage
    from ftta_core.build import code_record
    from ftta_core.experiment import ExperimentConfig
    from ftta_core.fedicon import study
    from ftta_core.fedtsa import ft_forward
    from ftta_core.strategies import STRATEGIES
    from ftta_core.tta import LOCAL_METHODS

    locked = set(units.read_lock()["units"])
    for local in LOCAL_METHODS:
        for strategy in STRATEGIES:
            assert set(code_record(local, strategy)["units"]) <= locked, (local, strategy)
    cfg = ExperimentConfig(dataset="cifar10", scenario="fedtsa_niid", clients=4, local="tent", strategy="fedavg_ft")
    for record in (study.record_scope(), leakage.record_scope(cfg), ft_forward.record_scope(cfg)):
        assert set(record["units"]) <= locked


def test_a_run_records_its_loader_model_and_checkpoint_not_every_one():
    from ftta_core.build import code_record
    from ftta_core.experiment import ExperimentConfig

    cifar = code_record("bn", "fedavg", ExperimentConfig(dataset="cifar10", scenario="fedtsa_niid", clients=4))
    assert {"data.cifar", "models.resnet", "run_builder", "run_summary", "client_conv"} <= set(cifar["units"])
    assert not {"data.office", "data.digits", "models.cnn", "experiment", "workbook"} & set(cifar["units"])
    assert cifar["inputs"] == units.checkpoint_input("resnet8_cifar10") and cifar["inputs"]
    digits = code_record("bn", "fedavg", ExperimentConfig(dataset="embedded_digits", scenario="heterogeneity",
                                                          clients=4))
    assert "data.digits" in digits["units"] and "data.cifar" not in digits["units"]


def test_every_committed_run_that_was_current_is_current():
    """The 762 runs current under the former definition records were migrated to unit records (2026-12-02) and
    stay current; no committed run is stale or uncertified."""
    statuses = [e.status for e in scan(FIGURES)]
    assert "stale" not in statuses and "uncertified" not in statuses
    assert statuses.count("current") >= 762


@pytest.fixture
def lock_copy(tmp_path, monkeypatch):
    """The committed lock, copied: tests bump and certify in the copy."""
    path = tmp_path / "units.lock.json"
    shutil.copy(units.LOCK_PATH, path)
    monkeypatch.setenv(units.LOCK_ENV, str(path))
    return path


def test_a_version_bump_turns_exactly_the_runs_that_used_the_unit_stale(lock_copy):
    before = {e.path: (e.status, _summary_of(e).get("code")) for e in scan(FIGURES)}
    used = {p for p, (status, code) in before.items() if units.is_unit_record(code) and "ts_block" in code["units"]}
    assert used and len(used) < sum(s == "current" for s, _ in before.values())
    assert units.bump("ts_block", lock_copy) == 2
    after = {e.path: e.status for e in scan(FIGURES)}
    assert {p for p, s in after.items() if s == "stale"} == used
    assert all(after[p] == status for p, (status, _) in before.items() if p not in used)
    code = before[next(iter(used))][1]
    assert "ts_block@1->2" in stale_modules(code)


def test_an_uncertified_change_is_caught_and_only_a_passing_oracle_certifies_it(lock_copy, monkeypatch):
    from ftta_core.build import code_record

    record = code_record("bn", "fedtsa")
    summary = {"accuracy": 1.0, "code": record}
    assert run_status(summary) == "current"
    real = units.semantic_definitions

    def edited(module):  # as if TSBlock.forward had been rewritten
        defs = dict(real(module))
        if units._short(module) == "strategies.ts_block":
            defs["TSBlock"] = "a new implementation"
        return defs

    monkeypatch.setattr(units, "semantic_definitions", edited)
    assert units.uncertified() == ["ts_block"] and run_status(summary) == "uncertified"
    assert stale_modules(record) == []  # not stale: its meaning is unchanged until a version bump says otherwise
    failing = lambda names: subprocess.CompletedProcess([], 1, "FAILED tests/test_oracle_runs.py::x", "")  # noqa: E731
    with pytest.raises(units.UnitError, match="ts_block: their oracle tests fail"):
        units.certify(["ts_block"], oracle=failing, path=lock_copy)
    assert units.uncertified() == ["ts_block"]  # the lock is unchanged
    certified_before = len(units.read_lock(lock_copy)["units"]["ts_block"]["certified"])
    passing = lambda names: subprocess.CompletedProcess([], 0, "1 passed", "")  # noqa: E731
    assert units.certify(["ts_block"], oracle=passing, path=lock_copy) == {"ts_block": units.implementation_hash(
        "ts_block")}
    assert units.uncertified() == [] and run_status(summary) == "current"
    assert len(units.read_lock(lock_copy)["units"]["ts_block"]["certified"]) == certified_before + 1


def test_imports_type_checking_blocks_and_docs_are_not_part_of_an_implementation():
    v1 = 'from typing import TYPE_CHECKING\nimport math\n\nif TYPE_CHECKING:\n    from x import Y\n\n\n' \
         'def f(x):\n    """Doc."""\n    return math.sqrt(x)\n'
    v2 = v1.replace("import math", "import math, os").replace("from x import Y", "from z import W") \
        .replace('"""Doc."""', '"""Other words."""  # a comment')
    assert definition_hashes(units.semantic_source(v1)) == definition_hashes(units.semantic_source(v2))
    v3 = v1.replace("math.sqrt(x)", "math.sqrt(x) + 1")
    assert definition_hashes(units.semantic_source(v1)) != definition_hashes(units.semantic_source(v3))


def test_type_checking_imports_are_not_followed():
    from ftta_core.runstore import dependencies

    assert "ftta_core.experiment" not in dependencies(["ftta_core.build"])  # imported for annotations only


def test_a_module_that_cannot_be_read_or_a_missing_member_fails_loudly(tmp_path, monkeypatch):
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    monkeypatch.setattr(units, "module_path", lambda module: broken if "broken" in module else None)
    with pytest.raises(units.UnitError, match="cannot be read"):
        units.semantic_definitions("broken")
    with pytest.raises(units.UnitError, match="does not exist"):
        units.semantic_definitions("gone")
    monkeypatch.undo()
    monkeypatch.setitem(units.UNITS, "ts_block", units.Unit("ts_block", ("strategies.ts_block:removed_name",)))
    units._member_index.cache_clear()
    try:
        with pytest.raises(units.UnitError, match="no longer exist"):
            units.implementation_hash("ts_block")
    finally:
        monkeypatch.undo()
        units._member_index.cache_clear()


def test_a_renamed_unit_keeps_its_runs_current_through_an_alias(lock_copy):
    lock = json.loads(lock_copy.read_text())
    lock["aliases"] = {"ts_attention": "ts_block"}
    units.write_lock(lock, lock_copy)
    record = {"units": {"ts_attention": 1}, "implementation": {}}
    assert stale_modules(record) == [] and units.version_of("ts_attention") == 1


def test_a_run_made_from_uncertified_code_is_not_vouched_for_until_that_code_is_certified(lock_copy):
    from ftta_core.build import code_record

    record = code_record("bn", "fedavg")
    made_uncertified = {**record, "implementation": {**record["implementation"], "strategies.basic": "0" * 16}}
    assert run_status({"code": record}) == "current"
    assert run_status({"code": made_uncertified}) == "uncertified"
    lock = json.loads(lock_copy.read_text())
    lock["units"]["strategies.basic"]["certified"].append("0" * 16)  # that implementation certified later
    units.write_lock(lock, lock_copy)
    assert run_status({"code": made_uncertified}) == "current"


def test_a_new_unit_the_lock_does_not_know_yet_reads_uncertified_not_gone(lock_copy):
    """A module added to the code (a new unit) is recorded at version 1, what certifying it gives: until it is
    certified its records are uncertified, never stale with '->gone' (which would refuse its own oracle runs)."""
    from ftta_core.build import code_record

    record = code_record("bn", "fedavg")
    lock = json.loads(lock_copy.read_text())
    del lock["units"]["strategies.basic"]  # as if strategies.basic were new
    units.write_lock(lock, lock_copy)
    assert units.recorded_version("strategies.basic") == 1
    assert stale_modules(record) == []
    assert run_status({"code": record}) == "uncertified"
    assert units.recorded_version("no_such_module") is None
    assert stale_modules({"units": {"no_such_module": 1}, "implementation": {}}) == ["no_such_module@1->gone"]


def test_a_recorded_module_declared_non_semantic_since_vouches_nothing():
    """Runs stored while ``project`` (the project's folders) was still read as a unit recorded it; it computes no
    number, so a record naming it is not uncertified for that."""
    from ftta_core.units import NON_SEMANTIC_MODULES, uncertified_in

    assert "project" in NON_SEMANTIC_MODULES
    assert uncertified_in({"units": {"project": 1}, "implementation": {"project": "b6c1e57b3f3fdedc"}}) == []


def test_definition_hashes_are_kept_on_disk_by_source_and_hashing_code(tmp_path, monkeypatch):
    """``source_definitions`` equals hashing the source afresh; its entry is named by the source and the hashing
    code (a changed module or a changed hasher reads another entry), and an unreadable entry is recomputed."""
    from ftta_core.codegraph import module_path

    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path))
    text = module_path("loop").read_text()
    direct = definition_hashes(units.semantic_source(text))
    assert units.source_definitions(text) == direct
    [entry] = (tmp_path / units.DEFINITIONS_CACHE).glob("*.json")
    assert json.loads(entry.read_text()) == direct
    entry.write_text("{half an entr")
    assert units.source_definitions(text) == direct  # recomputed (and rewritten)
    assert json.loads(entry.read_text()) == direct
    changed = text + "\n\ndef added_for_the_test():\n    return 1\n"
    assert "added_for_the_test" in units.source_definitions(changed)
    monkeypatch.setattr(units, "_hasher_digest", lambda: "another hasher")
    units.source_definitions(text)
    assert len(list((tmp_path / units.DEFINITIONS_CACHE).glob("*.json"))) == 3


def test_a_record_refuses_code_that_changed_on_disk_after_this_process_imported_it(monkeypatch):
    """A module this process imported whose file is newer than the package's import (an edit while a kernel or a
    plan worker lives on) would be recorded by its file, not by the code that runs: ``record_for`` refuses, naming
    the file; a module not imported yet (it will be imported from that file) is not counted."""
    import sys

    import ftta_core
    from ftta_core.build import code_record
    import ftta_core.tta.basic  # noqa: F401  (imported: Tent's module)

    assert units.changed_on_disk(["tta.basic"]) == []
    code_record("tent", "fedavg")  # nothing changed since the import: recorded
    monkeypatch.setattr(ftta_core.project, "IMPORTED_AT_NS", 0)  # as if every file was written after the import
    assert units.changed_on_disk(["tta.basic", "ftta_core.tta.basic"]) == ["ftta_core/tta/basic.py"]
    with pytest.raises(units.CodeChangedError, match=r"ftta_core/tta/basic\.py.*changed on disk after this process "
                       r"imported ftta_core.*start a new process"):
        code_record("tent", "fedavg")
    monkeypatch.delitem(sys.modules, "ftta_core.tta.rdumb", raising=False)
    assert units.changed_on_disk(["tta.rdumb"]) == []  # not imported: it will be read from the file
