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

**Integrity.** Every file a run stores or resumes from is checked on read against a SHA-256 digest recorded when it
was written, in the file that commits it: the checkpoint records the digests of the ``steps.csv`` bytes and the W
parts it vouches for, and its own payload's digest (``checkpoint_bytes``); a finished run's ``summary.json`` records
the digests of ``steps.csv`` and ``collaboration.npz`` and of its own content (``integrity``, ``seal``), and so does
every summary file ``store_summary`` writes. A damaged file is named in one line (``DamagedRun``): an unfinished run
starts again from step 0 (its last intact state: a run is deterministic, so the result is the same), a finished one
is refused (``--overwrite`` runs it again). Files written before digests existed carry none and are read unchecked.
Writes that fail for lack of space or permission end in one line naming the folder and what was being written
(``RunWriteError``, ``writing``): the folder stays resumable.

A run folder is locked while a process writes it (``RunLock``, ``flock``): a second run into the same folder stops
at once with one line. A folder holding a finished run of another config is never overwritten unless asked
(``overwrite=True``, ``run --overwrite``); a finished run of the same config is read back, not run again.

**Code records.** Every summary records what made it (``code_record_of``; a simulated run's record is
``build.code_record``): the **semantic units** (``ftta_core.units``) of the modules the run depends on (the local
method's and strategy's modules and what they import, the loop, engine, stream, scenarios, corruptions, the data
loader and model architecture it used, ``build`` and ``experiment``'s run functions), each at its version, with
their implementation hashes as information, the source checkpoint's digest and the git commit. ``run_status`` says
whether a stored run is ``current`` (every unit at the version it recorded, the checkpoint unchanged), ``stale`` (a
unit's version was bumped: its meaning changed; ``stale_modules`` names them as ``unit@1->2``), ``uncertified``
(today's implementation of a unit it recorded is not certified by its oracles: ``python -m ftta_core units``) or
``unrecorded`` (stored before records existed). A faster kernel, a fix of reporting code or a move of code to another
module keeps every run current once its oracle tests certify it; grids never reuse a stale run silently: they warn
and, with ``FTTA_RERUN_STALE=1``, run it again. Imports under ``if TYPE_CHECKING:`` are not followed (they run
nothing), nor the imports of ``UNFOLLOWED`` registries (a run records the loader it used, not all of them).

Former records are still read: one hash per module (``{"modules": ...}``) and one hash per top-level definition
(``{"definitions": ...}``, ``definition_hashes``; stale when a recorded definition's text changed).
``python -m ftta_core runs --migrate`` rewrites both (``record_migration``): whole-module records into definition
records by finding the recorded source in the git history, and current definition records into unit records.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import errno
import hashlib
import importlib.util
import io
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set

from .codegraph import (MODULE_KEY, PACKAGE, PACKAGE_DIR, UNFOLLOWED, UNRECORDED_NAMES, definition_hashes,  # noqa: F401
                        dependencies, function_hash, module_definitions, module_hash, source_hash)
from .project import LIBRARY_CHECKOUT

log = logging.getLogger(__name__)

RERUN_STALE_ENV = "FTTA_RERUN_STALE"
# modules never recorded: the record keeping itself (stores and checks runs, computes none of their numbers)
RECORD_EXEMPT = frozenset({f"{PACKAGE}.{m}" for m in ("runstore", "record_migration", "units", "codegraph")})
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


class DamagedRun(RunStoreError):
    """A stored file of a run does not match the digest recorded for it, is missing or cannot be read; the message
    names the file in one line."""


class RunWriteError(RunStoreError):
    """Writing a run failed for lack of space or permission; the message says in one line which folder, what was
    being written and that the run is resumable."""


# what a failed write's errno means, and what the user can do about it
WRITE_ERRNOS: Dict[int, tuple] = {
    errno.ENOSPC: ("the disk is full", "free some space"),
    errno.EDQUOT: ("the disk quota is exceeded", "free some space"),
    errno.EFBIG: ("the file is too large for the file system", "free some space or use another --out"),
    errno.EACCES: ("permission denied", "make the folder writable"),
    errno.EPERM: ("operation not permitted", "make the folder writable"),
    errno.EROFS: ("the file system is read-only", "use a writable folder"),
}


@contextlib.contextmanager
def writing(folder: Path | str, what: str) -> Iterator[None]:
    """Turn a disk-full or permission error raised inside the block into ``RunWriteError``: one line naming
    ``folder``, ``what`` was being written and that the run is resumable (every write is atomic or covered by a
    checkpoint, so nothing half-written is ever read back)."""
    try:
        yield
    except OSError as err:
        if err.errno not in WRITE_ERRNOS:
            raise
        reason, remedy = WRITE_ERRNOS[err.errno]
        raise RunWriteError(f"cannot write {what} in {folder}: {reason}; the run is resumable: {remedy}, then run "
                            "the same command again") from None


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
    (a record holds about a thousand: a readable file, a diff of one line per changed module). A summary with an
    ``integrity`` record is sealed again (``seal``: the digest of what is written, the file digests kept)."""
    if isinstance(summary.get(INTEGRITY), dict):
        summary = seal(summary, summary[INTEGRITY].get("files") or {})
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


def store_summary(path: Path | str, summary: Dict[str, Any], files: Sequence[str] = ()) -> None:
    """Write one run's summary file atomically (parallel workers never leave a half-written file behind), sealed
    with the digest of its content and of ``files`` (names of files beside it, already written: ``seal``)."""
    path = Path(path)
    with writing(path.parent, f"the summary {path.name}"):
        atomic_write_text(path, sealed_summary_text(summary, path.parent, files))


# ---------------------------------------------------------------------------------------------------------------
# integrity: digests of stored files, checked on read

INTEGRITY = "integrity"  # a sealed summary's record: {"sha256": its content's digest, "files": {name: sha256}}
CHECKPOINT_FORMAT = "ftta-checkpoint/2"  # a checkpoint whose payload carries its digest (``checkpoint_bytes``)


def file_sha256(path: Path | str, size: Optional[int] = None) -> str:
    """SHA-256 of the file at ``path`` (of its first ``size`` bytes when given)."""
    digest, left = hashlib.sha256(), size
    with open(path, "rb") as fh:
        while left is None or left > 0:
            chunk = fh.read(1 << 20 if left is None else min(1 << 20, left))
            if not chunk:
                break
            digest.update(chunk)
            left = None if left is None else left - len(chunk)
    return digest.hexdigest()


def _content_sha256(data: Any) -> str:
    """SHA-256 of a JSON value in a canonical form (sorted keys, no spaces): the same for every layout of the file."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=float)
    return hashlib.sha256(text.encode()).hexdigest()


def without_integrity(summary: Dict[str, Any]) -> Dict[str, Any]:
    """``summary`` without its ``integrity`` record (what the run measured and how it was made)."""
    return {k: v for k, v in summary.items() if k != INTEGRITY} if INTEGRITY in summary else summary


def seal(summary: Dict[str, Any], files: Mapping[str, str]) -> Dict[str, Any]:
    """``summary`` with an ``integrity`` record: the digest of its JSON content (``integrity`` included, but for
    its own digest) and the digests ``files`` of the files it vouches for (names relative to its folder)."""
    body = json.loads(json.dumps(without_integrity(summary), default=float))  # as a reader will parse it
    record: Dict[str, Any] = {"files": dict(sorted(files.items()))} if files else {}
    return {**summary, INTEGRITY: {"sha256": _content_sha256({**body, INTEGRITY: record}), **record}}


def sealed_summary_text(summary: Dict[str, Any], folder: Path | str, files: Sequence[str] = (),
                        indent: int = 1) -> str:
    """The text of ``summary`` sealed with its own digest and those of ``files`` (names in ``folder``)."""
    digests = {name: file_sha256(Path(folder) / name) for name in files}
    return dumps_summary(seal(summary, digests), indent) + "\n"


def integrity_problem(path: Path | str, data: Any) -> Optional[str]:
    """Why the stored document ``data`` read from ``path`` fails its ``integrity`` record, in a phrase naming the
    damaged file (its content changed since it was sealed, or a file it vouches for is missing or changed); None
    when it agrees, or carries no record (written before digests existed)."""
    path = Path(path)
    if not isinstance(data, dict) or INTEGRITY not in data:
        return None
    record = data[INTEGRITY]
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        return f"{path} is damaged (its integrity record is malformed)"
    rest = {k: v for k, v in record.items() if k != "sha256"}
    if _content_sha256({**without_integrity(data), INTEGRITY: rest}) != record["sha256"]:
        return f"{path} is damaged (its content does not match the sha256 it records)"
    for name, digest in (rest.get("files") or {}).items():
        target = path.parent / name
        if not target.is_file():
            return f"{target} is missing ({path.name} vouches for it)"
        if file_sha256(target) != digest:
            return f"{target} is damaged (it does not match the sha256 {path.name} records)"
    return None


def checkpoint_bytes(state: Dict[str, Any]) -> bytes:
    """``state`` serialised (``torch.save``) inside a wrapper that records the payload's SHA-256, in memory: a
    write to a full disk then fails as an ``OSError`` on the file, not inside torch's zip writer."""
    import torch

    inner = io.BytesIO()
    torch.save(state, inner)
    payload = inner.getvalue()
    outer = io.BytesIO()
    torch.save({"format": CHECKPOINT_FORMAT, "sha256": hashlib.sha256(payload).hexdigest(),
                "payload": torch.frombuffer(bytearray(payload), dtype=torch.uint8)}, outer)
    return outer.getvalue()


def load_checkpoint(path: Path | str) -> Dict[str, Any]:
    """The state saved by ``checkpoint_bytes`` at ``path``, its payload checked against its digest; a checkpoint
    written before digests existed (a plain ``torch.save``) is read unchecked. Raises ``DamagedRun`` naming the file
    when it is truncated, unreadable or does not match its digest."""
    import torch

    path = Path(path)
    try:
        outer = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 -- truncated or flipped bytes raise anything from the unpickler or zip
        raise DamagedRun(f"{path} is damaged (unreadable: {type(err).__name__}: "
                         f"{' '.join(str(err).split())[:120]})") from None
    if not (isinstance(outer, dict) and outer.get("format") == CHECKPOINT_FORMAT):
        state = outer  # written before checkpoints carried a digest
    else:
        payload = outer["payload"].numpy().tobytes() if hasattr(outer.get("payload"), "numpy") else b""
        if hashlib.sha256(payload).hexdigest() != outer.get("sha256"):
            raise DamagedRun(f"{path} is damaged (its payload does not match the sha256 it records)")
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or not {"config", "engine", "next_step"} <= set(state):
        raise DamagedRun(f"{path} is damaged (it holds no run state)")
    return state


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

        with writing(self.folder, "the lock file .lock"):
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

def code_record_of(roots: Sequence[str], functions: Sequence[str] = (),
                   inputs: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """The code record of results that depend on the modules ``roots`` (full names; packages mean all their
    modules) and what they import, e.g. FedICON's ``["ftta_core.fedicon", "ftta_core.models"]``, and on the single
    ``functions`` (``"package.module:function"``) of modules that are otherwise reporting code: the semantic units
    they belong to at their versions (``units.record_for``), the units' implementation hashes, ``inputs`` (source
    checkpoints by digest) and the git commit when the package is a git checkout."""
    from .units import record_for

    return record_for(dependencies(roots), functions, inputs, _git_commit())


def definition_record_of(roots: Sequence[str], functions: Sequence[str] = ()) -> Dict[str, Any]:
    """The former code record (before semantic units): the ``definition_hashes`` of every module of ``roots`` and
    what they import, and of the single ``functions``. Kept to read and migrate records stored in that form."""
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
    dot_git = LIBRARY_CHECKOUT / ".git"
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
    """What a record names that changed since; None when nothing was recorded. A unit record (``units``): each
    unit whose version changed (``unit@1->2``, ``->gone``) and each input whose digest changed (``units
    .changed_units``). A former definition record: ``module:definition`` for each recorded definition whose code
    changed or is gone, ``module:name`` for a new top-level name shadowing a builtin, ``module`` for a module gone
    or (whole-module records) changed."""
    from .units import changed_units, is_unit_record

    if is_unit_record(record):
        return changed_units(record)
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
    """'current', 'stale' (a unit it recorded changed version, or its checkpoint changed; former records: code it
    depends on changed), 'uncertified' (today's implementation of a unit it recorded is not certified: certify it
    or bump its version, ``python -m ftta_core units``) or 'unrecorded' (stored before code records existed)."""
    from .units import is_unit_record, uncertified_in

    record = summary.get("code")
    changed = stale_modules(record)
    if changed is None:
        return "unrecorded"
    if changed:
        return "stale"
    if is_unit_record(record) and uncertified_in(record):
        return "uncertified"
    return "current"


def rerun_stale() -> bool:
    """Whether grids should run stale stored runs again (``$FTTA_RERUN_STALE`` set to 1/true/yes)."""
    return os.environ.get(RERUN_STALE_ENV, "").strip().lower() in ("1", "true", "yes")


_WARNED: Set[str] = set()
# what ``read_summary`` logs for a stale stored run (path, what changed, ``RERUN_STALE_ENV``): the warning a notebook
# shows exactly for the runs ``python -m ftta_core runs`` calls stale (tests/test_notebook_outputs.py)
STALE_RUN_WARNING = "stored run %s was made by code that has changed since (%s); set %s=1 to run it again"


def read_summary(path: Path | str) -> Dict[str, Any]:
    """A stored summary, checked against its ``integrity`` record when it has one (``DamagedRun`` names a damaged
    file) and returned without it; a stale one is reported once per process with the modules that changed."""
    path = Path(path)
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise RunStoreError(f"stored run {path} cannot be read ({err}); delete it to run it again") from None
    problem = integrity_problem(path, summary)
    if problem:
        raise DamagedRun(f"stored run {problem}; delete it to run it again")
    summary = without_integrity(summary)
    changed = stale_modules(summary.get("code"))
    if changed and str(path) not in _WARNED:
        _WARNED.add(str(path))
        shown = ", ".join(c.replace(PACKAGE + ".", "") for c in changed[:4]) + (" ..." if len(changed) > 4 else "")
        log.warning(STALE_RUN_WARNING, path, shown, RERUN_STALE_ENV)
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
# heartbeats: is the process writing a record still alive?

HEARTBEAT_STALE = 4  # a record whose last heartbeat is older than this many intervals: its writer died or hangs


def heartbeat(interval_s: float) -> Dict[str, Any]:
    """What a process writing a live record says about itself: when (epoch seconds and UTC), its process id, host
    and start time (a reused process id is not taken for it), and how often it beats."""
    now = time.time()
    return {"time": round(now, 3), "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), "pid": os.getpid(),
            "host": socket.gethostname(), "process_started": _process_started(os.getpid()),
            "interval_s": float(interval_s)}


def _process_started(pid: int) -> Optional[float]:
    """When process ``pid`` started (clock ticks after boot, from ``/proc``; 0.0 where that cannot be read), or
    None when no such process is alive (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, another user's
        pass
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else float(fields[19])
    return 0.0


def heartbeat_status(beat: Any, now: Optional[float] = None) -> str:
    """'running' while the process that wrote heartbeat ``beat`` (``heartbeat``) is alive and beating, else
    'interrupted': on this host, its process is gone (or its id now belongs to another process); on any host, its
    last beat is older than ``HEARTBEAT_STALE`` intervals (it died on another machine, or hangs, e.g. on a server
    that no longer answers)."""
    if not isinstance(beat, dict):
        return "interrupted"
    now = time.time() if now is None else now
    if beat.get("host") == socket.gethostname() and isinstance(beat.get("pid"), int):
        started = _process_started(beat["pid"])
        recorded = beat.get("process_started")
        if started is None or (recorded and started and started != recorded):
            return "interrupted"
    try:
        age, interval = now - float(beat["time"]), float(beat.get("interval_s") or 30.0)
    except (KeyError, TypeError, ValueError):
        return "interrupted"
    return "interrupted" if age > HEARTBEAT_STALE * interval else "running"


# ---------------------------------------------------------------------------------------------------------------
# every stored run under a folder

@dataclass(frozen=True)
class StoredEntry:
    """One stored run found by ``scan``: where, which layout, its config (None for studies with their own
    records), and its status (``run_status``, or 'unfinished' / 'unreadable' / 'damaged': a file fails its digest;
    a record with a heartbeat still 'running': 'running' or 'interrupted', ``heartbeat_status``)."""

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
    if integrity_problem(path, data):
        return StoredEntry(where, kind, config, "damaged")
    if data.get("status") == "running" and "heartbeat" in data:  # a live record (a Flower run's)
        return StoredEntry(where, kind, config, heartbeat_status(data["heartbeat"]))
    return StoredEntry(where, kind, config, run_status(without_integrity(data)))


def scan_table(roots: Sequence[Path | str]):
    """``scan`` of several folders as a DataFrame (path, layout, status, local, strategy, seed)."""
    import pandas as pd

    rows = [{"path": str(e.path), "layout": e.layout, "status": e.status,
             "local": (e.config or {}).get("local"), "strategy": (e.config or {}).get("strategy"),
             "seed": (e.config or {}).get("seed")} for root in roots for e in scan(root)]
    return pd.DataFrame(rows, columns=["path", "layout", "status", "local", "strategy", "seed"])
