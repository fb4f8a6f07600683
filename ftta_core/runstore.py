"""The run store: how every run of the workbook is written, locked, resumed, read back and checked against the code.

Two layouts hold runs, both plain files under version control (one file or folder per run, readable diffs):

- a **run folder** (``python -m ftta_core run --out DIR``, studies' per-strategy folders): ``steps.csv``,
  ``collaboration.npz``, ``summary.json``; while running also ``checkpoint.pt``, ``collaboration_parts/`` and
  ``.lock``. Written by ``RunWriter``.
- a **summary file** ``<config hash>.json`` in a results folder (grids, ``run-plan`` workers), written by
  ``store_summary``; while it runs, the grid keeps a resumable run folder under ``runs/partial/<hash>``.

Why files and atomic renames rather than SQLite: the stored runs are committed to git (a database file would make
every merge a conflict and every diff opaque), they are written by independent worker processes and read by
notebooks, and each run is small. Crash safety comes from the write order:

1. every file is written to a unique temporary name in the same folder, flushed, ``fsync``-ed and renamed over its
   target (``atomic_write``): a reader sees the old file or the new one, never a half-written one;
2. while a run folder is unfinished, appended rows are covered by the checkpoint, which records the byte length of
   ``steps.csv`` it vouches for: a resume truncates the file to that length (a row cut by a kill is dropped);
3. ``summary.json`` is written last: a folder with a summary is complete, one without is resumed from its
   checkpoint, and the checkpoint is deleted only after the summary exists.

A run folder is locked while a process writes it (``RunLock``, ``flock``): a second run into the same folder stops
at once with one line. A folder holding a finished run of another config is never overwritten unless asked
(``overwrite=True``, ``run --overwrite``); a finished run of the same config is read back, not run again.

**Code records.** Every summary records the code that made it (``code_record_of``; a simulated run's record is
``build.code_record``): the modules the run depends on (the local method's and strategy's modules and what they
import, the loop, engine, stream, scenarios, corruptions, models, data loaders, ``build`` and ``experiment``'s run
functions), each as a hash per **top-level definition** (``definition_hashes``): a function or class by its name, a
constant or import by the name it binds, each entry of a registry written as a dict literal (``NAME = {"key": ...}``)
as ``NAME['key']``, and every other top-level statement together as ``<module>`` (``__all__`` left out: the package
has no star import); hashed from the syntax tree
without docstrings, so comments, docstrings and formatting do not count. ``run_status`` says whether a stored run is
``current``, ``stale`` (a definition it recorded changed or is gone: ``stale_modules`` names them) or
``unrecorded`` (stored before records existed). Grids never reuse a stale run silently: they warn and, with
``FTTA_RERUN_STALE=1``, run it again.

What a definition record assumes: code that ran could only use the names that existed when it ran, so a *new*
function, class, constant or registry entry leaves every stored run current (the workbook grows without turning its
results stale), while editing or removing anything a run's modules define makes it stale. Two cases a new name can
still matter are caught: a new top-level name that shadows a builtin, and new statements outside definitions
(``<module>``). Not caught: code that iterates over a whole registry or looks names up by string (``getattr``) in a
way that changes numbers; the workbook's run code does neither. The record-keeping code itself (this module,
``RECORD_EXEMPT``) is not recorded: it stores and checks runs and computes no number of theirs; nor are the few
definitions in ``UNRECORDED_DEFINITIONS`` (writing and describing source checkpoints), which no run calls.

Records written before definitions were recorded hold one hash per module (``{"modules": ...}``);
``python -m ftta_core runs --migrate`` rewrites them (``record_migration``) by finding, in the git history, the
module source whose hash they recorded; a module whose source is not found keeps its whole-module hash
(``LEGACY_KEY``), checked as before.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import hashlib
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set

log = logging.getLogger(__name__)

PACKAGE = "ftta_core"
PACKAGE_DIR = Path(__file__).resolve().parent
RERUN_STALE_ENV = "FTTA_RERUN_STALE"
# modules never recorded: the record keeping itself (stores and checks runs, computes none of their numbers)
RECORD_EXEMPT = frozenset({f"{PACKAGE}.runstore", f"{PACKAGE}.record_migration"})
MODULE_KEY = "<module>"  # the key of a module's top-level statements that are not definitions
# names never recorded: ``__all__`` only decides what ``from m import *`` binds, and the package has no star import
# (tests/test_code_records.py checks it), so listing a new function there changes no run
UNRECORDED_NAMES = frozenset({"__all__"})
# single definitions never recorded: code that writes or describes a source checkpoint and its card, beside the code
# that trains and loads it; no run calls them (tests/test_code_records.py runs an experiment with them disabled);
# and a study's own record keeping (what its records name, which stored documents are its records)
UNRECORDED_DEFINITIONS: Dict[str, frozenset] = {
    f"{PACKAGE}.training": frozenset({"save_checkpoint", "source_card", "render_cards", "source_model_line",
                                      "PAPER_NO_ADAPT", "_train_images", "atomic_write"}),
    f"{PACKAGE}.fedicon.study": frozenset({"CODE_ROOTS", "record_scope", "is_record"}),
    # FedAvg+FT's reference reading: the functions that tabulate and describe stored readings (no run calls them)
    # and what its records name
    f"{PACKAGE}.fedtsa.ft_forward": frozenset({"ft_forward_table", "ft_forward_summary", "ft_forward_reading",
                                               "record_scope", "is_record"}),
}
LEGACY_KEY = "<whole module>"  # the key of a whole-module hash (a record migrated without its source)


class RunStoreError(RuntimeError):
    """A run folder cannot be used as asked (locked, or holding another config's finished run)."""


class RunInUse(RunStoreError):
    """A run folder is locked by another live process (``RunLock``)."""


# ---------------------------------------------------------------------------------------------------------------
# atomic files

def atomic_write(path: Path | str, write: Callable[[BinaryIO], Any]) -> None:
    """Create ``path`` atomically: ``write(fh)`` fills a unique temporary file beside it (binary handle), which is
    fsync-ed and renamed over ``path`` (``data.cache.atomic_write``), then the folder entry is fsync-ed. A crash
    leaves the old file (or none) and at worst a stray ``.*.tmp`` file."""
    from .data.cache import atomic_write as write_then_rename

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_then_rename(path, write)
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_text(path: Path | str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (``atomic_write``)."""
    atomic_write(path, lambda fh: fh.write(text.encode()))


def dumps_summary(summary: Dict[str, Any], indent: int = 1) -> str:
    """``summary`` as indented JSON, except that each module's definition hashes in its code record are one line
    (a record holds about a thousand: a readable file, a diff of one line per changed module)."""
    code = summary.get("code")
    if not (isinstance(code, dict) and isinstance(code.get("definitions"), dict)):
        return json.dumps(summary, indent=indent, default=float)
    lines = {f"@@definitions {i}@@": json.dumps(table, separators=(", ", ": "))
             for i, table in enumerate(code["definitions"].values())}
    marked = {**summary, "code": {**code, "definitions": dict(zip(code["definitions"], lines))}}
    text = json.dumps(marked, indent=indent, default=float)
    for marker, line in lines.items():
        text = text.replace(json.dumps(marker), line, 1)
    return text


def store_summary(path: Path | str, summary: Dict[str, Any]) -> None:
    """Write one run's summary file atomically (parallel workers never leave a half-written file behind)."""
    atomic_write_text(path, dumps_summary(summary))


# ---------------------------------------------------------------------------------------------------------------
# locks

class RunLock:
    """An exclusive ``flock`` on ``folder/.lock`` for as long as the ``with`` block runs (released by the OS when
    the process dies, so a killed run never leaves a folder locked)."""

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)
        self._fh = None

    def __enter__(self) -> "RunLock":
        import fcntl

        self.folder.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.folder / ".lock", "a+")
        try:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._fh.seek(0)
            holder = self._fh.read().strip() or "?"
            self._fh.close()
            self._fh = None
            raise RunInUse(f"run folder {self.folder} is in use by another run (pid {holder}); wait for it or "
                                "use another --out") from None
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(str(os.getpid()))
        self._fh.flush()
        return self

    def __exit__(self, *exc) -> None:
        if self._fh is not None:
            self._fh.close()  # closing releases the flock
            self._fh = None


