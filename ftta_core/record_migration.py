"""Rewrite code records stored before definitions were recorded (``{"modules": {name: hash}}``) as definition
records (``runstore.definition_hashes``), so that a stored run turns stale only when a definition it used changes.

A legacy record holds one hash per module (``runstore.source_hash`` of the whole module) or per function
(``"module:function"``). To know the definitions behind such a hash we need the module's source as it was when the
run was made: ``GitSources`` looks for it in the repository's history (every committed version of the module's file,
newest first, the current file included) and takes the version whose hash equals the recorded one, so a migrated
record says exactly what the legacy one said, only finer. A module whose source is not found (a run made from an
uncommitted edit) keeps its whole-module hash under ``runstore.LEGACY_KEY``; modules in ``runstore.RECORD_EXEMPT``
are dropped (the record keeping is not recorded). Run by ``python -m ftta_core runs --migrate``.

The same command then rewrites each definition record that is current as a **semantic unit record**
(``to_unit_record``, ``ftta_core.units``): the units its definitions belong to, narrowed to the ones a record made now
would name (a study record's ``study_scope``: FedICON's results, a leakage table, a FedAvg+FT reading; a run's
``build.code_record`` of its config: a CIFAR run no longer names the Office loader), at version 1, with the
implementation the lock certified first. A stale definition record stays as it is, and stale. The stored runs under
``figures/`` were migrated this way on 2026-12-02 from the commit they were current at (c9857d8): 762 current runs
became 762 current unit records, the unrecorded stayed unrecorded.
"""
from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import runstore
from .project import LIBRARY_CHECKOUT
from .runstore import LEGACY_KEY, PACKAGE, RECORD_EXEMPT, definition_hashes, source_hash


def _function_hashes(source: str) -> Dict[str, str]:
    """The legacy per-function hashes of ``source`` (``source_hash`` of each module-level ``def``)."""
    return {node.name: source_hash(ast.unparse(node)) for node in ast.parse(source).body
            if isinstance(node, ast.FunctionDef)}


class GitSources:
    """Past sources of the package's modules, read from the git history of ``repo`` (cached per module)."""

    def __init__(self, repo: Path = LIBRARY_CHECKOUT) -> None:
        self.repo = repo
        self._versions: Dict[str, List[str]] = {}

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.repo), *args], check=True, capture_output=True,
                              text=True).stdout

    def versions(self, module: str) -> List[str]:
        """Every distinct source the module's file has had (current file first, then commits newest first); a
        module may have been a file ``a/b.py`` or a package ``a/b/__init__.py``."""
        if module not in self._versions:
            rel = Path(*module.split("."))
            found: List[str] = []
            for path in (rel.with_suffix(".py"), rel / "__init__.py"):
                if (self.repo / path).exists():
                    found.append((self.repo / path).read_text())
                try:
                    commits = self._git("log", "--all", "--format=%H", "--", path.as_posix()).split()
                except (OSError, subprocess.CalledProcessError):
                    commits = []
                blobs: List[str] = []
                for commit in commits:
                    try:
                        blob = self._git("rev-parse", f"{commit}:{path.as_posix()}").strip()
                    except subprocess.CalledProcessError:
                        continue  # the commit deleted the file
                    if blob not in blobs:
                        blobs.append(blob)
                        found.append(self._git("cat-file", "-p", blob))
            self._versions[module] = found
        return self._versions[module]

    def source_of(self, name: str, digest: str) -> Optional[str]:
        """The source of module ``name`` (or of ``"module:function"``'s module) whose legacy hash is ``digest``."""
        module, _, function = name.partition(":")
        for source in self.versions(module):
            try:
                legacy = _function_hashes(source).get(function) if function else source_hash(source)
            except SyntaxError:
                continue
            if legacy == digest:
                return source
        return None


