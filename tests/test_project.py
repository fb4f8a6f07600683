"""Where the library learns the project's folders (``ftta_core.project``): the ``[tool.ftta]`` table of the project's
``pyproject.toml``, how the project is found, and every module that writes or reads a folder of the project taking
it from there (plans, unfinished runs, notebook runs, ``runs``' default, Ray workers); the library's code names no
folder of this repository."""
from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import List, Set

import nbformat
import pytest

from ftta_core import grid, notebooks, plan, project
from ftta_core.cli import main
from ftta_core.experiment import ExperimentConfig
from ftta_core.ray_plan import worker_env

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "ftta_core"
TABLE = '[tool.ftta]\nresults = "store/results"\nnotebooks = "nb"\nscratch = "scratch"\n'


@pytest.fixture
def elsewhere(tmp_path, monkeypatch, use_project) -> project.Layout:
    """A project outside this repository with folders of its own names, made this process's project."""
    root = tmp_path / "other"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "other"\n\n' + TABLE)
    monkeypatch.delenv(project.PROJECT_ENV, raising=False)
    monkeypatch.delenv("FTTA_PARTIAL_DIR", raising=False)  # conftest's: here the project's default is checked
    return use_project(root)


def test_this_repository_names_its_folders():
    lay = project.read_layout(REPO)
    assert (lay.root, lay.results, lay.notebooks, lay.scratch) == (REPO, REPO / "figures", REPO / "notebooks",
                                                                    REPO / "runs")
    assert (lay.partial_runs, lay.notebook_runs) == (REPO / "runs" / "partial", REPO / "runs" / "notebooks")
    assert project.ftta_table(REPO)["no-deps"]  # the table's other key stays where it was


def test_the_table_is_read_and_missing_keys_take_the_defaults(tmp_path):
    (tmp_path / "pyproject.toml").write_text(TABLE)
    lay = project.read_layout(tmp_path)
    assert (lay.results, lay.notebooks, lay.scratch) == (tmp_path / "store" / "results", tmp_path / "nb",
                                                         tmp_path / "scratch")
    (tmp_path / "pyproject.toml").write_text('[tool.ftta]\nresults = "out"\n')
    lay = project.read_layout(tmp_path)
    assert (lay.results, lay.notebooks, lay.scratch) == (tmp_path / "out", tmp_path / "notebooks", tmp_path / "runs")
    (tmp_path / "pyproject.toml").write_text('[tool.ftta]\nresults = 3\n')
    with pytest.raises(ValueError, match="results must be a folder name"):
        project.read_layout(tmp_path)


def test_the_project_is_found_env_first_then_above_the_working_folder_then_the_package(tmp_path, monkeypatch):
    mine, other = tmp_path / "mine", tmp_path / "other"
    for root in (mine, other):
        (root / "nb" / "deep").mkdir(parents=True)
        (root / "pyproject.toml").write_text(TABLE)
    monkeypatch.delenv(project.PROJECT_ENV, raising=False)
    found = project.find_layout(mine / "nb" / "deep")  # a kernel in the notebooks folder finds the project above
    assert (found.root, found.found, found.notebooks) == (mine, "pyproject", mine / "nb")
    monkeypatch.setenv(project.PROJECT_ENV, str(other))  # $FTTA_PROJECT_ROOT wins
    assert (project.find_layout(mine).root, project.find_layout(mine).found) == (other, "env")
    monkeypatch.delenv(project.PROJECT_ENV)
    (tmp_path / "bare").mkdir()
    assert (project.find_layout(tmp_path / "bare").root, project.find_layout(tmp_path / "bare").found) == \
        (project.LIBRARY_CHECKOUT, "package")  # this repository's editable install
    monkeypatch.setattr(project, "LIBRARY_CHECKOUT", tmp_path / "site-packages")  # an install with no table
    assert project.find_layout(tmp_path / "bare") == project.Layout(
        tmp_path / "bare", tmp_path / "bare" / "figures", tmp_path / "bare" / "notebooks", tmp_path / "bare" / "runs",
        "cwd")


def test_the_layout_is_kept_until_replaced(use_project, tmp_path):
    first = project.layout()
    assert project.layout() is first
    assert use_project(tmp_path).root == tmp_path.resolve() and project.layout().root == tmp_path.resolve()
    assert plan.REPO_DIR == tmp_path.resolve()  # the names other code imports follow it
    assert notebooks.NOTEBOOK_DIR == tmp_path.resolve() / "notebooks"
    assert notebooks.DEFAULT_OUT_ROOT == tmp_path.resolve() / "runs" / "notebooks"
    with pytest.raises(AttributeError):
        notebooks.NOT_A_FOLDER


def test_a_project_elsewhere_plans_into_its_own_root(elsewhere, tmp_path, monkeypatch):
    monkeypatch.setenv(plan.PLAN_ENV, str(tmp_path / "plan.jsonl"))
    inside, outside = elsewhere.results / "grid", tmp_path / "loose"
    plan.add_to_plan({"seed": 0}, inside)
    plan.add_to_plan({"seed": 1}, outside)
    stored = [json.loads(line)["results_dir"] for line in (tmp_path / "plan.jsonl").read_text().splitlines()]
    assert stored == ["store/results/grid", str(outside.resolve())]  # relative to the project's root
    assert [plan.results_path(job) for job in plan.read_plan(tmp_path / "plan.jsonl")] == [inside, outside.resolve()]


