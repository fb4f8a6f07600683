"""Where datasets and decoded caches live, the shared MANIFEST.json, and the missing-dataset error.

Data root, first match wins:

1. the ``root`` argument of a loader;
2. the environment variable ``FTTA_DATA_ROOT``;
3. the first existing folder of ``<repo>/../shared/data`` (the shared data folder on these machines) and
   ``<repo>/data_root`` (a folder or symlink a user can create next to ``ftta_core/``);
4. otherwise ``<repo>/../shared/data`` is returned anyway, so that errors name where data was expected.

Cache of decoded arrays: ``FTTA_CACHE_DIR``, else ``~/.cache/ftta``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Sequence

DATA_ROOT_ENV = "FTTA_DATA_ROOT"
CACHE_DIR_ENV = "FTTA_CACHE_DIR"
MANIFEST_NAME = "MANIFEST.json"
REPO_DIR = Path(__file__).resolve().parents[2]
DEFAULT_ROOTS = (REPO_DIR.parent / "shared" / "data", REPO_DIR / "data_root")

PathLike = str | os.PathLike


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are missing; the message names them, where we looked, and how to get them."""

    def __init__(self, dataset: str, missing: Sequence[Path], root: Path, how_to_get: str) -> None:
        message = (
            f"{dataset} not found: {_missing_phrase(missing)}.\n"
            f"Looked in data root '{root}' ({describe_root_choice(root)})"
            f"{'' if Path(root).is_dir() else ', which does not exist'}.\n"
            f"How to get it: {how_to_get}"
        )
        super().__init__(message)
        self.dataset = dataset
        self.missing = [Path(p) for p in missing]
        self.root = Path(root)


def _missing_phrase(missing: Sequence[Path]) -> str:
    """English phrase saying which paths are missing ("'a' does not exist", "neither 'a' nor 'b' exists", ...)."""
    quoted = [f"'{p}'" for p in missing]
    if len(quoted) == 1:
        return f"{quoted[0]} does not exist"
    if len(quoted) == 2:
        return f"neither {quoted[0]} nor {quoted[1]} exists"
    return f"none of {', '.join(quoted)} exists"


def data_root(root: PathLike | None = None) -> Path:
    """The data root: ``root`` if given, else ``$FTTA_DATA_ROOT``, else the first existing default folder."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get(DATA_ROOT_ENV)
    if env:
        return Path(env).expanduser()
    for candidate in DEFAULT_ROOTS:
        if candidate.is_dir():
            return candidate.resolve()
    return DEFAULT_ROOTS[0].resolve()


def describe_root_choice(root: Path) -> str:
    """A short phrase telling how ``root`` would have been chosen (for error messages)."""
    env = os.environ.get(DATA_ROOT_ENV)
    if env and Path(env).expanduser() == Path(root):
        return f"from ${DATA_ROOT_ENV}"
    defaults = ", ".join(str(p) for p in DEFAULT_ROOTS)
    if Path(root).resolve() in {p.resolve() for p in DEFAULT_ROOTS}:
        return f"default; ${DATA_ROOT_ENV} is unset; defaults tried: {defaults}"
    return f"given as root=; otherwise ${DATA_ROOT_ENV}, then {defaults}"


def cache_dir() -> Path:
    """Folder for decoded-array caches: ``$FTTA_CACHE_DIR``, else ``~/.cache/ftta`` (created on first write)."""
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ftta"


def load_manifest(root: PathLike) -> Dict[str, Any]:
    """The ``MANIFEST.json`` in ``root`` as a dict (empty when the root has none)."""
    path = Path(root) / MANIFEST_NAME
    if not path.is_file():
        return {}
    with open(path, "r", encoding="utf-8") as fh:
        return json.load(fh)


def manifest_entry(root: PathLike, key: str) -> Dict[str, Any] | None:
    """The manifest entry ``key`` (e.g. ``"cifar10/test"``) of ``root``, or None when absent."""
    return load_manifest(root).get(key)
