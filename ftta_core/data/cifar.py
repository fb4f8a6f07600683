"""CIFAR-10 and CIFAR-100 loaders.

Formats read, first match wins:

* the standard python-batch folders as ``torchvision.datasets.CIFAR10/100(root, download=True)`` leave them:
  ``<root>/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}`` and
  ``<root>/cifar-100-python/{train, test, meta}`` (pickles; lossless pixels, not checked against the manifest,
  which describes the packed archive);
* the packed archive ``<root>/cifar10/cifar10_jpeg.npz`` of the shared data folder (JPEG-compressed copies of the
  official images in the official order; decoded pixels and labels verified against MANIFEST.json, then cached).
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Dict, List, NamedTuple

import numpy as np

from .base import ImageArray
from .cache import load_packed, read_npz
from .root import DatasetNotFoundError, PathLike, data_root, manifest_entry
from ..validation import check_choice

SPLITS = ("train", "test")
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR100_FOLDER = "cifar-100-python"
CIFAR10_PACKED = "cifar10/cifar10_jpeg.npz"

CIFAR10_HOW_TO_GET = (
    f"set FTTA_DATA_ROOT (or pass root=) to a folder containing '{CIFAR10_FOLDER}/' as downloaded by "
    f"torchvision.datasets.CIFAR10(root, download=True) (https://www.cs.toronto.edu/~kriz/cifar.html), or the "
    f"packed '{CIFAR10_PACKED}' of the shared data folder (../shared/data on the project machines)."
)
CIFAR100_HOW_TO_GET = (
    f"set FTTA_DATA_ROOT (or pass root=) to a folder containing '{CIFAR100_FOLDER}/' (files train, test, meta) as "
    f"downloaded by torchvision.datasets.CIFAR100(root, download=True) (https://www.cs.toronto.edu/~kriz/cifar.html). "
    f"CIFAR-100 is not in the shared data folder."
)


class PythonBatchLayout(NamedTuple):
    """Where a CIFAR python-batch folder keeps its splits, labels and class names."""

    dataset: str
    folder: str
    files: Dict[str, List[str]]
    label_key: bytes
    meta_file: str
    names_key: bytes
    how_to_get: str


CIFAR10_LAYOUT = PythonBatchLayout(
    "cifar10", CIFAR10_FOLDER, {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]},
    b"labels", "batches.meta", b"label_names", CIFAR10_HOW_TO_GET,
)
CIFAR100_LAYOUT = PythonBatchLayout(
    "cifar100", CIFAR100_FOLDER, {"train": ["train"], "test": ["test"]},
    b"fine_labels", "meta", b"fine_label_names", CIFAR100_HOW_TO_GET,
)


def load_cifar10(split: str = "test", root: PathLike | None = None) -> ImageArray:
    """CIFAR-10 ``split`` ("train" 50,000 | "test" 10,000), 32x32 RGB, from python batches or the packed archive."""
    _check_split(split)
    base = data_root(root)
    folder = base / CIFAR10_FOLDER
    if folder.is_dir():
        return _load_python_batches(CIFAR10_LAYOUT, base, split)
    archive = base / CIFAR10_PACKED
    if not archive.is_file():
        raise DatasetNotFoundError("CIFAR-10", [folder, archive], base, CIFAR10_HOW_TO_GET)
    (class_names,) = read_npz(archive, ["class_names"])
    images, labels = load_packed(
        archive,
        (f"{split}_jpeg", f"{split}_offsets", f"{split}_labels"),
        name=f"cifar10/{split}",
        entry=manifest_entry(base, f"cifar10/{split}"),
        num_classes=len(class_names),
    )
    return ImageArray(f"cifar10/{split}", images, labels, [str(c) for c in class_names])


def load_cifar100(split: str = "test", root: PathLike | None = None) -> ImageArray:
    """CIFAR-100 ``split`` ("train" | "test") with the 100 fine labels, from the standard python folder."""
    _check_split(split)
    base = data_root(root)
    folder = base / CIFAR100_FOLDER
    if not folder.is_dir():
        raise DatasetNotFoundError("CIFAR-100", [folder], base, CIFAR100_HOW_TO_GET)
    return _load_python_batches(CIFAR100_LAYOUT, base, split)


def _check_split(split: str) -> None:
    """Raise ValueError unless ``split`` is "train" or "test"."""
    check_choice("split", split, SPLITS)


def _load_python_batches(layout: PythonBatchLayout, base: Path, split: str) -> ImageArray:
    """Concatenate CIFAR python-batch pickles (rows of 3072 = 3 planes of 32x32) into an NHWC ImageArray."""
    folder = base / layout.folder
    paths = [folder / f for f in layout.files[split] + [layout.meta_file]]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise DatasetNotFoundError(f"{layout.dataset}/{split}", missing, base, layout.how_to_get)
    batches = [_read_pickle(p) for p in paths[:-1]]
    data = np.concatenate([np.asarray(_field(b, b"data"), dtype=np.uint8) for b in batches])
    labels = np.concatenate([np.asarray(_field(b, layout.label_key), dtype=np.int64) for b in batches])
    images = np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    class_names = [_text(c) for c in _field(_read_pickle(paths[-1]), layout.names_key)]
    return ImageArray(f"{layout.dataset}/{split}", images, labels, class_names)


def _read_pickle(path: Path) -> dict:
    """Load one CIFAR pickle (written by Python 2, so keys come back as bytes)."""
    with open(path, "rb") as fh:
        return pickle.load(fh, encoding="bytes")


def _field(batch: dict, key: bytes) -> Any:
    """``batch[key]`` accepting both bytes and str keys."""
    if key in batch:
        return batch[key]
    return batch[key.decode("ascii")]


def _text(value: Any) -> str:
    """A class name as str (the pickles store bytes)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


__all__: List[str] = ["load_cifar10", "load_cifar100", "CIFAR10_FOLDER", "CIFAR100_FOLDER", "CIFAR10_PACKED"]
