"""`python -m ftta_core notebooks`: where runs write, and the committed notebooks being full-mode executions.

Only one test executes a notebook (00_quickstart in smoke mode, the fastest); the others replace
``papermill.execute_notebook`` with a stand-in, so they check our logic, not papermill's.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Dict

import nbformat
import papermill
import pytest

import ftta_core.notebooks as nbrun
from ftta_core.cli import main

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
FIGURES = REPO / "figures"
COMMITTED = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
# content-addressed stores of finished runs, filled concurrently by `run-plan` / `study fedtsa table` jobs: not compared
RUN_STORES = {"runs", "runs_small", "cache"}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tracked_snapshot() -> Dict[str, str]:
    """sha256 of every committed notebook and every file under figures/ (stored-run folders left out)."""
    snap = {str(p.relative_to(REPO)): _sha(p) for p in NOTEBOOKS.glob("*.ipynb")}
    for p in FIGURES.rglob("*"):
        rel = p.relative_to(FIGURES)
        if p.is_file() and not RUN_STORES.intersection(rel.parts[:-1]):
            snap[str(p.relative_to(REPO))] = _sha(p)
    return snap


@pytest.fixture
def checkout(tmp_path, monkeypatch, use_project):
    """A checkout-shaped folder the runner is pointed at (the project, ``use_project``; no pyproject: the default
    folders): its ``figures`` is the committed figures/ (a link, so any write to ``../figures`` lands in the tracked
    folder and is caught) and its ``runs/`` is temporary (nothing is written to the real runs/). ``add(name, copy)``
    puts a committed notebook in its ``notebooks/``: a link to the committed file, or a copy (for the --in-place
    tests, so a bug cannot rewrite a committed notebook)."""
    root = tmp_path / "checkout"
    (root / "notebooks").mkdir(parents=True)
    (root / "figures").symlink_to(FIGURES, target_is_directory=True)
    use_project(root)
    monkeypatch.delenv(nbrun.SMOKE_ENV, raising=False)  # `make test` sets FTTA_SMOKE=1

    def add(name: str, copy: bool = False) -> Path:
        path = root / "notebooks" / f"{name}.ipynb"
        if copy:
            path.write_bytes((NOTEBOOKS / path.name).read_bytes())
        else:
            path.symlink_to(NOTEBOOKS / path.name)
        return path

    return SimpleNamespace(root=root, add=add)


@pytest.fixture
def fake_papermill(monkeypatch):
    """Stand-in for papermill.execute_notebook: records each call and writes an 'executed' copy (one output added)."""
    calls = []

    def execute(input_path, output_path, parameters=None, **kwargs):
        calls.append({"input": input_path, "output": output_path, "parameters": dict(parameters or {}), **kwargs})
        nb = nbformat.read(input_path, as_version=4)
        nb.metadata["papermill"] = {"parameters": dict(parameters or {}), "input_path": input_path,
                                    "output_path": output_path}
        nb.cells.append(nbformat.v4.new_code_cell("print('ran')", outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="ran\n")]))
        nbformat.write(nb, output_path)
        return nb

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    return calls


# ----------------------------------------------------------------------------------------------- committed notebooks
def _assigned(source: str) -> Dict[str, object]:
    return nbrun.literal_assignments(source)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_committed_notebook_is_a_full_mode_execution(path):
    nb = nbformat.read(str(path), as_version=4)
    record = nb.metadata.get("papermill", {})
    assert record.get("parameters", {}).get("smoke") is False, f"{path.name}: papermill did not record smoke=False"
    assert not record.get("exception"), f"{path.name}: its last execution failed"
    tagged = {tag: [c for c in nb.cells if tag in c.metadata.get("tags", [])]
              for tag in ("parameters", "injected-parameters")}
    assert len(tagged["parameters"]) == 1 and _assigned(tagged["parameters"][0].source).get("smoke") is False
    for cell in tagged["injected-parameters"]:
        assert _assigned(cell.source).get("smoke", False) is False, f"{path.name}: smoke injected"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), f"{path.name}: cells not executed"
    assert any(c.outputs for c in code), f"{path.name}: no outputs"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"], f"{path.name}: error outputs"


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_notebooks_that_write_files_have_their_output_folders_redirected(path, tmp_path):
    nb = nbformat.read(str(path), as_version=4)
    writes = any(re.search(r"savefig|to_csv|write_text", c.source) for c in nb.cells if c.cell_type == "code")
    redirected = nbrun.redirected_outputs(path, tmp_path)
    assert bool(redirected) == writes, f"{path.name}: writes files {writes}, redirected {redirected}"
    assert all(Path(v).is_relative_to(tmp_path / "figures") for v in redirected.values())


# ------------------------------------------------------------------------------------------------ where runs write
def test_default_smoke_run_writes_nothing_tracked(checkout, capsys):
    """The README's `notebooks --smoke`, on the committed 00_quickstart: executed copy in runs/notebooks/<stamp>-smoke/,
    the committed notebooks and figures/ byte-identical."""
    committed = checkout.add("00_quickstart")
    before = tracked_snapshot()
    assert main(["notebooks", "00_quickstart", "--smoke"]) == 0
    assert tracked_snapshot() == before
    assert committed.is_symlink() and committed.resolve() == NOTEBOOKS / committed.name

    (out,) = list(nbrun.DEFAULT_OUT_ROOT.iterdir())
    assert out.name.endswith("-smoke")
    executed = out / committed.name
    assert f"executed {executed}" in capsys.readouterr().out
    assert nbformat.read(str(executed), as_version=4).metadata.papermill.parameters["smoke"] is True
    assert any("smoke=True" in line for line in nbrun.text_outputs(executed))
    # the quickstart's smoke figure goes to ../runs/smoke (git-ignored), here the temporary checkout's runs/
    assert (checkout.root / "runs" / "smoke" / "quickstart_collaboration.png").is_file()


def test_out_dir_receives_the_figures(checkout, fake_papermill, tmp_path):
    for name in ("00_quickstart", "40_fedicon", "50_fedacross"):
        checkout.add(name)
    out = tmp_path / "out"
    assert main(["notebooks", "00_quickstart", "40_fedicon", "50_fedacross", "--out-dir", str(out)]) == 0
    params = {Path(c["input"]).stem: c["parameters"] for c in fake_papermill}
    assert params["00_quickstart"] == {"figure_dir": str(out / "figures")}  # no smoke injected without --smoke
    assert params["50_fedacross"] == {"figures_dir": str(out / "figures" / "fedacross")}
    assert params["40_fedicon"] == {"results_dir": str(out / "figures" / "fedicon")}
    # FedICON's stored runs stay the committed ones (nothing recomputed), its figure and tables go to out/
    assert (out / "figures" / "fedicon" / "cache").resolve() == FIGURES / "fedicon" / "cache"
    assert all(c["output"] == str(out / f"{Path(c['input']).name}") for c in fake_papermill)
    assert all(c["cwd"] == str(checkout.root / "notebooks") for c in fake_papermill)

    fake_papermill.clear()
    assert main(["notebooks", "00_quickstart", "--out-dir", str(out), "-p", "figure_dir=mine"]) == 0
    assert fake_papermill[0]["parameters"] == {"figure_dir": "mine"}  # a figure folder given with -p is kept


@pytest.mark.parametrize("argv, injected", [([], None), (["--smoke"], True), (["-p", "smoke=True"], True),
                                             (["-p", "smoke=False"], False), (["--smoke", "-p", "smoke=False"], True)])
def test_smoke_parameter_is_only_set_by_the_flag_when_given(checkout, fake_papermill, tmp_path, argv, injected):
    checkout.add("00_quickstart")
    assert main(["notebooks", "00_quickstart", "--out-dir", str(tmp_path / "out"), *argv]) == 0
    assert fake_papermill[0]["parameters"].get("smoke") == injected


# ---------------------------------------------------------------------------------------------------------- in place
@pytest.mark.parametrize("argv, env", [(["--smoke"], None), (["-p", "smoke=True"], None), ([], "1")],
                         ids=["flag", "parameter", "FTTA_SMOKE"])
def test_in_place_smoke_run_is_refused(checkout, fake_papermill, monkeypatch, capsys, argv, env):
    committed = checkout.add("00_quickstart", copy=True)
    before = committed.read_bytes()
    if env:
        monkeypatch.setenv(nbrun.SMOKE_ENV, env)
    with pytest.raises(SystemExit) as exit_:
        main(["notebooks", "00_quickstart", "--in-place", *argv])
    message = str(exit_.value.code)
    assert "smoke outputs must never land in the tracked notebooks" in message and "\n" not in message
    assert not fake_papermill and committed.read_bytes() == before
    assert not nbrun.DEFAULT_OUT_ROOT.exists()


def test_in_place_excludes_out_dir(checkout, fake_papermill, tmp_path, capsys):
    checkout.add("00_quickstart", copy=True)
    with pytest.raises(SystemExit):
        main(["notebooks", "00_quickstart", "--in-place", "--out-dir", str(tmp_path / "out")])
    assert "not allowed with argument" in capsys.readouterr().err and not fake_papermill


def test_out_dir_cannot_be_the_notebooks_folder(checkout, fake_papermill):
    checkout.add("00_quickstart", copy=True)
    with pytest.raises(SystemExit, match="use --in-place"):
        main(["notebooks", "00_quickstart", "--out-dir", str(checkout.root / "notebooks")])
    assert not fake_papermill


def test_failed_run_leaves_the_committed_notebook_byte_identical(checkout, monkeypatch, capsys):
    """papermill writes the partly executed notebook (with the error) to its output path, then raises."""
    committed = checkout.add("00_quickstart", copy=True)
    before, real_before = committed.read_bytes(), tracked_snapshot()

    def failing(input_path, output_path, **kwargs):
        Path(output_path).write_text('{"partial": true}')
        raise papermill.PapermillExecutionError(cell_index=3, exec_count=3, source="run_grid(...)",
                                                ename="ValueError", evalue="bad parameter", traceback=[])

    monkeypatch.setattr(papermill, "execute_notebook", failing)
    for argv in (["--in-place"], ["--out-dir", str(checkout.root / "out")], []):
        assert main(["notebooks", "00_quickstart", *argv]) == 1
        assert committed.read_bytes() == before
        err = capsys.readouterr().err
        assert "00_quickstart.ipynb failed, cell [3] raised ValueError: bad parameter" in err
        assert "committed notebook untouched" in err
    assert not list(committed.parent.glob(".*"))  # no temporary file left beside the committed notebook
    staged = [p for p in nbrun.DEFAULT_OUT_ROOT.iterdir() if p.name.endswith("-in-place")]
    assert len(staged) == 1 and (staged[0] / committed.name).read_text() == '{"partial": true}'  # kept to debug
    assert tracked_snapshot() == real_before


def test_successful_in_place_run_replaces_the_notebook(checkout, fake_papermill):
    committed = checkout.add("00_quickstart", copy=True)
    assert main(["notebooks", "00_quickstart", "--in-place"]) == 0
    (call,) = fake_papermill
    assert call["parameters"] == {"smoke": False}  # recorded as a full run; figures go to ../figures (no redirect)
    assert Path(call["output"]).parent.parent == nbrun.DEFAULT_OUT_ROOT  # executed into a staging copy first
    nb = nbformat.read(str(committed), as_version=4)
    assert nb.cells[-1].outputs[0].text == "ran\n" and nb.metadata.papermill.output_path == str(committed)
    assert not list(committed.parent.glob(".*")) and not list(nbrun.DEFAULT_OUT_ROOT.iterdir())