def test_a_project_elsewhere_keeps_unfinished_runs_in_its_scratch_folder(elsewhere):
    cfg = ExperimentConfig(dataset="embedded_digits", clients=2, batch_size=5)
    assert grid.partial_dir(cfg) == elsewhere.scratch / "partial" / grid.config_key(cfg)


def _notebook(path: Path, figure_dir: str) -> Path:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell(f"figure_dir = {figure_dir!r}", metadata={"tags": ["parameters"]})]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def test_a_project_elsewhere_runs_its_own_notebooks_into_its_scratch_folder(elsewhere, tmp_path, monkeypatch):
    monkeypatch.delenv(notebooks.IN_PLACE_ENV, raising=False)
    mine = _notebook(elsewhere.notebooks / "01_mine.ipynb", "../store/results/plots")
    theirs = _notebook(elsewhere.notebooks / "02_theirs.ipynb", "../figures/plots")  # this repository's folder name
    assert notebooks.notebook_paths() == [mine, theirs]
    assert str(notebooks.results_from_notebooks()) == "../store/results"
    assert notebooks.redirected_outputs(mine, tmp_path / "out") == {
        "figure_dir": str((tmp_path / "out" / "results" / "plots").resolve())}
    assert notebooks.redirected_outputs(theirs, tmp_path / "out") == {}  # not under this project's results
    assert notebooks.default_out_dir(False).parent == elsewhere.scratch / "notebooks"
    monkeypatch.chdir(elsewhere.notebooks)  # a kernel's view
    assert notebooks.output_folder("../store/results/plots", "01_mine") == \
        elsewhere.scratch / "notebooks" / "01_mine" / "results" / "plots"
    assert notebooks.repository_path(elsewhere.results / "x.png") == "store/results/x.png"


def test_runs_lists_the_projects_results_folder_by_default(elsewhere, monkeypatch, capsys):
    monkeypatch.chdir(elsewhere.root)
    assert main(["runs"]) == 2  # no results folder yet: refused, named as the user would type it
    assert capsys.readouterr().err.strip() == "error: not a folder: store/results"
    elsewhere.results.mkdir(parents=True)
    assert main(["runs"]) == 0 and capsys.readouterr().out.strip() == "no stored runs"
    monkeypatch.chdir(elsewhere.root.parent)  # outside the project: the folder in full
    assert main(["runs"]) == 0


def test_ray_workers_get_the_drivers_project(elsewhere):
    env = worker_env({"PYTHONPATH": "/elsewhere"})
    assert env[project.PROJECT_ENV] == str(elsewhere.root)
    assert env["PYTHONPATH"].split(":") == [str(elsewhere.root), str(project.LIBRARY_CHECKOUT), "/elsewhere"]


# --------------------------------------------------------------------------------- the library names no folder of ours
def _docstrings(tree: ast.AST) -> Set[int]:
    """The ids of the string constants that are docstrings or bare string statements (comments in effect)."""
    bodies = [node.body for node in ast.walk(tree) if isinstance(getattr(node, "body", None), list)]  # not a lambda's
    return {id(stmt.value) for body in bodies for stmt in body
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)}


def _names_a_folder(text: str) -> bool:
    """Whether a string constant is a path naming this repository's results folder (``figures``, ``../figures``,
    ``figures/x.png``) or a path through its scratch or notebooks folder (``runs/partial``, ``notebooks/x``); prose
    (help texts, messages: with spaces) is not a path."""
    if any(c.isspace() for c in text):
        return False
    parts = text.replace("\\", "/").split("/")
    return "figures" in parts or (len(parts) > 1 and bool({"runs", "notebooks"} & set(parts)))


def folder_literals(root: Path = PACKAGE) -> List[str]:
    """``file:line: 'literal'`` for each string constant of the package's code (docstrings left out) that names a
    folder of this repository, outside ``project.py``'s defaults."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "project.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        docstrings = _docstrings(tree)
        found += [f"{path.relative_to(root.parent)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                  and _names_a_folder(node.value)]
    return found


def test_the_library_code_names_no_folder_of_this_repository():
    assert folder_literals() == [], "take the folder from ftta_core.project.layout()"


def test_the_folder_check_sees_code_and_skips_docstrings(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text('"""Writes figures/ and ../figures."""\n\n\ndef f():\n'
                                          '    """Under ``figures/x``."""\n    help = "stored under figures/"\n'
                                          '    return Path("../figures") / "runs/partial"\n')
    assert sorted(folder_literals(tmp_path / "pkg")) == ["pkg/m.py:7: '../figures'", "pkg/m.py:7: 'runs/partial'"]
    assert [k for k, v in project.DEFAULT_FOLDERS.items() if _names_a_folder(v)] == ["results"]  # the one place
