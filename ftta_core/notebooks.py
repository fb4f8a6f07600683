"""Headless notebook execution with papermill, and the smoke switch every notebook reads.

Where a run writes (``python -m ftta_core notebooks``):

* by default into an output folder (``--out-dir``, else ``runs/notebooks/<stamp>/``): the executed copies go there, and
  so do the figures and tables the notebooks write -- the parameters naming those folders (``figure_dir``,
  ``figures_dir``; 40_fedicon's ``results_dir``) are redirected from ``../figures/<sub>`` to ``<out>/figures/<sub>``.
  Stored-run folders (``results_dir`` of the other notebooks, ``table1_runs``, ...) are shared caches keyed by config
  hash, read by every notebook and by ``study fedtsa table`` / ``run-plan``: they are not redirected.
* with ``in_place=True`` (``--in-place``) into the committed ``notebooks/*.ipynb`` and ``figures/``: each notebook is
  executed into a staging copy first and replaces the committed one (atomically) only when execution succeeded.
  Smoke runs are refused: smoke outputs must never land in tracked notebooks.

Anywhere else (a JupyterLab kernel, plain papermill) a notebook writes no committed figure either: each notebook passes
its output folders through ``output_folder``, which keeps a folder under ``figures/`` only in the kernels of an
``--in-place`` run (``IN_PLACE_ENV``) and otherwise sends it to ``runs/notebooks/<notebook>/figures/<sub>``.

The folders named here are this repository's: the module takes the project's from ``project.layout()`` (its
``notebooks``, ``results`` and ``scratch`` folders, ``[tool.ftta]`` in the project's ``pyproject.toml``).
"""
from __future__ import annotations

import ast
import contextlib
import logging
import os
import time
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from .progress import (PROGRESS_ENV, PROGRESS_FILE_ENV, papermill_progress, progress_line, progress_wanted,
                       relay_progress)
from .project import layout, layout_aliases

# the project's folders (``project.layout()``) under the names this module had for them: its root, its notebooks
# (``notebooks/`` here) and the default root of the runs' output folders (``runs/notebooks/``, git-ignored)
__getattr__ = layout_aliases(__name__, REPO_DIR="root", NOTEBOOK_DIR="notebooks", DEFAULT_OUT_ROOT="notebook_runs")
SMOKE_ENV = "FTTA_SMOKE"

# Parameters-cell names of the folders a notebook writes its figures and tables to (defaults under ../figures). A run
# with an output folder points them at <out>/figures/<same sub-path>. The tuple names sub-folders that hold stored
# runs (a cache keyed by config hash): they are linked back to the committed store, so nothing is recomputed.
OUTPUT_PARAMETERS: Dict[str, tuple] = {"figure_dir": (), "figures_dir": ()}
NOTEBOOK_OUTPUT_PARAMETERS: Dict[str, Dict[str, tuple]] = {"40_fedicon": {"results_dir": ("cache",)}}

# The notebooks' kernels run with progress bars off (they would only land in the executed copies as widgets; the
# runner shows papermill's bar over cells on stderr instead) and without the variable by which JupyterLab marks its
# kernels (a run started from a JupyterLab kernel must still render ``explorer``'s static figures).
KERNEL_ENV = {PROGRESS_ENV: "0"}
FRONTEND_ENV = "JPY_SESSION_NAME"
# never passed to a kernel: with it (e.g. MPLBACKEND=Agg from a test shell) a notebook draws its figures to files only
# and its executed copy shows none inline
KERNEL_DROPPED_ENV = ("MPLBACKEND",)

# what the runner reports as a figure a notebook wrote (``written_figures``)
FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".gif")

# set to "1" in the kernels of an --in-place run only: there, and only there, a notebook writes into figures/
IN_PLACE_ENV = "FTTA_IN_PLACE"

IN_PLACE_SMOKE_REFUSED = ("--in-place refuses a smoke run (--smoke, -p smoke=True or FTTA_SMOKE=1): smoke outputs "
                          "must never land in the tracked notebooks")