# ---------------------------------------------------------------------------------------------------------------
# code records

def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def source_hash(source: str) -> str:
    """A short hash of Python ``source``'s syntax tree without docstrings (comments and layout do not count)."""
    tree = _strip_docstrings(ast.parse(source))
    return hashlib.sha256(ast.dump(tree, include_attributes=False).encode()).hexdigest()[:16]


def _module_file(name: str) -> Optional[Path]:
    with contextlib.suppress(ImportError, ValueError, AttributeError):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            return Path(spec.origin)
    return None


def _is_package(name: str) -> bool:
    path = _module_file(name)
    return path is not None and path.name == "__init__.py"


def _package_modules(name: str) -> List[str]:
    """Every module of package ``name`` (its ``__init__`` excluded), recursively."""
    folder = PACKAGE_DIR.joinpath(*name.split(".")[1:])
    return sorted(f"{name}.{'.'.join(p.relative_to(folder).with_suffix('').parts)}"
                  for p in folder.rglob("*.py") if p.name != "__init__.py")


def _imports(name: str, path: Path) -> Set[str]:
    """The ``ftta_core`` modules ``name`` imports (at any level). Package ``__init__`` modules are not followed:
    they are registries that re-export every method (a run depends on the methods it uses, not on all of them)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: List[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            if t.startswith(PACKAGE + ".") and _module_file(t) is not None and not _is_package(t):
                found.add(t)
    return found


@lru_cache(maxsize=None)
def _module_hash(name: str, mtime_ns: int) -> str:
    path = _module_file(name)
    return source_hash(path.read_text())


def module_hash(name: str) -> Optional[str]:
    """The current ``source_hash`` of module ``name`` (None if it no longer exists)."""
    path = _module_file(name)
    if path is None:
        return None
    return _module_hash(name, path.stat().st_mtime_ns)


def dependencies(roots: Iterable[str]) -> List[str]:
    """``roots`` (modules, or packages meaning all their modules) and the ``ftta_core`` modules they import,
    transitively (``_imports``), sorted. The import graph is read once per process and set of roots."""
    return list(_dependencies(tuple(sorted(set(roots)))))


@lru_cache(maxsize=None)
def _dependencies(roots: tuple) -> tuple:
    todo: List[str] = []
    for r in roots:
        todo += _package_modules(r) if _is_package(r) else [r]
    seen: Set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            continue
        seen.add(name)
        todo += sorted(_imports(name, path) - seen)
    return tuple(sorted(seen))


def function_hash(qualified: str) -> Optional[str]:
    """The current hash of a module-level function named ``"package.module:function"`` (None if gone), as a
    definition record holds it."""
    module, _, name = qualified.partition(":")
    return (module_definitions(module) or {}).get(name)


def _bound_names(stmt: ast.stmt) -> List[str]:
    """The names a top-level statement binds (definitions, imports, assignments to names); [] for any other."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        if any(a.name == "*" for a in stmt.names):
            return []
        return [a.asname or a.name.split(".")[0] for a in stmt.names]
    targets = stmt.targets if isinstance(stmt, ast.Assign) else (
        [stmt.target] if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) else [])
    names: List[str] = []
    for target in targets:
        for node in ast.walk(target):
            if isinstance(node, (ast.Attribute, ast.Subscript)):
                return []  # assigns into an object: a statement of the module, not a binding
            if isinstance(node, ast.Name):
                names.append(node.id)
    return names


