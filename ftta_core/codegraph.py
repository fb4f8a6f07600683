"""The package's code as data: a hash per top-level definition of a module (``definition_hashes``: syntax tree
without docstrings, so comments, docstrings and layout do not count) and the modules a set of roots imports,
transitively (``dependencies``). Read from the source files; nothing is imported. ``units`` builds semantic units on
these, ``runstore`` reads records written with them."""
from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Optional, Set

PACKAGE = "ftta_core"
PACKAGE_DIR = Path(__file__).resolve().parent
MODULE_KEY = "<module>"  # the key of a module's top-level statements that are not definitions
# names never recorded: ``__all__`` only decides what ``from m import *`` binds, and the package has no star import
# (tests/test_code_records.py checks it), so listing a new function there changes no run
UNRECORDED_NAMES = frozenset({"__all__"})
# registries whose imports are not followed: they import every loader, and a run records the one it used
UNFOLLOWED = frozenset({f"{PACKAGE}.data.registry"})


def module_path(module: str) -> Optional[Path]:
    """The source file of package module ``module`` (``ftta_core.x.y`` or ``x.y``), None when there is none. Read
    from the file system: nothing is imported."""
    short = module[len(PACKAGE) + 1:] if module.startswith(PACKAGE + ".") else module
    parts = short.split(".")
    for path in (PACKAGE_DIR.joinpath(*parts).with_suffix(".py"), PACKAGE_DIR.joinpath(*parts, "__init__.py")):
        if path.is_file():
            return path
    return None


def is_type_checking_block(stmt: ast.stmt) -> bool:
    """Whether a top-level statement is ``if TYPE_CHECKING:`` (imports for annotations only: nothing runs)."""
    test = getattr(stmt, "test", None)
    return isinstance(stmt, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


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
    """The ``ftta_core`` modules ``name`` imports (at any level), except under ``if TYPE_CHECKING:`` (annotations
    only: nothing runs). Package ``__init__`` modules and ``UNFOLLOWED`` registries are not followed: they import
    every method or loader, and a run depends on the ones it uses (``build.code_record`` adds them)."""
    if name in UNFOLLOWED:
        return set()
    return set(_file_imports(name, path, path.stat().st_mtime_ns))


@lru_cache(maxsize=None)
def _file_imports(name: str, path: Path, mtime_ns: int) -> FrozenSet[str]:
    """``_imports`` of the file as it is at ``mtime_ns`` (parsed once per process and version of the file)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    skipped = {id(n) for s in tree.body if is_type_checking_block(s) for n in ast.walk(s)}
    found: Set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
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
            if not t.startswith(PACKAGE + "."):
                continue
            found_path = module_path(t)
            if found_path is not None and found_path.name != "__init__.py":
                found.add(t)
    return frozenset(found)


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
