"""The notebooks' jupytext sources (``notebooks/NN_name.py``, py:percent) are what the committed ``.ipynb`` ran, and
``python -m ftta_core notebooks`` executes the source, not the ``.ipynb``'s cells."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

import ftta_core.notebooks as nbrun

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
COMMITTED = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def _cells(nb) -> list:
    """(type, source, tags) of each cell, papermill's injected-parameters cell left out."""
    return [(c.cell_type, c.source, list(c.metadata.get("tags", []))) for c in nb.cells
            if "injected-parameters" not in c.metadata.get("tags", [])]


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_committed_notebook_ran_its_source(path):
    assert nbrun.source_path(path).exists(), f"{path.name} has no jupytext source {path.stem}.py"
    executed, source = _cells(nbformat.read(str(path), as_version=4)), _cells(nbrun.read_source(path))
    assert executed == source, (f"{path.name} differs from {path.stem}.py: re-execute it "
                                f"(python -m ftta_core notebooks {path.stem} --in-place)")
    assert nbformat.read(str(path), as_version=4).metadata["jupytext"]["formats"] == "ipynb,py:percent"


def test_the_runner_executes_the_source(tmp_path, monkeypatch, use_project):
    """An edited ``.py`` is what runs, even before the ``.ipynb`` was re-made from it."""
    import papermill

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell("smoke = False", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("x = 'old'")]
    (tmp_path / "notebooks").mkdir()
    path = tmp_path / "notebooks" / "99_demo.ipynb"
    nbformat.write(nb, str(path))
    path.with_suffix(".py").write_text('# %% tags=["parameters"]\nsmoke = False\n\n# %%\nx = "new"\n')
    use_project(tmp_path)  # the project whose notebooks/ holds the demo
    seen = []

    def execute(input_path, output_path, **kwargs):
        seen.append([c.source for c in nbformat.read(input_path, as_version=4).cells])
        nbformat.write(nbformat.read(input_path, as_version=4), output_path)

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    nbrun.execute_notebooks(["99_demo"], out_dir=tmp_path / "out")
    assert seen == [["smoke = False", 'x = "new"']]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["99_demo.ipynb"]  # the staged input is removed


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_papermill_sees_every_parameter(path, tmp_path):
    """``papermill --help-notebook`` and ``-p`` list what the parameters cell assigns: papermill drops a line whose
    comment it cannot parse (an ``=`` or ``:`` in it), silently leaving that parameter out of the help."""
    import ast
    import logging

    import papermill

    nb = nbrun.read_source(path)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assigned = [t.id for node in ast.parse(cell.source).body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)]
    staged = tmp_path / path.name
    try:
        nbformat.write(nb, str(staged))
        logging.getLogger("papermill").disabled = True
        seen = set(papermill.inspect_notebook(str(staged)))
    finally:
        logging.getLogger("papermill").disabled = False
    assert [a for a in assigned if a not in seen] == [], f"{path.stem}.py: papermill cannot parse these parameters"


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.py")), ids=lambda p: p.stem)
def test_a_notebook_that_saves_figures_shows_them_inline(path):
    """A reader in JupyterLab sees every figure a notebook makes: a notebook whose source saves a figure has image
    outputs in its committed execution (executed with an inline backend, not Agg)."""
    if "savefig(" not in path.read_text():
        pytest.skip("makes no figure")
    nb = nbformat.read(path.with_suffix(".ipynb"), as_version=4)
    images = sum("image/png" in out.get("data", {}) for cell in nb.cells for out in cell.get("outputs", []))
    assert images > 0, f"{path.with_suffix('.ipynb').name} saves figures but shows none inline"


def test_kernels_never_inherit_a_non_inline_matplotlib_backend(monkeypatch):
    import os

    monkeypatch.setenv("MPLBACKEND", "Agg")
    with nbrun.kernel_environment():
        assert "MPLBACKEND" not in os.environ
    assert os.environ["MPLBACKEND"] == "Agg"