def _registry_entries(stmt: ast.stmt) -> Optional[Dict[str, str]]:
    """A dict literal with constant keys bound to one name (``NAME = {"a": A, ...}``): its entries as
    ``{"NAME['a']": source}``; None for any other statement."""
    target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else (
        stmt.target if isinstance(stmt, ast.AnnAssign) else None)
    value = getattr(stmt, "value", None)
    if not (isinstance(target, ast.Name) and isinstance(value, ast.Dict) and value.keys
            and all(isinstance(k, ast.Constant) for k in value.keys)):
        return None
    return {f"{target.id}[{k.value!r}]": f"{target.id}[{k.value!r}] = {ast.unparse(v)}"
            for k, v in zip(value.keys, value.values)}


def definition_hashes(source: str) -> Dict[str, str]:
    """``source``'s top-level definitions, each hashed (``source_hash``): functions and classes by name, imports and
    assignments by the names they bind (each imported name on its own; a name bound twice hashes both
    statements), a dict literal with constant keys bound to a name entry by entry (``NAME['key']``), and the
    remaining statements together as ``<module>`` (always present, so a first such statement is a change).
    Docstrings, including bare strings between statements, and ``UNRECORDED_NAMES`` do not count."""
    parts: Dict[str, List[str]] = {MODULE_KEY: []}
    for stmt in ast.parse(source).body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            continue
        entries = _registry_entries(stmt)
        if entries is not None:
            for key, text in entries.items():
                parts.setdefault(key, []).append(text)
            continue
        if isinstance(stmt, (ast.Import, ast.ImportFrom)) and _bound_names(stmt):
            for alias in stmt.names:  # one import per name: importing one more name changes no other
                single = (ast.Import(names=[alias]) if isinstance(stmt, ast.Import) else
                          ast.ImportFrom(module=stmt.module, names=[alias], level=stmt.level))
                parts.setdefault(alias.asname or alias.name.split(".")[0], []).append(ast.unparse(single))
            continue
        names = _bound_names(stmt)
        if names and set(names) <= UNRECORDED_NAMES:
            continue
        for name in names or [MODULE_KEY]:
            parts.setdefault(name, []).append(ast.unparse(stmt))
    return {key: source_hash("\n".join(texts)) for key, texts in parts.items()}


