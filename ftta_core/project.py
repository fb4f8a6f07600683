"""The layout of the project that uses the library: its root, where its stored results and notebooks live, and where
scratch output goes (unfinished runs of a grid, notebook runs). The library knows no repository's folders: every
module that needs one asks ``layout()``.

A project names its folders in its ``pyproject.toml``, relative to the file's folder::

    [tool.ftta]
    results = "figures"      # stored runs, figures and tables (``python -m ftta_core runs``' default)
    notebooks = "notebooks"  # the numbered notebooks ``python -m ftta_core notebooks`` executes
    scratch = "runs"         # git-ignored output: <scratch>/partial (unfinished runs), <scratch>/notebooks (runs)

The project is found once per process (``layout()``), in this order:

1. ``$FTTA_PROJECT_ROOT``;
2. the nearest folder at or above the working folder whose ``pyproject.toml`` has a ``[tool.ftta]`` table (a
   notebook's kernel runs in the project's notebooks folder, so it finds the project above it);
3. the folder above the installed package when its ``pyproject.toml`` has that table (an editable install of this
   repository: commands started anywhere find it);
4. the working folder, with the default folder names (``DEFAULT_FOLDERS``).

A key the table leaves out takes its default. ``use(...)`` sets the layout of this process (tests; a program that
knows its project), ``use(None)`` finds it again on next use.

Why a table in ``pyproject.toml``: a project already has that file at its root, so finding the root and reading its
folders are one lookup; ``tomllib`` reads it without a dependency.
"""
from __future__ import annotations

import os
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Union

PROJECT_ENV = "FTTA_PROJECT_ROOT"
PYPROJECT = "pyproject.toml"
TABLE = ("tool", "ftta")
# the folders of a project whose table does not name them (this repository's, which names them anyway)
DEFAULT_FOLDERS: Dict[str, str] = {"results": "figures", "notebooks": "notebooks", "scratch": "runs"}
# the folder the package was imported from: in a source checkout (editable install) the library's repository, with
# its tests (``units``' oracles) and git history (``runstore``, ``record_migration``); site-packages otherwise
LIBRARY_CHECKOUT = Path(__file__).resolve().parents[1]
# when this process imported the package (this module is its first import, ``ftta_core/__init__.py``): every other
# module of it was imported later, so a module file newer than this may differ from the code running
# (``units.changed_on_disk``)
IMPORTED_AT_NS = time.time_ns()


@dataclass(frozen=True)
class Layout:
    """A project's folders, absolute; ``found`` says how its root was found (``env``, ``pyproject``, ``package``,
    ``cwd`` or ``given``)."""

    root: Path
    results: Path
    notebooks: Path
    scratch: Path
    found: str = "given"

    @property
    def partial_runs(self) -> Path:
        """Where a grid keeps its unfinished runs (``grid.partial_dir``) unless ``$FTTA_PARTIAL_DIR`` says."""
        return self.scratch / "partial"

    @property
    def notebook_runs(self) -> Path:
        """Where ``python -m ftta_core notebooks`` writes a run's executed copies and figures by default."""
        return self.scratch / "notebooks"


def ftta_table(root: Path) -> Optional[Dict[str, object]]:
    """The ``[tool.ftta]`` table of ``root/pyproject.toml`` (None when the file or the table is missing)."""
    path = Path(root) / PYPROJECT
    if not path.is_file():
        return None
    with open(path, "rb") as fh:
        table: object = tomllib.load(fh)
    for key in TABLE:
        table = table.get(key) if isinstance(table, dict) else None
    return table if isinstance(table, dict) else None


def read_layout(root: Union[Path, str], found: str = "given") -> Layout:
    """The layout of the project at ``root``: the folders its ``[tool.ftta]`` table names (relative to ``root``, or
    absolute), the defaults for the others."""
    root = Path(root).expanduser().resolve()
    table = ftta_table(root) or {}
    folders = {}
    for key, default in DEFAULT_FOLDERS.items():
        value = table.get(key, default)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{root / PYPROJECT}: [tool.ftta] {key} must be a folder name, not {value!r}")
        folders[key] = root / value
    return Layout(root, found=found, **folders)


def find_layout(cwd: Optional[Path] = None) -> Layout:
    """The layout of the project found from ``cwd`` (default: the working folder), in the order the module's
    docstring gives."""
    here = Path(cwd or Path.cwd()).resolve()
    if os.environ.get(PROJECT_ENV):
        return read_layout(os.environ[PROJECT_ENV], "env")
    for folder in (here, *here.parents):
        if ftta_table(folder) is not None:
            return read_layout(folder, "pyproject")
    if ftta_table(LIBRARY_CHECKOUT) is not None:
        return read_layout(LIBRARY_CHECKOUT, "package")
    return read_layout(here, "cwd")


_current: Optional[Layout] = None


def layout() -> Layout:
    """This process's project layout (found on first use, then kept; ``use`` replaces it)."""
    global _current
    if _current is None:
        _current = find_layout()
    return _current


def use(where: Union[Layout, Path, str, None]) -> Optional[Layout]:
    """Make ``where`` this process's layout: a ``Layout``, or a project root (its table read); None forgets it, so
    that the next ``layout()`` finds it again. Returns the layout it replaced (None when none was found yet)."""
    global _current
    before, _current = _current, (where if isinstance(where, Layout) or where is None else read_layout(where))
    return before


def layout_aliases(module: str, **fields: str) -> Callable[[str], Path]:
    """A module ``__getattr__`` (PEP 562) serving former folder constants as fields of today's layout
    (``REPO_DIR="root"``): names other code imports keep working and follow ``use``."""

    def __getattr__(name: str) -> Path:
        if name in fields:
            return getattr(layout(), fields[name])
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


__all__ = ["PROJECT_ENV", "DEFAULT_FOLDERS", "LIBRARY_CHECKOUT", "Layout", "ftta_table", "read_layout", "find_layout",
           "layout", "use", "layout_aliases"]
