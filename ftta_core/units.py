"""Semantic units: what a stored result *means*, versioned, and the implementations certified to compute it.

A stored run records the **units** that made its numbers, each at a **version** (``{"ts_block": 1, "client_conv":
1, "tta.tent": 1, ...}``), plus the source checkpoint's digest, instead of the text of every definition it reached.
A unit is a named piece of result-defining code: a kernel (``client_conv``: the per-client convolution), a method
(``tta.basic``: BN-adapt, Tent, ...; ``strategies.fedtsa``), the stream and scenario builders, a data loader, a
model. Its **implementation** is the code that computes it today, hashed from the syntax tree of its member
definitions (``implementation_hash``; comments, docstrings, imports and ``TYPE_CHECKING`` blocks do not count).

``ftta_core/units.lock.json`` (committed) holds, for every unit, its version and the implementations certified to
compute it. An implementation is certified by running the unit's **oracle tests** (``Unit.oracles``: float64, short
streams, both client-bank backends, against the loop bank, a frozen copy of the previous implementation, or the
float64 outputs the certified implementation gave, ``tests/golden/``) and adding its hash to the lock:
``python -m ftta_core units certify NAME``, which refuses when an oracle fails. Then:

- a **certified** new implementation (a faster kernel, a refactor, code moved to another module) keeps every stored
  run current: a run is current while every unit it recorded is at the version it recorded;
- an implementation that is **not certified** fails ``tests/test_units.py`` (and the runs that use the unit show as
  ``uncertified`` in ``python -m ftta_core runs``) until it is certified, or its version is bumped;
- a **version bump** (``python -m ftta_core units bump NAME``: a change of meaning, e.g. a fixed bug) turns exactly
  the stored runs that recorded the unit stale.

The implementation hash of each unit is kept in the record as information (``implementation``), with the git commit.

Why this shape (and not another tool's): Dagster's ``code_version`` is the same idea (a declared version decides
staleness, not the code's text) but leaves "is this change semantic?" to the author's judgement; DVC hashes the
code it runs (what ``runstore``'s definition records did, which froze every kernel); pytest-regressions'
``ndarrays_regression`` is the oracle half (numbers a certified implementation gave, compared with a tolerance). We
combine the two: a declared version per unit, and a committed lock of implementation hashes that only a passing
float64 oracle can extend, so "same meaning" is checked by a test rather than asserted.

Which code belongs to which unit: ``UNITS`` names the units whose members are not simply one module; every other
module of the package is a unit of its own, named by its path without ``ftta_core.`` (``tta.eata``). A definition
in ``NON_SEMANTIC`` (error help, progress, the record keeping itself) belongs to no unit. Moving code keeps its
unit: update the member list here (a unit's name and version do not change), certify, and every run stays current.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from .codegraph import definition_hashes, dependencies, is_type_checking_block, module_path
from .project import LIBRARY_CHECKOUT

PACKAGE = "ftta_core"
PACKAGE_DIR = Path(__file__).resolve().parent
LOCK_PATH = PACKAGE_DIR / "units.lock.json"
LOCK_ENV = "FTTA_UNITS_LOCK"  # another lock file (tests)
LOCK_FORMAT = 1

# the oracles every unit of the client-bank engine shares: float64 golden runs of every local method and strategy on
# both backends (tests/golden/runs), and the float32 backend-agreement contract
ENGINE_ORACLES = ("tests/test_oracle_runs.py", "tests/test_engine_backends.py")


@dataclass(frozen=True)
class Unit:
    """A named result-defining piece of code: its members (``"module"`` for every definition of a module,
    ``"module:name"`` for one; module paths relative to the package) and its oracle tests (pytest node ids)."""

    name: str
    members: Tuple[str, ...]
    oracles: Tuple[str, ...] = ENGINE_ORACLES
    doc: str = ""


def _unit(name: str, members: Sequence[str], oracles: Sequence[str] = ENGINE_ORACLES, doc: str = "") -> Unit:
    return Unit(name, tuple(members), tuple(oracles), doc)


_CORRUPTION_MODULES = ("corruptions._color", "corruptions._filters", "corruptions._resample", "corruptions._spec",
                       "corruptions.blur", "corruptions.digital", "corruptions.noise", "corruptions.registry",
                       "corruptions.weather")
_RUN_FUNCTIONS = ("run_experiment", "_run", "run_strategies", "summarize", "accuracy_by")

# units that are not exactly one module (every other module is a unit named by its path)
UNITS: Dict[str, Unit] = {u.name: u for u in (
    _unit("client_conv", ["engine.layers:ClientConv2d", "engine.layers:PER_CLIENT_CONV", "engine.client_conv"],
          ENGINE_ORACLES + ("tests/test_engine.py", "tests/test_oracle_client_conv.py"),
          "the per-client convolution of the vectorized bank"),
    _unit("client_layers", ["engine.layers"], ENGINE_ORACLES + ("tests/test_engine.py",),
          "per-client BatchNorm and linear layers of the vectorized bank"),
    _unit("ts_block", ["strategies.ts_block"],
          ENGINE_ORACLES + ("tests/test_fedtsa.py", "tests/test_oracle_ts_block.py"),
          "FedTSA's TS-Block and its augmentation masks"),
    _unit("strategies.fedtsa", ["strategies.fedtsa", "strategies.fedtsa_compiled"],
          ENGINE_ORACLES + ("tests/test_fedtsa.py", "tests/test_oracle_ts_block.py"), "FedTSA's server rounds"),
    _unit("engine.mixing", ["engine.mixing"], ENGINE_ORACLES + ("tests/test_oracle_tent_step.py",),
          "the mixing kernel theta_i <- sum_j W_ij theta_j"),
    _unit("engine.bank", ["engine.bank"], ENGINE_ORACLES + ("tests/test_engine.py", "tests/test_oracle_tent_step.py"),
          "the client banks (loop: the specification; vectorized) and their optimisers"),
    _unit("bn_running", ["tta.running"], ENGINE_ORACLES + ("tests/test_running_bn.py",),
          "BN running statistics updated while adapting (the authors' TTA-grad clients)"),
    _unit("cifar10c_corruptions", _CORRUPTION_MODULES, ("tests/test_corruptions.py",),
          "the 15 CIFAR-10-C corruptions x 5 severities, seeded per image"),
    _unit("stream", ["stream"], ("tests/test_stream.py", "tests/test_stream_cache.py"),
          "clients' batches from a scenario and corrupted domains"),
    _unit("scenarios", ["scenarios"], ("tests/test_scenarios.py",), "which domain each client sees when"),
    _unit("rng", ["rng"], ("tests/test_stream.py", "tests/test_scenarios.py") + ENGINE_ORACLES,
          "derived seeds and generators"),
    _unit("run_summary", [f"experiment:{f}" for f in _RUN_FUNCTIONS],
          ("tests/test_workbook.py", "tests/test_runstore.py", "tests/test_build_run.py"),
          "a run's loop over the stream and its summary numbers"),
    _unit("run_builder", ["build"], ("tests/test_build_run.py",) + ENGINE_ORACLES,
          "assembles stream, methods, engine and recorder from a config"),
    _unit("source_models", ["training"], ("tests/test_models.py",),
          "source-model recipes and loading (the checkpoints are recorded by digest)"),
)}

# definitions that belong to no unit: they compute no number of any run (error help, progress display, writing and
# describing checkpoints, a study's own record keeping); ``tests/test_units.py`` checks that no run calls the
# functions among them
NON_SEMANTIC: Dict[str, frozenset] = {
    "data.cifar": frozenset({"CIFAR10_HOW_TO_GET", "CIFAR100_HOW_TO_GET"}),
    "data.digits": frozenset({"DIGITS_HOW_TO_GET"}),
    "data.office": frozenset({"OFFICE_HOW_TO_GET"}),
    "data.root": frozenset({"_missing_phrase", "describe_root_choice"}),
    "training": frozenset({"save_checkpoint", "source_card", "render_cards", "source_model_line",
                           "_train_images", "atomic_write"}),
    "fedicon.study": frozenset({"CODE_ROOTS", "record_scope", "is_record"}),
    "fedtsa.ft_forward": frozenset({"record_scope", "is_record", "RECORDED", "MODULE"}),
    "leakage": frozenset({"record_scope", "is_record", "RECORDED"}),
    "build": frozenset({"code_record", "RUN_ROOTS", "RUN_FUNCTIONS"}),
    "data.registry": frozenset({"loader_module"}),
}
# whole modules that belong to no unit: the record keeping itself, progress display, loading plugins (a plugin's
# methods are recorded by their own modules when they live in the package), the project's folders
NON_SEMANTIC_MODULES = frozenset({"runstore", "record_migration", "units", "codegraph", "progress", "plugins",
                                  "project", "allocator"})
# names never part of a unit: they only tell tools what to export or check
NON_SEMANTIC_NAMES = frozenset({"__all__", "annotations", "TYPE_CHECKING", "log"})


class UnitError(RuntimeError):
    """The unit table or lock does not fit the code (a member that does not exist, a module that cannot be read):
    a mistake to fix, never a stale run."""


class CodeChangedError(RuntimeError):
    """A module this process runs changed on disk after the process imported it: a record made now would name the
    code on disk, not the code that runs (``changed_on_disk``)."""


# ---------------------------------------------------------------------------------------------------------------
# which definitions a module has and to which unit each belongs

def _full(module: str) -> str:
    return module if module == PACKAGE or module.startswith(PACKAGE + ".") else f"{PACKAGE}.{module}"


def _short(module: str) -> str:
    return module[len(PACKAGE) + 1:] if module.startswith(PACKAGE + ".") else module


def semantic_source(source: str) -> str:
    """``source`` without what cannot change a number: imports (what they import is its own unit), ``if
    TYPE_CHECKING:`` blocks, docstrings (``runstore.definition_hashes`` drops those, and comments and layout)."""
    tree = ast.parse(source)
    tree.body = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))
                 and not is_type_checking_block(s)]
    return ast.unparse(tree)


DEFINITIONS_CACHE = "definitions"  # under cache_dir(): one JSON file per module source (``source_definitions``)


def source_definitions(text: str) -> Dict[str, str]:
    """``definition_hashes(semantic_source(text))``, kept on disk under ``cache_dir()/definitions`` by the digest of
    ``text`` and of the code that hashes it (``_hasher_digest``): parsing the ~50 modules a run records costs
    ~1.2 s in every new process otherwise (before a CLI run's first step). An entry is only ever read for the very
    source and hashing code that wrote it; one that cannot be read is recomputed."""
    from .data.root import cache_dir

    key = hashlib.sha256(_hasher_digest().encode() + text.encode()).hexdigest()[:32]
    path = cache_dir() / DEFINITIONS_CACHE / f"{key}.json"
    try:
        cached = json.loads(path.read_text())
        if isinstance(cached, dict):
            return cached
    except (OSError, ValueError):
        pass
    hashes = definition_hashes(semantic_source(text))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{key}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(hashes, sort_keys=True))
        os.replace(tmp, path)  # atomic: a reader sees a whole entry or none
    except OSError:
        pass
    return hashes


@lru_cache(maxsize=1)
def _hasher_digest() -> str:
    """A digest of the code that turns a module's source into definition hashes (``codegraph.py``, this module):
    changing it starts a new cache."""
    from . import codegraph

    h = hashlib.sha256()
    for path in (Path(codegraph.__file__), Path(__file__)):
        h.update(path.read_bytes())
    return h.hexdigest()


@lru_cache(maxsize=None)
def _definitions_at(module: str, mtime_ns: int) -> Tuple[Tuple[str, str], ...]:
    path = module_path(module)
    try:
        hashes = source_definitions(path.read_text())
    except (OSError, SyntaxError, ValueError) as err:
        raise UnitError(f"module {_full(module)} cannot be read ({type(err).__name__}: {err}); fix it before "
                        "reading or making runs") from None
    skip = NON_SEMANTIC.get(_short(module), frozenset()) | NON_SEMANTIC_NAMES
    return tuple(sorted((k, v) for k, v in hashes.items() if k not in skip and not (k == "<module>" and v == _EMPTY)))


_EMPTY = hashlib.sha256(ast.dump(ast.Module(body=[], type_ignores=[]), include_attributes=False).encode()
                        ).hexdigest()[:16]


def semantic_definitions(module: str) -> Dict[str, str]:
    """The result-defining definitions of ``module`` with their hashes (``runstore.definition_hashes`` of its
    ``semantic_source``, ``NON_SEMANTIC`` left out); raises ``UnitError`` when the module is missing or unreadable."""
    if _short(module).split(".")[0] in NON_SEMANTIC_MODULES or _short(module) in NON_SEMANTIC_MODULES:
        return {}
    path = module_path(module)
    if path is None:
        raise UnitError(f"module {_full(module)} does not exist (a unit or a run names it): update ftta_core/units.py")
    return dict(_definitions_at(_short(module), path.stat().st_mtime_ns))


@lru_cache(maxsize=1)
def _member_index() -> Tuple[Dict[str, str], Dict[str, str]]:
    whole: Dict[str, str] = {}
    single: Dict[str, str] = {}
    for unit in UNITS.values():
        for member in unit.members:
            module, _, name = member.partition(":")
            target = single if name else whole
            key = member if name else module
            if key in target:
                raise UnitError(f"{member} is a member of two units: {target[key]} and {unit.name}")
            target[key] = unit.name
    return whole, single


def unit_of(module: str, name: str) -> Optional[str]:
    """The unit that definition ``name`` of ``module`` belongs to (None for ``NON_SEMANTIC`` ones): its ``UNITS``
    entry by name, else its module's, else the module's own unit (named by its short path)."""
    module = _short(module)
    if module in NON_SEMANTIC_MODULES or name in NON_SEMANTIC_NAMES or name in NON_SEMANTIC.get(module, ()):
        return None
    whole, single = _member_index()
    return single.get(f"{module}:{name}") or whole.get(module) or module


def units_of_module(module: str, names: Optional[Iterable[str]] = None) -> Set[str]:
    """The units of ``module``'s definitions (all of them, or ``names``)."""
    defs = semantic_definitions(module)
    return {u for n in (defs if names is None else names) if (u := unit_of(module, n)) is not None}


def unit_members(unit: str) -> Dict[str, str]:
    """``{"module:name": hash}`` of every definition that belongs to ``unit`` today."""
    modules: Set[str] = set()
    spec = UNITS.get(unit)
    if spec is not None:
        for member in spec.members:
            module = member.partition(":")[0]
            if module_path(module) is None:
                raise UnitError(f"unit {unit} names {member}, whose module does not exist: update ftta_core/units.py")
            modules.add(module)
    elif module_path(unit) is not None:
        modules.add(unit)
    else:
        raise UnitError(f"no unit named {unit!r} (not in ftta_core/units.py UNITS, and no module of that name)")
    out: Dict[str, str] = {}
    for module in sorted(modules):
        for name, digest in semantic_definitions(module).items():
            if unit_of(module, name) == unit:
                out[f"{module}:{name}"] = digest
    if spec is not None:
        missing = [m for m in spec.members if ":" in m and m not in out]
        if missing:
            raise UnitError(f"unit {unit} names {', '.join(missing)}, which no longer exist: update ftta_core/units.py")
    return out


def implementation_hash(unit: str) -> str:
    """A short hash of ``unit``'s implementation today (its members' definition hashes)."""
    text = json.dumps(unit_members(unit), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def oracles_of(unit: str) -> Tuple[str, ...]:
    """The oracle tests of ``unit``: its ``UNITS`` entry's, else the engine's (golden runs, backend contract) and
    the test file named after its module when there is one."""
    spec = UNITS.get(unit)
    if spec is not None:
        return spec.oracles
    own = LIBRARY_CHECKOUT / "tests" / f"test_{unit.rsplit('.', 1)[-1]}.py"
    return ENGINE_ORACLES + ((f"tests/{own.name}",) if own.is_file() else ())


# what stored results can record: the modules of runs (``build.code_record``: engine, stream, methods, loaders,
# models), of FedICON's results (``fedicon.study.CODE_ROOTS``) and the computing definitions of a leakage table and a
# FedAvg+FT reading. Their units are the ones the lock holds (``tests/test_units.py`` checks that every record the
# package can write names only these); every other module is reporting code, free to change without certifying.
RECORDED_ROOTS = ("build", "loop", "engine", "stream", "scenarios", "training", "rng", "corruptions", "data",
                  "models", "tta", "strategies", "fedicon.study")
RECORDED_DEFINITIONS = tuple(f"experiment:{f}" for f in _RUN_FUNCTIONS) + (
    "leakage:UPLOAD_KINDS", "leakage:CollectedUploads", "leakage:collect_uploads", "leakage:guess_accuracy",
    "leakage:leakage_table", "fedtsa.ft_forward:READING", "fedtsa.ft_forward:AdaptOutputs",
    "fedtsa.ft_forward:ft_forward_run")


def every_unit() -> List[str]:
    """Every unit a stored result can record (``RECORDED_ROOTS``, ``RECORDED_DEFINITIONS``), sorted."""
    found: Set[str] = set()
    for module in dependencies([_full(r) for r in RECORDED_ROOTS]):
        found |= units_of_module(module)
    for qualified in RECORDED_DEFINITIONS:
        module, _, name = qualified.partition(":")
        found |= units_of_module(module, [name])
    return sorted(found)


# ---------------------------------------------------------------------------------------------------------------
# the lock: versions and certified implementations

def lock_path() -> Path:
    return Path(os.environ.get(LOCK_ENV) or LOCK_PATH)


@lru_cache(maxsize=8)
def _read_lock(path: str, mtime_ns: int) -> Dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise UnitError(f"unit lock {path} cannot be read ({err})") from None
    if data.get("format") != LOCK_FORMAT or not isinstance(data.get("units"), dict):
        raise UnitError(f"unit lock {path}: expected format {LOCK_FORMAT} with a 'units' table")
    return data


def read_lock(path: Optional[Path] = None) -> Dict[str, Any]:
    """The lock: ``{"format": 1, "units": {name: {"version": int, "certified": [hash, ...]}}, "aliases": {}}``
    (``aliases``: a renamed unit's former name -> its name)."""
    path = Path(path or lock_path())
    if not path.exists():
        return {"format": LOCK_FORMAT, "units": {}, "aliases": {}}
    return _read_lock(str(path), path.stat().st_mtime_ns)


def write_lock(lock: Mapping[str, Any], path: Optional[Path] = None) -> None:
    """Write the lock (sorted, one unit per line: a readable diff)."""
    from .data.cache import atomic_write

    path = Path(path or lock_path())
    units = lock["units"]
    lines = [f"  {json.dumps(name)}: {json.dumps(units[name], sort_keys=True)}" for name in sorted(units)]
    aliases = json.dumps(dict(sorted(lock.get("aliases", {}).items())))
    text = ("{\n" f'  "format": {LOCK_FORMAT},\n  "aliases": {aliases},\n  "units": {{\n'
            + ",\n".join("  " + line for line in lines) + "\n  }\n}\n")
    atomic_write(path, lambda fh: fh.write(text.encode()))


def _resolve(unit: str, lock: Mapping[str, Any]) -> str:
    seen = set()
    while unit in lock.get("aliases", {}) and unit not in seen:
        seen.add(unit)
        unit = lock["aliases"][unit]
    return unit


def version_of(unit: str, lock: Optional[Mapping[str, Any]] = None) -> Optional[int]:
    """The version of ``unit`` in the lock (None when the lock does not know it)."""
    lock = lock or read_lock()
    entry = lock["units"].get(_resolve(unit, lock))
    return None if entry is None else int(entry["version"])


def recorded_version(unit: str, lock: Optional[Mapping[str, Any]] = None) -> Optional[int]:
    """The version a record made today gives ``unit``: its version in the lock, or 1 for a unit the lock does not
    know yet but the code defines (a new unit: what certifying it gives; until then its records read uncertified,
    not stale); None for a unit that is gone from the code."""
    lock = lock or read_lock()
    version = version_of(unit, lock)
    if version is not None:
        return version
    name = _resolve(unit, lock)
    return 1 if name in UNITS or module_path(name) is not None else None


def is_certified(unit: str, lock: Optional[Mapping[str, Any]] = None) -> bool:
    """Whether ``unit``'s implementation today is certified at its version."""
    lock = lock or read_lock()
    entry = lock["units"].get(_resolve(unit, lock))
    return entry is not None and implementation_hash(unit) in entry.get("certified", [])


def uncertified(units: Optional[Iterable[str]] = None) -> List[str]:
    """The units (all of them, or ``units``) whose implementation today is not certified in the lock."""
    lock = read_lock()
    return [u for u in sorted(units if units is not None else every_unit()) if not is_certified(u, lock)]


def run_oracles(names: Sequence[str], python: str = sys.executable) -> subprocess.CompletedProcess:
    """Run the oracle tests of the units ``names`` (each test file once) with pytest, in a subprocess in the
    repository, and return the result."""
    tests: List[str] = []
    for unit in names:
        tests += [t for t in oracles_of(unit) if (LIBRARY_CHECKOUT / t.split("::")[0]).exists() and t not in tests]
    if not tests:
        raise UnitError(f"units {', '.join(names)} have no oracle test in this checkout")
    env = {**os.environ, "FTTA_SMOKE": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=LIBRARY_CHECKOUT,
                          env=env, capture_output=True, text=True)


def certify(units: Sequence[str], oracle=run_oracles, path: Optional[Path] = None) -> Dict[str, str]:
    """Certify today's implementation of each of ``units``: run their oracles together (``oracle(names)``, one
    pytest run by default) and, when they pass, add each implementation hash to the lock (a unit new to the lock
    starts at version 1). Raises ``UnitError`` naming the units and the failing output when an oracle fails (the
    lock is then unchanged). Returns ``{unit: hash}`` of what it added."""
    lock = json.loads(json.dumps(read_lock(path)))
    todo = {}
    for unit in units:
        name = _resolve(unit, lock)
        digest = implementation_hash(name)
        if digest not in lock["units"].get(name, {}).get("certified", []):
            todo[name] = digest
    if not todo:
        return {}
    result = oracle(sorted(todo))
    if getattr(result, "returncode", 1) != 0:
        tail = "\n".join(((result.stdout or "") + (result.stderr or "")).strip().splitlines()[-15:])
        raise UnitError(f"units {', '.join(sorted(todo))}: their oracle tests fail, so today's implementations are "
                        f"not certified:\n{tail}")
    for name, digest in todo.items():
        entry = lock["units"].setdefault(name, {"version": 1, "certified": []})
        entry["certified"] = entry["certified"] + [digest]
    write_lock(lock, path)
    return todo


def bump(unit: str, path: Optional[Path] = None) -> int:
    """A change of meaning: ``unit``'s version + 1 with today's implementation as its only certified one. Every
    stored run that recorded the unit turns stale. Returns the new version."""
    lock = json.loads(json.dumps(read_lock(path)))
    name = _resolve(unit, lock)
    entry = lock["units"].get(name, {"version": 0})
    lock["units"][name] = {"version": int(entry["version"]) + 1, "certified": [implementation_hash(name)]}
    write_lock(lock, path)
    return lock["units"][name]["version"]


# ---------------------------------------------------------------------------------------------------------------
# records

@lru_cache(maxsize=64)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def file_digest(path: Path | str) -> Optional[str]:
    """A short sha256 of a file's bytes (None when it does not exist)."""
    path = Path(path)
    if not path.is_file():
        return None
    st = path.stat()
    return _file_digest(str(path), st.st_mtime_ns, st.st_size)


def checkpoint_input(name: str) -> Dict[str, str]:
    """The record entry of source checkpoint ``name``: ``{"checkpoint:NAME": digest}`` (empty if it is missing)."""
    from .training import CHECKPOINT_DIR

    digest = file_digest(CHECKPOINT_DIR / f"{name}.pt")
    return {} if digest is None else {f"checkpoint:{name}": digest}


def input_digest(key: str) -> Optional[str]:
    """Today's digest of a recorded input (``checkpoint:NAME``)."""
    kind, _, name = key.partition(":")
    if kind == "checkpoint":
        return checkpoint_input(name).get(key)
    raise UnitError(f"unknown input kind {kind!r} in a record ({key})")


def changed_on_disk(modules: Iterable[str]) -> List[str]:
    """The files of ``modules`` that this process has imported and that changed on disk since the package was
    imported (``project.IMPORTED_AT_NS``, before any of its other modules): the code running may not be the code on
    disk. Conservative: a module first imported after such a change is listed too."""
    from . import project

    changed = []
    for module in modules:
        loaded = sys.modules.get(_full(module))
        path = getattr(loaded, "__file__", None)
        try:
            if path and os.stat(path).st_mtime_ns > project.IMPORTED_AT_NS:
                changed.append(os.path.relpath(path, PACKAGE_DIR.parent))
        except OSError:
            changed.append(str(path))
    return sorted(set(changed))


def record_for(modules: Iterable[str], definitions: Iterable[str] = (), inputs: Optional[Mapping[str, str]] = None,
               git: Optional[str] = None) -> Dict[str, Any]:
    """The code record of a result that used ``modules`` (every definition) and ``definitions``
    (``"module:name"``): its units at their versions, their implementation hashes, and ``inputs`` (e.g.
    ``checkpoint_input``). A unit the lock does not know is recorded at version 1 (what certifying it gives).
    Raises ``CodeChangedError`` when a module with a unit changed on disk after this process imported it: the
    hashes are read from the files, and the record must name the code that runs."""
    modules = list(modules)
    definitions = list(definitions)
    semantic = [m for m in modules + [d.partition(":")[0] for d in definitions] if units_of_module(m)]
    changed = changed_on_disk(semantic)
    if changed:
        raise CodeChangedError(f"{', '.join(changed)} changed on disk after this process imported ftta_core: a "
                               "record made now would name code this process does not run; start a new process "
                               "(restart the kernel) to record runs")
    found: Set[str] = set()
    for module in modules:
        found |= units_of_module(module)
    for qualified in definitions:
        module, _, name = qualified.partition(":")
        found |= units_of_module(module, [name])
    lock = read_lock()
    record: Dict[str, Any] = {
        "units": {u: recorded_version(u, lock) or 1 for u in sorted(found)},
        "implementation": {u: implementation_hash(u) for u in sorted(found)},
    }
    if inputs:
        record["inputs"] = dict(sorted(inputs.items()))
    record["git"] = git
    return record


def merge_records(first: Mapping[str, Any], *others: Mapping[str, Any]) -> Dict[str, Any]:
    """One record of a result that several pieces of code made (a run and a study's reading of it): the union of
    their units, implementations and inputs; ``first``'s git commit."""
    merged: Dict[str, Any] = {"units": {}, "implementation": {}, "inputs": {}}
    for record in (first, *others):
        for key in merged:
            merged[key].update(record.get(key) or {})
    out = {key: dict(sorted(value.items())) for key, value in merged.items() if value or key != "inputs"}
    out["git"] = first.get("git")
    return out


def changed_units(record: Mapping[str, Any]) -> List[str]:
    """What makes a unit record stale: ``unit@recorded->now`` for each unit whose version changed (``->gone`` when
    the lock no longer has it) and ``checkpoint:NAME`` for each input whose digest changed."""
    lock = read_lock()
    changed: List[str] = []
    for unit, version in record.get("units", {}).items():
        now = recorded_version(unit, lock)
        if now != version:
            changed.append(f"{unit}@{version}->{'gone' if now is None else now}")
    for key, digest in (record.get("inputs") or {}).items():
        if input_digest(key) != digest:
            changed.append(key)
    return changed


def uncertified_in(record: Mapping[str, Any]) -> List[str]:
    """The units of a record that are not vouched for: today's implementation is not certified at the unit's
    version (certify it or bump the version), or the implementation the run was made with (``implementation``) is
    not among the certified ones (a run made from uncertified code that was never certified: run it again). A unit
    whose code cannot be read raises ``UnitError``: a broken checkout is an error to fix, not a stale run. A module
    recorded as a unit but declared non-semantic since (``NON_SEMANTIC_MODULES``, e.g. ``project``, the folders of
    the project, recorded by runs of 2026-12-03) is skipped: it computes no number."""
    lock = read_lock()
    out = []
    for unit in record.get("units", {}):
        if unit in NON_SEMANTIC_MODULES:  # declared to compute no numbers after the run recorded it: vouches nothing
            continue
        name = _resolve(unit, lock)
        made_with = (record.get("implementation") or {}).get(unit)
        certified = lock["units"].get(name, {}).get("certified", [])
        if not is_certified(name, lock) or (made_with is not None and made_with not in certified):
            out.append(unit)
    return out


def is_unit_record(record: Any) -> bool:
    return isinstance(record, Mapping) and isinstance(record.get("units"), Mapping)


def status_table() -> List[Dict[str, Any]]:
    """Every unit: version, certified or not, implementation hash, oracles (``python -m ftta_core units``)."""
    lock = read_lock()
    rows = []
    for unit in every_unit():
        entry = lock["units"].get(unit)
        digest = implementation_hash(unit)
        rows.append({"unit": unit, "version": None if entry is None else entry["version"],
                     "certified": entry is not None and digest in entry.get("certified", []),
                     "implementation": digest, "oracles": " ".join(oracles_of(unit))})
    return rows