def module_definitions(name: str) -> Optional[Dict[str, str]]:
    """The current ``definition_hashes`` of module ``name`` (None if it no longer exists)."""
    path = _module_file(name)
    if path is None:
        return None
    return dict(_definitions_at(name, path.stat().st_mtime_ns))


@lru_cache(maxsize=None)
def _definitions_at(name: str, mtime_ns: int) -> tuple:
    return tuple(definition_hashes(_module_file(name).read_text()).items())


def code_record_of(roots: Sequence[str], functions: Sequence[str] = ()) -> Dict[str, Any]:
    """The code record of results that depend on the modules ``roots`` (full names; packages mean all their
    modules) and what they import, e.g. FedICON's ``["ftta_core.fedicon", "ftta_core.models"]``, and on the single
    ``functions`` (``"package.module:function"``) of modules that are otherwise reporting code: the
    ``definition_hashes`` of each module (``RECORD_EXEMPT`` left out), plus the git commit when the package is a
    git checkout."""
    definitions: Dict[str, Dict[str, str]] = {}
    for name in dependencies(roots):
        current = module_definitions(name)
        if current is not None and name not in RECORD_EXEMPT:
            skip = UNRECORDED_DEFINITIONS.get(name, frozenset())
            definitions[name] = {key: digest for key, digest in current.items() if key not in skip}
    whole = set(definitions)  # modules recorded whole already hold every single function asked for
    for qualified in functions:
        module, _, function = qualified.partition(":")
        if module not in whole:
            definitions.setdefault(module, {})[function] = function_hash(qualified)
    return {"definitions": definitions, "git": _git_commit()}


def _git_dir() -> Optional[Path]:
    """The checkout's git folder: ``.git``, or the folder a worktree's ``.git`` file points to."""
    dot_git = PACKAGE_DIR.parent / ".git"
    if dot_git.is_file():
        text = dot_git.read_text().strip()
        return Path(text[len("gitdir:"):].strip()) if text.startswith("gitdir:") else None
    return dot_git if dot_git.is_dir() else None


def _git_commit() -> Optional[str]:
    """The commit the checkout is at now (read on every call, a few bytes: a long-lived process, e.g. a notebook
    kernel or a test session, records the commit of each run it stores, not the one it saw first); None outside git."""
    git_dir = _git_dir()
    if git_dir is None:
        return None
    common = git_dir / "commondir"  # a worktree keeps its refs in the main checkout's folder
    refs_dir = (git_dir / common.read_text().strip()).resolve() if common.is_file() else git_dir
    with contextlib.suppress(OSError):
        ref = (git_dir / "HEAD").read_text().strip()
        if ref.startswith("ref: "):
            target = refs_dir / ref[5:]
            if target.exists():
                return target.read_text().strip()
            packed = refs_dir / "packed-refs"
            for line in packed.read_text().splitlines() if packed.exists() else []:
                if line.endswith(" " + ref[5:]):
                    return line.split()[0]
            return None
        return ref
    return None


def stale_modules(record: Optional[Dict[str, Any]]) -> Optional[List[str]]:
    """What a record names that changed since: ``module:definition`` for each recorded definition whose code
    changed or is gone, ``module:name`` for a new top-level name shadowing a builtin, ``module`` for a module gone
    or (whole-module records) changed; None when nothing was recorded."""
    if not record or ("modules" not in record and "definitions" not in record):
        return None
    if "definitions" not in record:  # a record stored before definitions were recorded
        return [name for name, digest in record["modules"].items()
                if (function_hash(name) if ":" in name else module_hash(name)) != digest]
    changed: List[str] = []
    for module, recorded in record["definitions"].items():
        current = module_definitions(module)
        if current is None:
            changed.append(module)
            continue
        for key, digest in recorded.items():
            if key in UNRECORDED_NAMES or key in UNRECORDED_DEFINITIONS.get(module, ()):  # recorded before
                continue  # it was left out
            now = module_hash(module) if key == LEGACY_KEY else current.get(key)
            if now != digest:
                changed.append(module if key == LEGACY_KEY else f"{module}:{key}")
        if MODULE_KEY in recorded:  # a whole module was recorded (not one function, not a legacy hash)
            changed += [f"{module}:{key}" for key in current.keys() - recorded.keys() if hasattr(builtins, key)]
    return changed


