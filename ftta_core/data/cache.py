"""Decoding of packed image archives, manifest verification, and the on-disk cache of decoded arrays.

* ``decode_packed`` is the single decoder for the ``<split>_jpeg``/``_png`` + ``_offsets`` layout of the shared
  archives (``bytes_i = buf[off[i]:off[i+1]]``, decoded with Pillow).
* ``verify`` is the single check against a ``MANIFEST.json`` entry: every key present in both the entry and the
  computed facts (``decoded_sha256``, ``labels_sha256``, ``pixels_sha256``, ``sha256``, ``n``, ``class_counts``,
  shapes) must agree, else ``DataIntegrityError``.
* ``cached_arrays`` stores decoded arrays as ``.npy`` files in ``cache_dir()`` under a key made of the dataset name
  and a fingerprint (source file size + mtime, expected manifest hashes, options, cache format version). Files are
  written to a temporary name and renamed, so concurrent readers never see half a file. Each file has a checksum
  sidecar (``save_checked``) and is verified on every load (the key changes when the source does, not when a cached
  file goes bad): a file that fails its check is named in a warning and decoded again. A file cached by an older
  version, without a sidecar, is accepted once and gets its sidecar.
* ``save_checked`` / ``load_checked`` keep an array with a sidecar (shape, dtype, SHA-256) and verify it on every
  load, for the caches above and those of the corrupted test sets (``stream.CorruptedDomains``); a file that fails
  its check is reported by name and rebuilt by the caller.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, Mapping, Sequence

import numpy as np
from PIL import Image

from ..progress import progress_task
from .root import cache_dir

CACHE_FORMAT = 1


class DataIntegrityError(ValueError):
    """Decoded data disagree with the manifest (corrupted or different archive, or a different Pillow decoder)."""


def sha256_hex(array: np.ndarray) -> str:
    """SHA-256 of an array's C-order bytes (the convention of MANIFEST.json)."""
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def verify(source: Path, entry: Mapping[str, Any] | None, facts: Mapping[str, Any], what: str) -> None:
    """Check ``facts`` against the manifest ``entry`` on every shared key; raise DataIntegrityError on a mismatch."""
    if entry is None:
        warnings.warn(f"{what}: no MANIFEST.json entry next to {source}; decoded data NOT verified", stacklevel=3)
        return
    shared = [k for k in facts if k in entry]
    if not shared:
        warnings.warn(f"{what}: manifest entry has none of {sorted(facts)}; decoded data NOT verified", stacklevel=3)
        return
    bad = [k for k in shared if _normalise(facts[k]) != _normalise(entry[k])]
    if bad:
        detail = "; ".join(f"{k}: expected {entry[k]!r}, got {facts[k]!r}" for k in bad)
        raise DataIntegrityError(
            f"{what}: data decoded from '{source}' do not match MANIFEST.json ({detail}). The archive is corrupted or "
            f"not the one the manifest describes (or Pillow decodes differently from Pillow 13.0). Replace the file "
            f"with an intact copy, and clear the cache folder '{cache_dir()}' if it holds stale arrays."
        )


def _normalise(value: Any) -> Any:
    """Lists/tuples/arrays as plain lists so that JSON values compare equal to computed ones."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_normalise(v) for v in list(value)]
    if isinstance(value, np.generic):
        return value.item()
    return value


def pil_to_array(image: Image.Image, mode: str = "RGB", size: int | None = None) -> np.ndarray:
    """Convert a Pillow image to ``mode`` and optionally resize to ``size x size`` (bilinear); uint8 [H, W, C]."""
    if image.mode != mode:
        image = image.convert(mode)
    if size is not None and image.size != (size, size):
        image = image.resize((size, size), Image.BILINEAR)
    array = np.asarray(image, dtype=np.uint8)
    return array[:, :, None] if array.ndim == 2 else array


def decode_packed(
    buf: np.ndarray,
    offsets: np.ndarray,
    mode: str = "RGB",
    size: int | None = None,
    hasher: Any | None = None,
) -> np.ndarray:
    """Decode the images ``buf[off[i]:off[i+1]]`` with Pillow into uint8 [N, H, W, C] (optionally resized)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    partitions = offsets.ndim == 1 and offsets.size >= 1 and offsets[0] == 0 and offsets[-1] == buf.size
    if not partitions or np.any(np.diff(offsets) < 0):
        raise DataIntegrityError(f"offsets do not partition the {buf.size}-byte buffer ({offsets[:1]}..{offsets[-1:]})")
    raw = memoryview(np.ascontiguousarray(buf, dtype=np.uint8))
    images = []
    for start, stop in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        with Image.open(io.BytesIO(raw[start:stop])) as image:
            image = image if image.mode == mode else image.convert(mode)
            if hasher is not None:
                hasher.update(np.asarray(image, dtype=np.uint8).tobytes())
            images.append(pil_to_array(image, mode, size))
    if not images:
        return np.zeros((0, size or 0, size or 0, len(mode)), dtype=np.uint8)
    shapes = {a.shape for a in images}
    if len(shapes) > 1:
        raise ValueError(f"decoded images have {len(shapes)} different shapes; pass size= to resize them")
    return np.stack(images)


