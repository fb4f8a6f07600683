"""Rewrite code records stored before definitions were recorded (``{"modules": {name: hash}}``) as definition
records (``runstore.definition_hashes``), so that a stored run turns stale only when a definition it used changes.

A legacy record holds one hash per module (``runstore.source_hash`` of the whole module) or per function
(``"module:function"``). To know the definitions behind such a hash we need the module's source as it was when the
run was made: ``GitSources`` looks for it in the repository's history (every committed version of the module's file,
newest first, the current file included) and takes the version whose hash equals the recorded one, so a migrated
record says exactly what the legacy one said, only finer. A module whose source is not found (a run made from an
uncommitted edit) keeps its whole-module hash under ``runstore.LEGACY_KEY``; modules in ``runstore.RECORD_EXEMPT``
are dropped (the record keeping is not recorded). Run by ``python -m ftta_core runs --migrate``.

The same command re-scopes study records whose recording rule was narrowed (``rescope_record``). A FedICON result
(``fedicon.study.record_scope``), a stored leakage table (``leakage.record_scope``) or a FedAvg+FT reading
(``fedtsa.ft_forward.record_scope``) made before its rule left out reporting modules held their definitions too:
FedICON's reporting module imports the workbook, so an edit of the workbook's run orchestration turned every FedICON
result stale; an earlier ``ft_forward`` imported ``fidelity``, so every reporting function there was in its readings.
Re-scoping keeps exactly the recorded definitions that today's rule records (and any its module no longer has) and
drops the others, hashes untouched: the record then says what a record made now says, and a result whose computing
code changed stays stale.
"""
from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import runstore
from .runstore import LEGACY_KEY, PACKAGE, RECORD_EXEMPT, definition_hashes, source_hash

REPO_DIR = runstore.PACKAGE_DIR.parent


def _function_hashes(source: str) -> Dict[str, str]:
    """The legacy per-function hashes of ``source`` (``source_hash`` of each module-level ``def``)."""
    return {node.name: source_hash(ast.unparse(node)) for node in ast.parse(source).body
            if isinstance(node, ast.FunctionDef)}


class GitSources:
    """Past sources of the package's modules, read from the git history of ``repo`` (cached per module)."""

    def __init__(self, repo: Path = REPO_DIR) -> None:
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


def rescope_record(record: Dict[str, Any], scope: Dict[str, Any]) -> Dict[str, Any]:
    """``record`` (a definition record) keeping only the definitions that ``scope`` (the record today's rule
    writes, e.g. ``fedicon.study.record_scope()``) holds, with their recorded hashes; ``record`` itself when
    nothing is dropped. A recorded definition that its module no longer has is kept: it was used and is gone, so
    the record stays stale."""
    if "definitions" not in record:
        return record

    def kept_key(module: str, key: str) -> bool:
        current = runstore.module_definitions(module)
        return key in scope["definitions"][module] or (current is not None and key not in current)

    kept = {module: {key: digest for key, digest in recorded.items() if kept_key(module, key)}
            for module, recorded in record["definitions"].items() if module in scope["definitions"]}
    kept = {module: recorded for module, recorded in kept.items() if recorded}
    if kept == record["definitions"]:
        return record
    return {**record, "definitions": kept}


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


def migrate_file(path: Path, sources: GitSources) -> Tuple[bool, List[str]]:
    """Rewrite the legacy code records of one stored JSON file in place (atomically, layout kept), then re-scope it
    if it is a study record (``study_scope``); returns whether it changed and the names kept as whole-module
    hashes."""
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
    scope = study_scope(data) if isinstance(data, dict) and isinstance(data.get("code"), dict) else None
    if scope is not None:
        new = rescope_record(data["code"], scope)
        if new is not data["code"]:
            data["code"], changed = new, True
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