def run_status(summary: Dict[str, Any]) -> str:
    """'current', 'stale' (code it depends on changed) or 'unrecorded' (stored before code records existed)."""
    changed = stale_modules(summary.get("code"))
    if changed is None:
        return "unrecorded"
    return "stale" if changed else "current"


def rerun_stale() -> bool:
    """Whether grids should run stale stored runs again (``$FTTA_RERUN_STALE`` set to 1/true/yes)."""
    return os.environ.get(RERUN_STALE_ENV, "").strip().lower() in ("1", "true", "yes")


_WARNED: Set[str] = set()


def read_summary(path: Path | str) -> Dict[str, Any]:
    """A stored summary; a stale one is reported once per process with the modules that changed."""
    path = Path(path)
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise RunStoreError(f"stored run {path} cannot be read ({err}); delete it to run it again") from None
    changed = stale_modules(summary.get("code"))
    if changed and str(path) not in _WARNED:
        _WARNED.add(str(path))
        shown = ", ".join(c.replace(PACKAGE + ".", "") for c in changed[:4]) + (" ..." if len(changed) > 4 else "")
        log.warning("stored run %s was made by code that has changed since (%s); set %s=1 to run it again",
                    path, shown, RERUN_STALE_ENV)
    return summary


def usable(path: Optional[Path]) -> Optional[Path]:
    """``path`` if it holds a stored run a grid may reuse: it exists and is not stale while ``FTTA_RERUN_STALE``
    asks for stale runs to be run again."""
    if path is None or not path.exists():
        return None
    if rerun_stale() and run_status(read_summary(path)) == "stale":
        return None
    return path


# ---------------------------------------------------------------------------------------------------------------
# every stored run under a folder

@dataclass(frozen=True)
class StoredEntry:
    """One stored run found by ``scan``: where, which layout, its config (None for studies with their own
    records), and its status (``run_status``, or 'unfinished' / 'unreadable')."""

    path: Path
    layout: str  # "summary-file", "run-folder" or "record" (a study's own JSON record, e.g. FedICON's)
    config: Optional[Dict[str, Any]]
    status: str


def scan(root: Path | str) -> Iterator[StoredEntry]:
    """Every stored run under ``root``: run folders (a ``summary.json``, or a ``checkpoint.pt`` when unfinished)
    and JSON summary/record files; each with its status. Reads every layout committed under ``figures/``."""
    root = Path(root)
    folders = {p.parent for p in root.rglob("summary.json")} | {p.parent for p in root.rglob("checkpoint.pt")}
    for folder in sorted(folders):
        summary_path = folder / "summary.json"
        if not summary_path.exists():
            yield StoredEntry(folder, "run-folder", None, "unfinished")
            continue
        yield _entry(summary_path, "run-folder", folder)
    for path in sorted(root.rglob("*.json")):
        if path.name == "summary.json" or path.parent in folders or path.name.startswith("."):
            continue
        yield _entry(path, None, path)


def _entry(path: Path, layout: Optional[str], where: Path) -> StoredEntry:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return StoredEntry(where, layout or "summary-file", None, "unreadable")
    if not isinstance(data, dict):
        return StoredEntry(where, layout or "record", None, "unreadable")
    config = data.get("config") if isinstance(data.get("config"), dict) else None
    kind = layout or ("summary-file" if config is not None and "accuracy" in data else "record")
    return StoredEntry(where, kind, config, run_status(data))


def scan_table(roots: Sequence[Path | str]):
    """``scan`` of several folders as a DataFrame (path, layout, status, local, strategy, seed)."""
    import pandas as pd

    rows = [{"path": str(e.path), "layout": e.layout, "status": e.status,
             "local": (e.config or {}).get("local"), "strategy": (e.config or {}).get("strategy"),
             "seed": (e.config or {}).get("seed")} for root in roots for e in scan(root)]
    return pd.DataFrame(rows, columns=["path", "layout", "status", "local", "strategy", "seed"])