def migrate_record(record: Dict[str, Any], sources: GitSources) -> Tuple[Dict[str, Any], List[str]]:
    """The definition record equal to legacy ``record``, and the names whose source was not found (kept as
    whole-module hashes). A record that is not a legacy one is returned as it is."""
    if "definitions" in record or "modules" not in record:
        return record, []
    definitions: Dict[str, Dict[str, str]] = {}
    missing: List[str] = []
    for name, digest in record["modules"].items():
        module, _, function = name.partition(":")
        if module in RECORD_EXEMPT:
            continue
        source = sources.source_of(name, digest) if digest else None
        if source is None:
            if function:  # a function whose source is gone: as whole-module records, it stays as it was
                definitions.setdefault(module, {})[function] = digest
            else:
                definitions.setdefault(module, {})[LEGACY_KEY] = digest
            missing.append(name)
            continue
        hashes = definition_hashes(source)
        if function:
            if runstore.MODULE_KEY not in definitions.get(module, {}):
                definitions.setdefault(module, {})[function] = hashes[function]
        else:
            definitions[module] = hashes  # replaces single functions recorded before: the whole module is finer
    return {"definitions": definitions, **{k: v for k, v in record.items() if k != "modules"}}, missing


def _records_in(data: Any) -> Iterator[Dict[str, Any]]:
    """Every code record inside a stored JSON document (a summary's or a study record's ``code``)."""
    if isinstance(data, dict):
        code = data.get("code")
        if isinstance(code, dict) and ("modules" in code or "definitions" in code):
            yield data
        for value in data.values():
            if isinstance(value, (dict, list)):
                yield from _records_in(value)
    elif isinstance(data, list):
        for value in data:
            yield from _records_in(value)


def study_scope(data: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The code record today's rule writes for the study record ``data`` (FedICON result, stored leakage table,
    FedAvg+FT reading), None for any other document."""
    from . import leakage
    from .experiment import ExperimentConfig
    from .fedicon import study
    from .fedtsa import ft_forward

    if study.is_record(data):
        return study.record_scope()
    if ft_forward.is_record(data):
        return ft_forward.record_scope(ExperimentConfig.from_dict(data["config"]))
    if leakage.is_record(data):
        return leakage.record_scope(ExperimentConfig.from_dict(data["config"]))
    return None


def migrate_file(path: Path, sources: GitSources, on: Optional[str] = None) -> Tuple[bool, List[str]]:
    """Rewrite the legacy code records of one stored JSON file in place (atomically, layout kept): whole-module
    records as definition records, then a definition record that is current as a unit record (``to_unit_record``;
    a stale one stays as it is, and stale). Returns whether it changed and the names kept as whole-module hashes."""
    import datetime

    text = path.read_text()
    try:
        data = json.loads(text)
    except ValueError:
        return False, []
    changed, missing = False, []
    for holder in _records_in(data):
        new, lost = migrate_record(holder["code"], sources)
        if new is not holder["code"]:
            holder["code"], changed = new, True
            missing += lost
    code = data.get("code") if isinstance(data, dict) else None
    if isinstance(code, dict) and "definitions" in code and runstore.stale_modules(code) == []:
        data["code"] = to_unit_record(data, on or datetime.date.today().isoformat(), sources)
        changed = True
    if changed:
        indent = 2 if text.startswith('{\n  "') else 1
        runstore.atomic_write_text(path, runstore.dumps_summary(data, indent) + ("\n" if text.endswith("\n") else ""))
    return changed, missing


def migrate(roots: List[Path], sources: Optional[GitSources] = None) -> Dict[str, Any]:
    """Migrate every stored JSON file under ``roots``; returns counts and the names kept as whole-module hashes."""
    sources = sources or GitSources()
    files = changed = 0
    missing: Dict[str, int] = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*.json")) if Path(root).is_dir() else [Path(root)]:
            if path.name.startswith("."):
                continue
            files += 1
            did, lost = migrate_file(path, sources)
            changed += did
            for name in lost:
                missing[name] = missing.get(name, 0) + 1
    return {"files": files, "migrated": changed, "kept_whole": {k.replace(PACKAGE + ".", ""): v
                                                                for k, v in sorted(missing.items())}}


# ---------------------------------------------------------------------------------------------------------------
# definition records -> semantic unit records (``ftta_core.units``)

def units_of_definitions(record: Dict[str, Any]) -> List[str]:
    """The units a definition record's definitions belong to (``units.unit_of``), those the lock holds."""
    from . import units

    lock = units.read_lock()
    found = {units.unit_of(module, key) for module, recorded in record.get("definitions", {}).items()
             for key in recorded if key != LEGACY_KEY}
    return sorted(u for u in found if u is not None and u in lock["units"])


