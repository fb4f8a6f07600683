"""Digit domains (a partial Digit-5) and the embedded default dataset, all as RGB uint8 [N, size, size, 3].

Sources (``<root>/digits/digits.npz`` of the shared data folder unless noted), resized with Pillow bilinear and
gray domains repeated to three channels:

* ``mnist``: only the official 10,000-image *test* set exists here. It is split deterministically, stratified by
  label, into 8,000 "train" / 2,000 "test" images (seed ``SPLIT_SEED`` = 0, purpose ``"split"/"mnist"`` via
  ``ftta_core.rng.numpy_generator``). Raw 28x28 array verified against the manifest ``sha256``.
* ``usps``: the official 7,291 train / 2,007 test split, 16x16 (raw arrays verified against ``sha256``).
* ``mnistm``: train = the first 20,000 MNIST-M training images, test = all 9,001 test images; PNG 32x32 RGB,
  decoded pixels verified against ``decoded_sha256`` and cached.
* ``sklearn_digits`` and ``load_embedded_digits``: scikit-learn's bundled ``load_digits`` (1,797 8x8 images, no
  download), values 0..16 mapped to round(v * 255 / 16), split stratified into 1,200 "train" / 597 "test" images
  (seed 0, purpose ``"split"/"sklearn_digits"``); ``split="all"`` (embedded only) returns all 1,797 in sklearn order.

Split indices are returned in ascending order, so each split keeps the source order.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

import numpy as np

from ..rng import numpy_generator
from .base import ImageArray
from .cache import cached_arrays, file_fingerprint, gray_to_rgb, load_packed, read_npz, resize_array, sha256_hex, verify
from .root import DatasetNotFoundError, PathLike, data_root, manifest_entry
from ..validation import check_choice

DIGIT_DOMAINS = ("mnist", "usps", "mnistm", "sklearn_digits")
DIGITS_PACKED = "digits/digits.npz"
DIGIT_CLASSES = [str(d) for d in range(10)]
SPLIT_SEED = 0
MNIST_TRAIN_SIZE = 8_000  # of the 10,000 MNIST test images (80/20)
EMBEDDED_TRAIN_SIZE = 1_200  # of the 1,797 scikit-learn digits (597 left for test)
DIGITS_HOW_TO_GET = (
    f"set FTTA_DATA_ROOT (or pass root=) to a folder containing the packed '{DIGITS_PACKED}' of the shared data "
    f"folder (../shared/data on the project machines). For a dataset that needs no download use "
    f"load_embedded_digits() or the 'sklearn_digits' domain."
)


def stratified_split(labels: np.ndarray, n_train: int, seed: int, *keys: str | int) -> Tuple[np.ndarray, np.ndarray]:
    """Deterministic stratified (train_idx, test_idx), sorted, with exactly ``n_train`` train indices."""
    labels = np.asarray(labels)
    if not 0 <= n_train <= labels.size:
        raise ValueError(f"n_train={n_train} outside [0, {labels.size}]")
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * (n_train / labels.size)
    quota = np.floor(exact).astype(np.int64)
    remainder_order = np.lexsort((classes, -(exact - quota)))  # largest fractional part first, ties by class
    quota[remainder_order[: n_train - int(quota.sum())]] += 1
    rng = numpy_generator(seed, *keys)
    train = [rng.permutation(np.flatnonzero(labels == c))[:q] for c, q in zip(classes, quota)]
    train_idx = np.sort(np.concatenate(train)) if train else np.zeros(0, dtype=np.int64)
    test_mask = np.ones(labels.size, dtype=bool)
    test_mask[train_idx] = False
    return train_idx.astype(np.int64), np.flatnonzero(test_mask).astype(np.int64)


def load_digit_domain(name: str, split: str, size: int = 32, root: PathLike | None = None) -> ImageArray:
    """Digit domain ``name`` (mnist | usps | mnistm | sklearn_digits), ``split`` train|test, RGB [N,size,size,3]."""
    check_choice("digit domain", name, DIGIT_DOMAINS)
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if name == "sklearn_digits":
        data = load_embedded_digits(split, size=size)
        return ImageArray(f"digits/{name}/{split}", data.images, data.labels, DIGIT_CLASSES)
    base = data_root(root)
    archive = base / DIGITS_PACKED
    if not archive.is_file():
        raise DatasetNotFoundError(f"digit domain '{name}'", [archive], base, DIGITS_HOW_TO_GET)
    if name == "mnistm":
        images, labels = load_packed(
            archive,
            (f"mnistm_{split}_png", f"mnistm_{split}_offsets", f"mnistm_y_{split}"),
            name=f"digits/mnistm_{split}",
            entry=manifest_entry(base, f"digits/mnistm_{split}"),
            size=None if size == 32 else size,
            num_classes=10,
        )
    elif name == "usps":
        images, labels = _raw_digits(archive, base, f"usps_x_{split}", f"usps_y_{split}", size)
    else:  # mnist: split the available test set
        images, labels = _raw_digits(archive, base, "mnist_x_test", "mnist_y_test", size)
        index = _split_index(labels, MNIST_TRAIN_SIZE, "mnist", split)
        images, labels = images[index], labels[index]
    return ImageArray(f"digits/{name}/{split}", gray_to_rgb(resize_array(images, size)), labels, DIGIT_CLASSES)


def _split_index(labels: np.ndarray, n_train: int, dataset: str, split: str) -> np.ndarray:
    """Indices of ``split`` ("train" | "test") of the documented stratified split of ``dataset``."""
    train_idx, test_idx = stratified_split(labels, n_train, SPLIT_SEED, "split", dataset)
    return train_idx if split == "train" else test_idx


def _raw_digits(archive: Path, base: Path, x_key: str, y_key: str, size: int) -> Tuple[np.ndarray, np.ndarray]:
    """Gray images of ``digits.npz`` verified (raw) against the manifest, resized to [N, size, size, 1]; cached."""
    entry = manifest_entry(base, f"digits/{x_key}")

    def build() -> dict:
        images, labels = read_npz(archive, [x_key, y_key])
        verify(archive, entry, {"sha256": sha256_hex(images), "shape": list(images.shape)}, f"digits/{x_key}")
        return {"images": resize_array(images, size), "labels": labels.astype(np.int64)}

    fingerprint = {**file_fingerprint(archive), "keys": [x_key, y_key], "size": size, "entry": entry}
    arrays = cached_arrays(f"digits/{x_key}", fingerprint, ("images", "labels"), build)
    return arrays["images"], arrays["labels"]


def load_embedded_digits(split: str = "train", size: int = 16) -> ImageArray:
    """scikit-learn's bundled digits (no download) as RGB uint8 [N,size,size,3]; split train|test|all (1,200/597)."""
    from sklearn.datasets import load_digits

    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    bunch = load_digits()
    gray = np.round(bunch.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    labels = bunch.target.astype(np.int64)
    if split != "all":
        index = _split_index(labels, EMBEDDED_TRAIN_SIZE, "sklearn_digits", split)
        gray, labels = gray[index], labels[index]
    return ImageArray(f"embedded_digits/{split}", gray_to_rgb(resize_array(gray, size)), labels, DIGIT_CLASSES)


__all__: List[str] = ["load_digit_domain", "load_embedded_digits", "stratified_split", "DIGIT_DOMAINS"]