class NotebookFailed(RuntimeError):
    """A notebook's execution failed; ``executed`` is the partial copy papermill wrote (with the failing cell)."""

    def __init__(self, notebook: Path, executed: Path, cause: BaseException):
        if hasattr(cause, "ename"):  # papermill's PapermillExecutionError: the failing cell's exception
            what = f"cell [{cause.exec_count}] raised {cause.ename}: {cause.evalue}"
        else:
            what = f"{type(cause).__name__}: {cause}"
        super().__init__(f"{notebook.name} failed, {what}; executed copy: {executed}")
        self.notebook, self.executed = notebook, executed


def smoke_mode(smoke: bool) -> bool:
    """True when the notebook's ``smoke`` parameter is set or ``FTTA_SMOKE=1`` (how CI runs notebooks via nbval)."""
    return bool(smoke) or os.environ.get(SMOKE_ENV, "0") == "1"


def notebook_paths(names: Sequence[str] = ()) -> List[Path]:
    """The notebooks named (by file name or stem), or all numbered notebooks in the project's notebooks folder."""
    available = sorted(layout().notebooks.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return available
    by_key = {**{p.stem: p for p in available}, **{p.name: p for p in available}}
    missing = [n for n in names if n not in by_key]
    if missing:
        raise ValueError(f"unknown notebook(s) {missing}; available: {[p.stem for p in available]}")
    return [by_key[n] for n in names]


def literal_assignments(source: str) -> Dict[str, Any]:
    """``{name: value}`` of the top-level ``name = <literal>`` lines of a cell's ``source`` (non-literals skipped)."""
    out: Dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def notebook_parameters(path: Path) -> Dict[str, Any]:
    """The literal defaults of a notebook's papermill ``parameters`` cell."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", []))
    return literal_assignments(cell.source)


def output_parameters(path: Path) -> Dict[str, tuple]:
    """The parameters of one notebook that name where it writes figures and tables (see ``OUTPUT_PARAMETERS``)."""
    return {**OUTPUT_PARAMETERS, **NOTEBOOK_OUTPUT_PARAMETERS.get(Path(path).stem, {})}


def results_from_notebooks() -> PurePosixPath:
    """The project's results folder as a notebook's parameters name it: relative to the notebooks folder
    (``../figures`` here)."""
    lay = layout()
    return PurePosixPath(Path(os.path.relpath(lay.results, lay.notebooks)).as_posix())


def _output_folders(path: Path) -> Dict[str, PurePosixPath]:
    """``{parameter: default}`` of the notebook's output parameters whose default is a folder under the results
    folder (``results_from_notebooks``: ``../figures``)."""
    import papermill as pm

    results = results_from_notebooks().parts

    parse_log = logging.getLogger("papermill.translators")  # "Unable to parse line" for parameters it cannot type
    level = parse_log.level
    parse_log.setLevel(logging.ERROR)
    try:
        declared = pm.inspect_notebook(str(path))
    finally:
        parse_log.setLevel(level)
    out = {}
    for name in output_parameters(path):
        try:
            default = ast.literal_eval(declared[name]["default"]) if name in declared else None
        except (ValueError, SyntaxError):
            continue
        if isinstance(default, str) and PurePosixPath(default).parts[:len(results)] == results:
            out[name] = PurePosixPath(default)
    return out


def redirected_outputs(path: Path, out_dir: Path) -> Dict[str, str]:
    """``{parameter: folder}`` sending the notebook's ``../figures/<sub>`` output folders to ``<out_dir>/figures/<sub>``
    (the results folder's name and sub-path; absolute paths: papermill runs the kernel in the notebooks folder)."""
    results = len(results_from_notebooks().parts)
    return {name: str(Path(out_dir).resolve().joinpath(layout().results.name, *default.parts[results:]))
            for name, default in _output_folders(path).items()}


def _link_store(source: Path, link: Path) -> None:
    """``link`` -> ``source`` (a committed store of runs), when ``source`` exists and ``link`` does not yet."""
    if source.is_dir() and not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(source, target_is_directory=True)


def _link_stores(path: Path, redirected: Dict[str, str]) -> None:
    """Link the stored-run sub-folders of redirected output folders back to the committed stores."""
    defaults = _output_folders(path)
    for name, stores in output_parameters(path).items():
        for store in stores if name in redirected else ():
            _link_store((layout().notebooks / defaults[name] / store).resolve(), Path(redirected[name]) / store)


def output_folder(folder: Union[str, Path], notebook: str, parameter: str = "figure_dir") -> Path:
    """Where a notebook writes the figures and tables of its output parameter ``parameter`` (``figure_dir``, ...),
    whose value is ``folder``: ``folder`` itself, unless it lies under the project's committed results folder
    (``figures/``) and this kernel is not one of an ``--in-place`` run (``make figures``): then
    ``runs/notebooks/<notebook>/figures/<sub>`` (what an interactive JupyterLab kernel or plain papermill writes;
    never over a committed figure). Stored-run sub-folders of the parameter (``NOTEBOOK_OUTPUT_PARAMETERS``) are
    linked back to the committed stores, as the runner does."""
    path, lay = Path(folder), layout()
    try:
        sub = path.resolve().relative_to(lay.results.resolve())
    except ValueError:  # a run folder the runner passed, a temporary folder: written as given
        return path
    if os.environ.get(IN_PLACE_ENV) == "1":
        return path
    out = lay.notebook_runs / notebook / lay.results.name / sub
    for store in output_parameters(Path(notebook)).get(parameter, ()):
        _link_store(path.resolve() / store, out / store)
    return out


def default_out_dir(smoke: bool) -> Path:
    """``runs/notebooks/<YYYYmmdd-HHMMSS>[-smoke]`` (the project's ``notebook_runs``): a fresh git-ignored folder
    per run."""
    return layout().notebook_runs / (time.strftime("%Y%m%d-%H%M%S") + ("-smoke" if smoke else ""))


def is_smoke_run(smoke: Optional[bool], parameters: Optional[Dict[str, Any]]) -> bool:
    """Whether a run executes in smoke mode: the flag (wins when given), else ``-p smoke=...``, or ``$FTTA_SMOKE``."""
    value = smoke if smoke is not None else (parameters or {}).get("smoke", False)
    return smoke_mode(bool(value))


def execute_notebooks(names: Sequence[str] = (), smoke: Optional[bool] = None,
                      parameters: Optional[Dict[str, Any]] = None, out_dir: Optional[Path] = None,
                      in_place: bool = False, on_done: Optional[Callable[[Path], None]] = None,
                      progress: bool = True) -> List[Path]:
    """Execute notebooks with papermill; returns the executed paths.

    ``smoke`` is injected only when given (True/False); otherwise a ``smoke`` in ``parameters`` or the notebook's own
    default applies. Without ``in_place`` the executed copies, figures and tables go to ``out_dir`` (default
    ``runs/notebooks/<stamp>/``) and nothing tracked is written. With ``in_place`` each committed notebook is replaced,
    atomically, by its executed copy only when execution succeeded; smoke runs are refused (``ValueError``). A failed
    execution raises ``NotebookFailed`` (from papermill's error) and leaves its partial copy in the output folder
    (with ``in_place``: the staging folder ``runs/notebooks/<stamp>-in-place/``).
    ``progress``: papermill's bar over each notebook's cells on stderr (``progress.progress_wanted``: quiet in logs
    and with ``FTTA_PROGRESS=0``) and progress lines: one per notebook, the lines its kernel writes (runs, data
    decoded on first use; ``progress.relay_progress``) and one per figure it wrote (``written_figures``), with paths
    relative to the repository root (``repository_path``).
    """
    import papermill as pm

    lay = layout()
    params = dict(parameters or {})
    if smoke is not None:
        params["smoke"] = bool(smoke)
    run_smoke = is_smoke_run(smoke, parameters)
    if in_place:
        if out_dir is not None:
            raise ValueError("--in-place and --out-dir exclude each other")
        if run_smoke:
            raise ValueError(IN_PLACE_SMOKE_REFUSED)
        params["smoke"] = False  # recorded in metadata.papermill.parameters: the committed notebooks are full runs
        out = lay.notebook_runs / (time.strftime("%Y%m%d-%H%M%S") + "-in-place")  # staging copies (kept on failure)
    else:
        out = Path(out_dir) if out_dir is not None else default_out_dir(run_smoke)
        if out.resolve() == lay.notebooks.resolve():
            raise ValueError(f"--out-dir {out_dir} is the committed notebooks' folder: use --in-place to rewrite them")

    paths = notebook_paths(names)
    done = []
    for number, path in enumerate(paths, 1):
        nb_params = dict(params)
        if not in_place:
            redirected = {k: v for k, v in redirected_outputs(path, out).items() if k not in params}
            _link_stores(path, redirected)
            nb_params.update(redirected)
        target = out / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        source = input_notebook(path, out)
        shown = progress_wanted(progress)
        lines = out / f".{path.stem}.progress" if shown else None  # the kernel's progress lines, relayed
        writes = _shown_path(path if in_place else target)
        progress_line(f"notebook {number} of {len(paths)}: {path.stem} -> {writes}", progress)
        figures_before = figure_files(out) if shown else {}
        try:
            kernel_env = {**({PROGRESS_FILE_ENV: str(lines.resolve())} if lines else {}),
                          **({IN_PLACE_ENV: "1"} if in_place else {})}
            with kernel_environment(kernel_env), relay_progress(lines):
                pm.execute_notebook(str(source), str(target), parameters=nb_params, cwd=str(lay.notebooks),
                                    kernel_name="python3", progress_bar=papermill_progress(path.stem, progress),
                                    config=kernel_config())
        except Exception as e:  # the committed notebook is untouched: only ``target`` was written
            raise NotebookFailed(path, target, e) from e
        finally:
            if source != path:
                source.unlink(missing_ok=True)
            if lines is not None:
                lines.unlink(missing_ok=True)
        for figure in written_figures(figures_before, out) if shown else ():
            progress_line(f"figure: {_shown_path(figure)}", progress)
        if in_place:
            _replace_atomically(target, path)
            target.unlink()  # the staging copy is only kept when execution failed
            if not any(out.iterdir()):
                out.rmdir()
            target = path
        done.append(target)
        if on_done is not None:
            on_done(target)
    return done


def repository_path(path: Path) -> str:
    """``path`` relative to the project's root (``project.layout().root``) when it lies inside it, else absolute."""
    path, root = Path(path).resolve(), layout().root.resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _shown_path(path: Path) -> str:
    """``path`` as the runner's progress lines print it: ``repository_path``, saying so when it is relative."""
    shown = repository_path(path)
    return shown if Path(shown).is_absolute() else f"{shown} (relative to the repository root)"


def figure_files(out: Path) -> Dict[Path, int]:
    """``{file: mtime_ns}`` of the figure files (``FIGURE_SUFFIXES``) where notebooks write them: the project's
    results and scratch folders (``figures/``, ``runs/``: ``runs/smoke`` in smoke mode) and the output folder
    ``out``."""
    lay = layout()
    found: Dict[Path, int] = {}
    for folder in dict.fromkeys(p.resolve() for p in (lay.results, lay.scratch, Path(out))):
        for parent, _, files in os.walk(folder):
            for name in files:
                if name.lower().endswith(FIGURE_SUFFIXES):
                    with contextlib.suppress(OSError):
                        found[Path(parent, name)] = os.stat(Path(parent, name)).st_mtime_ns
    return found


def written_figures(before: Mapping[Path, int], out: Path) -> List[Path]:
    """The figure files new or rewritten since ``before`` (``figure_files``), sorted."""
    return sorted(p for p, mtime in figure_files(out).items() if before.get(p) != mtime)


@contextlib.contextmanager
def kernel_environment(extra: Optional[Mapping[str, str]] = None) -> Iterator[None]:
    """``os.environ`` as the notebooks' kernels inherit it while papermill starts them (restored afterwards):
    ``KERNEL_ENV`` (a value the user set wins) and ``extra``, no ``FRONTEND_ENV`` and no ``KERNEL_DROPPED_ENV``
    (figures inline)."""
    saved = dict(os.environ)
    os.environ.pop(IN_PLACE_ENV, None)  # an --in-place run passes it in ``extra``; never inherited from the shell
    os.environ.update({k: v for k, v in KERNEL_ENV.items() if k not in saved})
    os.environ.update(extra or {})
    for name in (FRONTEND_ENV, *KERNEL_DROPPED_ENV):
        os.environ.pop(name, None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def kernel_config() -> Any:
    """The traitlets config of the kernel manager papermill starts: CurveZMQ transport encryption where the
    kernelspec declares it (ipykernel's does) and pyzmq supports it. Without it every kernel logs ipykernel's
    "Kernel is running over TCP without encryption" warning (jupyter_client's ``transport_encryption`` defaults
    to 'disabled'); with 'auto' the kernel really is encrypted and says nothing."""
    import zmq
    from traitlets.config import Config

    return Config({"KernelManager": {"transport_encryption": "auto"}} if zmq.has("curve") else {})


def source_path(path: Path) -> Path:
    """The notebook's jupytext source, ``NN_name.py`` (py:percent) beside ``NN_name.ipynb``."""
    return Path(path).with_suffix(".py")


def read_source(path: Path) -> Any:
    """The notebook as its jupytext source defines it (cells, tags; no outputs), as an ``nbformat`` notebook."""
    import jupytext

    nb = jupytext.read(str(source_path(path)), fmt="py:percent")
    # the kernel `make install` puts in .venv (`ipykernel install --sys-prefix --name python3`) under its own name
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                          "language": "python"})
    return nb


def input_notebook(path: Path, out: Path) -> Path:
    """What papermill executes: the cells of the notebook's ``.py`` source (the source of truth; edit it, not the
    ``.ipynb``), written as ``<out>/.<name>.input.ipynb``; the ``.ipynb`` itself when it has no source."""
    import nbformat

    if not source_path(path).exists():
        return Path(path)
    nb = read_source(path)
    # as jupytext writes a paired .ipynb (JupyterLab's save): the text_representation belongs to the .py only
    nb.metadata.get("jupytext", {}).pop("text_representation", None)
    staged = Path(out) / f".{Path(path).stem}.input.ipynb"
    nbformat.write(nb, str(staged))
    return staged


def _replace_atomically(executed: Path, committed: Path) -> None:
    """Write the executed notebook (its papermill output path set to the committed one) next to the committed file,
    then ``os.replace`` it over the committed file: a reader sees the old or the new notebook, never a partial one."""
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    if "papermill" in nb.metadata:
        nb.metadata["papermill"]["output_path"] = str(committed)
    tmp = committed.with_name(f".{committed.name}.tmp")
    try:
        nbformat.write(nb, str(tmp))
        os.replace(tmp, committed)
    finally:
        if tmp.exists():
            tmp.unlink()


def text_outputs(path: Path) -> List[str]:
    """The printed text and plain-text results of an executed notebook's cells (figures skipped)."""
    import nbformat

    out = []
    for cell in nbformat.read(str(path), as_version=4).cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append(o["text"].rstrip())
            elif "data" in o and "text/plain" in o["data"] and not o["data"]["text/plain"].startswith("<Figure"):
                out.append(o["data"]["text/plain"].rstrip())
    return out