def scope_units(data: Dict[str, Any]) -> Optional[List[str]]:
    """The units a record made now of the same result would name (a study record's ``study_scope``, a run's
    ``build.code_record`` of its config), None when neither applies."""
    from .build import code_record
    from .experiment import ExperimentConfig

    scope = study_scope(data)
    if scope is None and isinstance(data.get("config"), dict) and "local" in data["config"]:
        try:
            cfg = ExperimentConfig.from_dict(data["config"])
        except ValueError:  # a method of a plugin not loaded here: its record names the package's units only
            return None
        scope = code_record(cfg.local, cfg.strategy, cfg)
    return None if scope is None else sorted(scope["units"])


def _checkpoint_unchanged_since(commit: Optional[str], name: str, sources: GitSources) -> bool:
    """Whether source checkpoint ``name`` is the same file today as at ``commit`` (git history of its file)."""
    if not commit:
        return False
    path = f"data/checkpoints/{name}.pt"
    try:
        return sources._git("log", "--format=%H", f"{commit}..HEAD", "--", path).strip() == "" and \
            sources._git("cat-file", "-e", f"{commit}:{path}") == ""
    except subprocess.CalledProcessError:
        return False


def to_unit_record(data: Dict[str, Any], on: str, sources: Optional[GitSources] = None) -> Dict[str, Any]:
    """The unit record (``units.record_for``'s form) of a stored document whose definition record was current
    when migrated: the units its definitions belong to, narrowed to those a record made now would name
    (``scope_units``: a CIFAR run no longer names the Office loader), each at version 1 with the implementation the
    lock certified first (the code the run was current with), its source checkpoint by digest when that file has
    not changed since the run's commit, and a ``migrated`` note."""
    from . import units

    record = data["code"]
    lock = units.read_lock()
    found = set(units_of_definitions(record))
    scope = scope_units(data)
    if scope is not None:
        found &= set(scope)
    out: Dict[str, Any] = {"units": {u: lock["units"][u]["version"] for u in sorted(found)},
                           "implementation": {u: lock["units"][u]["certified"][0] for u in sorted(found)}}
    config = data.get("config") if isinstance(data.get("config"), dict) else None
    if config is not None and "dataset" in config:
        from .experiment import DATASET_DEFAULTS

        name = config.get("model") or DATASET_DEFAULTS[config["dataset"]]["model"]
        if _checkpoint_unchanged_since(record.get("git"), name, sources or GitSources()):
            out["inputs"] = units.checkpoint_input(name)
    out["git"] = record.get("git")
    out["migrated"] = {"from": "definition record", "on": on}
    return out


def migrate_to_units(paths: List[Path], on: str) -> Dict[str, Any]:
    """Rewrite the definition records of the stored documents ``paths`` (each one current by the definition rule:
    the caller says which) as unit records (``to_unit_record``), atomically, layout kept; returns counts."""
    sources = GitSources()
    done = 0
    for path in paths:
        text = path.read_text()
        data = json.loads(text)
        if not (isinstance(data, dict) and isinstance(data.get("code"), dict) and "definitions" in data["code"]):
            continue
        data["code"] = to_unit_record(data, on, sources)
        indent = 2 if text.startswith('{\n  "') else 1
        runstore.atomic_write_text(path, json.dumps(data, indent=indent, default=float)
                                   + ("\n" if text.endswith("\n") else ""))
        done += 1
    return {"files": len(paths), "migrated": done}
