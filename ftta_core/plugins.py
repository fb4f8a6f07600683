"""Plugins: modules that register local methods and strategies of your own when imported.

A plugin is any module whose import runs ``@register_local("name")`` / ``@register_strategy("name")`` (see
``ftta_core.registry``). ``load_plugins`` imports them from three places, each at most once per process:

1. the entry-point group ``ftta.plugins`` of installed distributions (``[project.entry-points."ftta.plugins"]`` in a
   package's ``pyproject.toml``): an entry point's object is a module (imported) or a callable (called, no arguments);
2. ``specs`` given to it (the command line's ``--plugin MODULE_OR_FILE``, repeatable);
3. ``$FTTA_PLUGINS``: specs separated by ``os.pathsep`` (``:`` on Linux and macOS, ``;`` on Windows).

A spec is an importable module name (``mylab.methods``) or the path of a ``.py`` file. ``export_plugins`` adds specs
to ``$FTTA_PLUGINS`` (file paths made absolute) so that child processes -- ``run-plan``'s spawned workers, papermill's
notebook kernels -- load the same plugins: they call ``load_plugins()`` (``plan_runner._init_worker``, ``ExperimentConfig``,
``build_local``/``build_strategy`` for a name they do not know).

Importing this module is cheap (no torch): the command line's parser uses it.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

PLUGINS_ENV = "FTTA_PLUGINS"
ENTRY_POINT_GROUP = "ftta.plugins"
PLUGIN_HINT = (f"a method of your own must be registered by a plugin loaded with --plugin MODULE_OR_FILE, "
               f"${PLUGINS_ENV} or an '{ENTRY_POINT_GROUP}' entry point")

_LOADED: Dict[str, Any] = {}          # key (module name, absolute file, or entry point) -> what it loaded
_SCANNED_PATH: Optional[Tuple[str, ...]] = None  # sys.path when the entry points were last read (None: never)


class PluginError(ValueError):
    """A plugin could not be loaded; the message is one line naming it (the command line prints just that)."""


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}".rstrip(": ")


def is_file_spec(spec: str) -> bool:
    """Whether ``spec`` names a ``.py`` file (else a module name)."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec or (os.altsep or "/") in spec


def normalize_spec(spec: str) -> str:
    """A file spec as an absolute path (child processes may run elsewhere, e.g. notebook kernels in notebooks/);
    a module name stripped."""
    spec = spec.strip()
    return str(Path(spec).expanduser().resolve()) if is_file_spec(spec) else spec


def parse_specs(value: Optional[str]) -> List[str]:
    """The specs of an ``$FTTA_PLUGINS``-style value (``os.pathsep``-separated; empty entries ignored)."""
    return [s.strip() for s in (value or "").split(os.pathsep) if s.strip()]


def _file_module_name(path: Path) -> str:
    """A module name for a plugin file, fixed by its absolute path (so a re-import is recognised as the same)."""
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    return f"ftta_plugin_{stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"


def _import_file(path: Path, where: str) -> Any:
    if not path.is_file():
        raise PluginError(f"plugin {str(path)!r} ({where}): no such file")
    name = _file_module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin {str(path)!r} ({where}): not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses, pickling and typing look the module up while it executes
    try:
        spec.loader.exec_module(module)
    except BaseException as err:
        sys.modules.pop(name, None)
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        raise PluginError(f"plugin {str(path)!r} ({where}) failed to import: {_one_line(err)}") from err
    return module


def _import_module(name: str, where: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as err:
        hint = " (not importable from here: install it, put it on PYTHONPATH, or give the path of its .py file)" \
            if isinstance(err, ModuleNotFoundError) and err.name == name.split(".")[0] else ""
        raise PluginError(f"plugin {name!r} ({where}) failed to import: {_one_line(err)}{hint}") from err


def _load_spec(spec: str, where: str) -> None:
    key = normalize_spec(spec)
    if not key or key in _LOADED:
        return
    _LOADED[key] = _import_file(Path(key), where) if is_file_spec(key) else _import_module(key, where)


def _entry_points() -> Iterable[Any]:
    from importlib.metadata import entry_points

    return entry_points(group=ENTRY_POINT_GROUP)


def _load_entry_points() -> None:
    """Load the ``ftta.plugins`` entry points; the distributions are read again only when ``sys.path`` changed."""
    global _SCANNED_PATH
    path = tuple(sys.path)
    if _SCANNED_PATH == path:
        return
    for ep in _entry_points():
        key = f"entry point {ep.name} = {ep.value}"
        if key in _LOADED:
            continue
        dist = getattr(getattr(ep, "dist", None), "name", None)
        where = f"entry point {ep.name!r} = {ep.value!r} in group {ENTRY_POINT_GROUP!r}" + \
            (f" of distribution {dist!r}" if dist else "")
        try:
            obj = ep.load()
            if callable(obj):  # a module is imported by ep.load(); a function registers when called
                obj()
        except Exception as err:
            raise PluginError(f"plugin {where} failed to load: {_one_line(err)}") from err
        _LOADED[key] = obj
    _SCANNED_PATH = path


def load_plugins(specs: Optional[Sequence[str]] = None) -> List[str]:
    """Import the plugins of the ``ftta.plugins`` entry points, of ``specs`` (module names or ``.py`` paths) and of
    ``$FTTA_PLUGINS``; each is imported once per process, so calling this again is cheap. A plugin that fails
    raises ``PluginError`` (a ``ValueError``) with one line naming it. Returns the keys of every plugin loaded so
    far (module names, absolute file paths, entry points)."""
    if isinstance(specs, str):
        specs = [specs]
    _load_entry_points()
    for spec in specs or ():
        _load_spec(spec, "--plugin")
    for spec in parse_specs(os.environ.get(PLUGINS_ENV)):
        _load_spec(spec, f"${PLUGINS_ENV}")
    return list(_LOADED)


def loaded_plugins() -> List[str]:
    """The keys of the plugins loaded in this process (see ``load_plugins``)."""
    return list(_LOADED)


def export_plugins(specs: Sequence[str]) -> str:
    """Add ``specs`` to ``$FTTA_PLUGINS`` (file paths made absolute, no duplicates) so that child processes load
    them too; returns the new value."""
    current: List[str] = []
    for spec in [*parse_specs(os.environ.get(PLUGINS_ENV)), *([specs] if isinstance(specs, str) else specs)]:
        key = normalize_spec(spec)
        if key and key not in current:
            current.append(key)
    value = os.pathsep.join(current)
    os.environ[PLUGINS_ENV] = value
    return value


def use_plugins(specs: Optional[Sequence[str]]) -> List[str]:
    """The command line's ``--plugin``: load ``specs`` (and the entry points and ``$FTTA_PLUGINS``), then export
    them to ``$FTTA_PLUGINS`` for child processes. Returns the keys of the loaded plugins."""
    loaded = load_plugins(specs)
    if specs:
        export_plugins(specs)
    return loaded


def add_plugin_argument(parser: Any) -> None:
    """Add ``--plugin MODULE_OR_FILE`` (repeatable) to an ``argparse`` (sub-)parser."""
    parser.add_argument("--plugin", action="append", metavar="MODULE_OR_FILE",
                        help="load local methods/strategies registered by a plugin: an importable module or a .py "
                             f"file (repeatable; child processes get it through ${PLUGINS_ENV}; installed "
                             f"'{ENTRY_POINT_GROUP}' entry points load too)")