def resize_array(images: np.ndarray, size: int) -> np.ndarray:
    """Resize uint8 [N, H, W] or [N, H, W, C] images to [N, size, size, C] with Pillow bilinear (C = 1 or 3)."""
    images = images[..., None] if images.ndim == 3 else images
    if images.shape[1:3] == (size, size):
        return np.ascontiguousarray(images)
    mode = {1: "L", 3: "RGB"}[images.shape[-1]]
    squeeze = (lambda a: a[:, :, 0]) if mode == "L" else (lambda a: a)
    return np.stack([pil_to_array(Image.fromarray(squeeze(a), mode), mode, size) for a in images])


def gray_to_rgb(images: np.ndarray) -> np.ndarray:
    """Repeat a single channel three times: [N, H, W] or [N, H, W, 1] -> [N, H, W, 3]."""
    images = images[..., None] if images.ndim == 3 else images
    return images if images.shape[-1] == 3 else np.ascontiguousarray(np.repeat(images, 3, axis=-1))


def file_fingerprint(path: Path) -> Dict[str, Any]:
    """Identity of a source file for cache keys: resolved path, size and modification time."""
    stat = Path(path).stat()
    return {"path": str(Path(path).resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def cache_key(name: str, fingerprint: Mapping[str, Any]) -> str:
    """A file-name-safe cache key: the dataset name plus a short hash of the fingerprint."""
    text = json.dumps({"format": CACHE_FORMAT, **fingerprint}, sort_keys=True, default=str)
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}-{digest}"


def cached_arrays(
    name: str,
    fingerprint: Mapping[str, Any],
    fields: Sequence[str],
    build: Callable[[], Dict[str, np.ndarray]],
) -> Dict[str, np.ndarray]:
    """Arrays ``fields`` from the cache when all are present, else ``build()`` them (saying so in progress lines:
    ``progress.progress_task``) and store them atomically."""
    folder = cache_dir()
    key = cache_key(name, fingerprint)
    paths = {f: folder / f"{key}.{f}.npy" for f in fields}
    if all(p.is_file() for p in paths.values()):
        loaded = {f: load_checked(p, adopt=True) for f, p in paths.items()}  # truncated, zeroed...: rebuilt
        if all(a is not None for a in loaded.values()):
            return loaded  # type: ignore[return-value]
    with progress_task(f"data: decoding {name} (first use; cached after)"):
        arrays = build()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for f, p in paths.items():
            save_checked(p, arrays[f])
    except OSError as err:
        warnings.warn(f"could not write the cache for {name} to {folder}: {err}", stacklevel=2)
    return arrays


def atomic_write(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """Call ``write(fh)`` on a temporary file in ``path``'s folder, then rename it onto ``path``. The temporary
    name is unique per writer (pid + a random part, created exclusively), so concurrent writers never share one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())  # the bytes are on disk before the name points at them
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; cached files are public data
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _atomic_save(path: Path, array: np.ndarray) -> None:
    """Write ``array`` as .npy to a temporary file in the same folder, then rename it onto ``path``."""
    atomic_write(path, lambda fh: np.save(fh, np.ascontiguousarray(array), allow_pickle=False))


def checksum_path(path: Path) -> Path:
    """The sidecar of a checked array file: ``<file>.sha256.json``."""
    return path.with_name(path.name + ".sha256.json")


def array_facts(array: np.ndarray) -> Dict[str, Any]:
    """What a checked array's sidecar records: shape, dtype and the SHA-256 of its bytes."""
    return {"shape": list(array.shape), "dtype": str(array.dtype), "sha256": sha256_hex(array)}


def save_checked(path: Path, array: np.ndarray) -> None:
    """Store ``array`` at ``path`` (.npy) with its sidecar (``array_facts``), both atomically. The sidecar goes
    first: for a path whose content is deterministic, a reader racing a writer then finds either no array (and
    builds it too) or an array with the sidecar of its content, never an array without a sidecar."""
    facts = json.dumps(array_facts(array), sort_keys=True).encode("utf-8")
    atomic_write(checksum_path(path), lambda fh: fh.write(facts))
    _atomic_save(path, array)


def load_checked(path: Path, shape: Sequence[int] | None = None, dtype: Any = None,
                 adopt: bool = False) -> np.ndarray | None:
    """The array at ``path`` when it agrees with its sidecar (and ``shape``/``dtype`` when given); None when there
    is no file, or, with a warning naming the file, when it fails a check (truncated, zeroed, no sidecar, wrong
    shape, checksum mismatch): the caller rebuilds it. ``adopt``: a readable file without a sidecar (cached by an
    older version, which verified it before writing it) is accepted and gets its sidecar now."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        array = np.load(path, allow_pickle=False)
        recorded = json.loads(checksum_path(path).read_text())
    except FileNotFoundError:
        if adopt:
            try:
                facts = json.dumps(array_facts(array), sort_keys=True).encode("utf-8")
                atomic_write(checksum_path(path), lambda fh: fh.write(facts))
            except OSError:  # a read-only cache: accepted now, adopted by a later run that can write
                pass
            return array
        problem = f"has no checksum file '{checksum_path(path).name}' (written by an older version)"
    except (OSError, ValueError, EOFError) as err:  # truncated, zeroed or foreign bytes
        problem = f"is unreadable ({type(err).__name__}: {err})"
    else:
        facts = array_facts(array)
        expected = {**(recorded if isinstance(recorded, dict) else {"sidecar": recorded}),
                    **({} if shape is None else {"shape": list(shape)}),
                    **({} if dtype is None else {"dtype": str(np.dtype(dtype))})}
        bad = [k for k in ("shape", "dtype", "sha256") if facts[k] != expected.get(k)]
        if not bad:
            return array
        problem = "does not match its checksum file (" + "; ".join(
            f"{k}: expected {expected.get(k)!r}, got {facts[k]!r}" for k in bad) + ")"
    warnings.warn(f"cache file '{path}' {problem}; rebuilding it", stacklevel=2)
    return None


def load_packed(
    archive: Path,
    keys: tuple[str, str, str],
    name: str,
    entry: Mapping[str, Any] | None,
    mode: str = "RGB",
    size: int | None = None,
    num_classes: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Images and int64 labels of one split of a packed ``.npz`` (keys: bytes, offsets, labels), verified and cached."""
    image_key, offsets_key, labels_key = keys
    fingerprint = {**file_fingerprint(archive), "keys": list(keys), "mode": mode, "size": size, "entry": entry}

    def build() -> Dict[str, np.ndarray]:
        buf, offsets, labels = read_npz(archive, keys)
        hasher = hashlib.sha256()
        images = decode_packed(buf, offsets, mode=mode, size=size, hasher=hasher)
        digest = hasher.hexdigest()  # of the decoded pixels at their original size, in archive order
        facts = {
            "n": int(labels.shape[0]),
            "decoded_sha256": digest,
            "pixels_sha256": digest,
            "labels_sha256": sha256_hex(labels),
            "class_counts": np.bincount(labels.astype(np.int64), minlength=num_classes or 0).tolist(),
        }
        if size is None:
            facts["decoded_shape"] = list(images.shape)
        if images.shape[0] != labels.shape[0]:
            raise DataIntegrityError(f"{name}: {images.shape[0]} images but {labels.shape[0]} labels in '{archive}'")
        verify(archive, entry, facts, name)
        return {"images": images, "labels": labels.astype(np.int64)}

    arrays = cached_arrays(name, fingerprint, ("images", "labels"), build)
    return arrays["images"], arrays["labels"]


def read_npz(archive: Path, keys: Sequence[str]) -> list[np.ndarray]:
    """The arrays ``keys`` of an ``.npz`` file (no pickle); a missing key raises DataIntegrityError naming it."""
    with np.load(archive, allow_pickle=False) as npz:
        missing = [k for k in keys if k not in npz.files]
        if missing:
            raise DataIntegrityError(f"'{archive}' has no array(s) {missing}; it holds {sorted(npz.files)}")
        return [npz[k] for k in keys]
