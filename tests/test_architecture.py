"""The layers of ``ftta_core`` (docs/layout.md): no import cycles, and no layer importing one above it, as declared
in ``pyproject.toml``'s ``[tool.importlinter]`` and checked by import-linter on the source as it is."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (the `test` extra)")


def lint(package_parent: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the repository's contracts on the ``ftta_core`` found in ``package_parent``."""
    env = dict(os.environ, PYTHONPATH=str(package_parent))
    return subprocess.run([str(LINT), "--config", str(REPO / "pyproject.toml"), "--no-cache"], cwd=package_parent,
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_package_keeps_its_layers_and_has_no_import_cycles():
    result = lint(REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "4 kept, 0 broken" in result.stdout


@pytest.mark.parametrize("module, line, broken", [
    # the cycle this layout removed: the engine importing the loop that drives the methods built on the engine
    ("engine/bank.py", "from ..loop import Engine", "layers"),
    # a method reaching up into the runners
    ("tta/basic.py", "from ..experiment import ExperimentConfig", "layers"),
    # two modules of one layer importing each other
    ("plan.py", "from .runstore import read_summary", "no import cycles"),
])
def test_the_contracts_catch_an_import_against_the_layers(tmp_path, module, line, broken):
    shutil.copytree(REPO / "ftta_core", tmp_path / "ftta_core", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "ftta_core" / module
    target.write_text(target.read_text() + f"\n\ndef _added():\n    {line}\n")
    if module == "plan.py":  # make it a cycle: runstore importing plan as well
        runstore = tmp_path / "ftta_core" / "runstore.py"
        runstore.write_text(runstore.read_text() + "\n\ndef _added():\n    from .plan import read_plan\n")
    result = lint(tmp_path)
    assert result.returncode != 0
    assert f"{broken}" in result.stdout and "BROKEN" in result.stdout, result.stdout[-3000:]
