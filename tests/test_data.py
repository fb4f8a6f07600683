"""Tests of ftta_core.data: loaders, manifest verification, cache, errors, splits (real data from ../shared/data)."""
from __future__ import annotations

import hashlib
import io
import json
import pickle
from pathlib import Path

import numpy as np
import PIL.Image
import pytest

from ftta_core.data import (
    DATASETS,
    DIGIT_DOMAINS,
    OFFICE_DOMAINS,
    DataIntegrityError,
    DatasetNotFoundError,
    cache_dir,
    data_root,
    decode_packed,
    load_cifar10,
    load_cifar100,
    load_dataset,
    load_digit_domain,
    load_embedded_digits,
    load_office_caltech10,
    stratified_split,
)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory):
    """A fresh cache folder for the whole session, so tests never read or fill the user's ~/.cache/ftta."""
    folder = tmp_path_factory.mktemp("ftta_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FTTA_CACHE_DIR", str(folder))
        mp.delenv("FTTA_DATA_ROOT", raising=False)
        yield folder


@pytest.fixture(scope="session")
def real_root() -> Path:
    """The shared data folder, or skip."""
    if not (SHARED / "MANIFEST.json").is_file():
        pytest.skip(f"shared data folder {SHARED} is absent (set up on the project machines and in CI)")
    return SHARED


@pytest.fixture(scope="session")
def manifest(real_root: Path) -> dict:
    return json.loads((real_root / "MANIFEST.json").read_text())


@pytest.fixture(scope="session")
def cifar10_real(real_root: Path):
    """CIFAR-10 test and train from the packed archive (first load decodes, verifies and caches: ~10 s)."""
    return load_cifar10("test", root=real_root), load_cifar10("train", root=real_root)


def _jpeg(image: np.ndarray, quality: int = 90) -> bytes:
    out = io.BytesIO()
    PIL.Image.fromarray(image).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _pack(blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.cumsum([0] + [len(b) for b in blobs]).astype(np.int64)
    return np.frombuffer(b"".join(blobs), dtype=np.uint8).copy(), offsets


def _write_fake_cifar_archive(root: Path, rng: np.random.Generator, n: int = 6) -> dict:
    """A tiny ``cifar10/cifar10_jpeg.npz`` + matching MANIFEST.json (hashes computed independently with Pillow)."""
    arrays, manifest = {"class_names": np.array(["a", "b", "c"])}, {}
    for split in ("train", "test"):
        blobs = [_jpeg(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]
        labels = (np.arange(n) % 3).astype(np.uint8)
        arrays[f"{split}_jpeg"], arrays[f"{split}_offsets"] = _pack(blobs)
        arrays[f"{split}_labels"] = labels
        decoded = np.stack([np.asarray(PIL.Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs])
        manifest[f"cifar10/{split}"] = {
            "n": n,
            "decoded_shape": list(decoded.shape),
            "decoded_sha256": hashlib.sha256(decoded.tobytes()).hexdigest(),
            "labels_sha256": hashlib.sha256(labels.tobytes()).hexdigest(),
        }
    (root / "cifar10").mkdir(parents=True)
    np.savez(root / "cifar10" / "cifar10_jpeg.npz", **arrays)
    (root / "MANIFEST.json").write_text(json.dumps(manifest))
    return arrays


def _write_pickle(path: Path, obj: dict) -> None:
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=2)


# ---------------------------------------------------------------- roots, errors, registry


def test_data_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("FTTA_DATA_ROOT", str(tmp_path / "env"))
    assert data_root(tmp_path / "arg") == tmp_path / "arg"
    assert data_root() == tmp_path / "env"
    monkeypatch.delenv("FTTA_DATA_ROOT")
    if SHARED.is_dir():
        assert data_root() == SHARED.resolve()


def test_cache_dir_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("FTTA_CACHE_DIR")
    assert cache_dir() == Path.home() / ".cache" / "ftta"


@pytest.mark.parametrize(
    "name, split, expected",
    [
        ("cifar10", "test", ["cifar-10-batches-py", "cifar10/cifar10_jpeg.npz", "torchvision.datasets.CIFAR10"]),
        ("cifar100", "test", ["cifar-100-python", "torchvision.datasets.CIFAR100"]),
        ("office_caltech10/dslr", "all", ["office_caltech10/dslr", "office_caltech10_jpeg.npz"]),
        ("digits/usps", "train", ["digits/digits.npz", "load_embedded_digits"]),
    ],
)
def test_missing_dataset_error_names_file_and_remedy(tmp_path, name, split, expected):
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset(name, split, root=tmp_path)
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    assert str(tmp_path) in message and "FTTA_DATA_ROOT" in message
    for text in expected:
        assert text in message


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ValueError) as info:
        load_dataset("imagenet", "test")
    for name in ("cifar10", "office_caltech10/amazon", "digits/mnistm", "embedded_digits"):
        assert name in str(info.value)
    assert set(DATASETS) >= {"cifar10", "cifar100", "embedded_digits"}
    assert len(DATASETS) == 3 + len(OFFICE_DOMAINS) + len(DIGIT_DOMAINS)


def test_registry_validates_splits():
    with pytest.raises(ValueError, match="split"):
        load_dataset("office_caltech10/amazon", "test")
    with pytest.raises(ValueError, match="split"):
        load_cifar10("val")
    assert len(load_dataset("embedded_digits", "test", size=8)) == 597


# ---------------------------------------------------------------- packed decoding, verification, cache


def test_decode_packed_resizes_and_rejects_bad_offsets():
    rng = np.random.default_rng(1)
    blobs = [_jpeg(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in [(20, 30), (40, 10)]]
    buf, offsets = _pack(blobs)
    out = decode_packed(buf, offsets, size=16)
    assert out.shape == (2, 16, 16, 3) and out.dtype == np.uint8
    assert decode_packed(buf, offsets, mode="L", size=8).shape == (2, 8, 8, 1)
    with pytest.raises(ValueError, match="different shapes"):
        decode_packed(buf, offsets)
    with pytest.raises(DataIntegrityError, match="offsets"):
        decode_packed(buf, offsets[:-1])


def test_fake_archive_verifies_then_corruption_is_detected(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    good = tmp_path / "good"
    arrays = _write_fake_cifar_archive(good, rng)
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    data = load_cifar10("test", root=good)
    assert data.images.shape == (6, 32, 32, 3) and data.class_names == ["a", "b", "c"]
    assert data.labels.dtype == np.int64 and data.labels.tolist() == [0, 1, 2, 0, 1, 2]

    # corrupted copy: image 2 replaced by another valid JPEG (decodes fine, different pixels), same manifest
    bad = tmp_path / "bad"
    (bad / "cifar10").mkdir(parents=True)
    (bad / "MANIFEST.json").write_text((good / "MANIFEST.json").read_text())
    offsets = arrays["test_offsets"]
    blobs = [arrays["test_jpeg"][a:b].tobytes() for a, b in zip(offsets[:-1], offsets[1:])]
    blobs[2] = _jpeg(np.zeros((32, 32, 3), dtype=np.uint8))
    arrays["test_jpeg"], arrays["test_offsets"] = _pack(blobs)
    np.savez(bad / "cifar10" / "cifar10_jpeg.npz", **arrays)
    with pytest.raises(DataIntegrityError, match="decoded_sha256"):
        load_cifar10("test", root=bad)
    assert len(list((tmp_path / "cache").glob("cifar10_test-*.images.npy"))) == 1  # only the good archive was cached

    # wrong labels are caught too
    manifest = json.loads((good / "MANIFEST.json").read_text())
    manifest["cifar10/train"]["labels_sha256"] = "0" * 64
    (bad / "MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(DataIntegrityError, match="labels_sha256"):
        load_cifar10("train", root=bad)


def test_archive_without_manifest_warns(tmp_path, monkeypatch):
    _write_fake_cifar_archive(tmp_path, np.random.default_rng(2))
    (tmp_path / "MANIFEST.json").unlink()
    monkeypatch.setenv("FTTA_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.warns(UserWarning, match="NOT verified"):
        assert len(load_cifar10("train", root=tmp_path)) == 6


def test_real_cifar10_verified_and_shaped(cifar10_real):
    test, train = cifar10_real
    assert test.images.shape == (10_000, 32, 32, 3) and train.images.shape == (50_000, 32, 32, 3)
    assert test.images.dtype == np.uint8 and test.labels.dtype == np.int64
    assert np.bincount(test.labels).tolist() == [1000] * 10
    assert np.bincount(train.labels).tolist() == [5000] * 10
    assert test.class_names[:3] == ["airplane", "automobile", "bird"] and test.class_names[-1] == "truck"


def test_cache_round_trip_skips_decoding(cifar10_real, real_root, isolated_cache, monkeypatch):
    test, _ = cifar10_real
    assert list(isolated_cache.glob("cifar10_test-*.images.npy"))

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded although the cache holds the arrays")

    monkeypatch.setattr(PIL.Image, "open", no_decoding)
    again = load_cifar10("test", root=real_root)
    np.testing.assert_array_equal(again.images, test.images)
    np.testing.assert_array_equal(again.labels, test.labels)


# ---------------------------------------------------------------- standard on-disk formats


def test_cifar10_python_batches_fixture(tmp_path):
    rng = np.random.default_rng(3)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rows = {}
    for name, n in [(f"data_batch_{i}", 2) for i in range(1, 6)] + [("test_batch", 3)]:
        rows[name] = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        _write_pickle(folder / name, {b"data": rows[name], b"labels": list(range(n)), b"batch_label": name.encode()})
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    _write_pickle(folder / "batches.meta", {b"label_names": names, b"num_vis": 3072})
    # a packed archive in the same root must be ignored in favour of the standard folder
    _write_fake_cifar_archive(tmp_path, rng)

    test = load_cifar10("test", root=tmp_path)
    train = load_cifar10("train", root=tmp_path)
    assert test.images.shape == (3, 32, 32, 3) and train.images.shape == (10, 32, 32, 3)
    assert test.labels.tolist() == [0, 1, 2] and test.class_names[-1] == "truck"
    # NHWC pixel (y, x, c) comes from plane c, row-major: data[c * 1024 + y * 32 + x]
    i, y, x, c = 1, 5, 7, 2
    assert test.images[i, y, x, c] == rows["test_batch"][i, c * 1024 + y * 32 + x]
    np.testing.assert_array_equal(train.images[2, ..., 0].ravel(), rows["data_batch_2"][0, :1024])


def test_cifar100_python_fixture(tmp_path):
    rng = np.random.default_rng(4)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for split, n in [("train", 5), ("test", 4)]:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        fine = [97, 3, 50, 0, 99][:n]
        batch = {b"data": data, b"fine_labels": fine, b"coarse_labels": [0] * n, b"filenames": []}
        _write_pickle(folder / split, batch)
    fine_names = [f"class_{k}".encode() for k in range(100)]
    _write_pickle(folder / "meta", {b"fine_label_names": fine_names, b"coarse_label_names": [b"c"] * 20})
    test = load_dataset("cifar100", "test", root=tmp_path)
    assert test.images.shape == (4, 32, 32, 3) and test.labels.tolist() == [97, 3, 50, 0]
    assert test.num_classes == 100 and test.class_names[97] == "class_97"
    assert len(load_cifar100("train", root=tmp_path)) == 5
    (folder / "test").unlink()
    with pytest.raises(DatasetNotFoundError, match="cifar-100-python/test"):
        load_cifar100("test", root=tmp_path)


def test_office_image_folder_tree(tmp_path):
    rng = np.random.default_rng(5)
    tree = tmp_path / "office_caltech10" / "webcam"
    for cls, shapes in [("mug", [(30, 40, 3)]), ("bike", [(50, 50, 3), (20, 10)])]:
        (tree / cls).mkdir(parents=True)
        for k, shape in enumerate(shapes):
            PIL.Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(tree / cls / f"{k}.jpg")
    data = load_office_caltech10("webcam", root=tmp_path, size=24)
    assert data.images.shape == (3, 24, 24, 3) and data.class_names == ["bike", "mug"]
    assert data.labels.tolist() == [0, 0, 1]
    gray = data.images[1]  # bike/1.jpg was grayscale: converted to RGB, equal channels
    assert np.array_equal(gray[..., 0], gray[..., 1]) and np.array_equal(gray[..., 1], gray[..., 2])


# ---------------------------------------------------------------- real Office-Caltech-10 and digits


@pytest.mark.parametrize("domain", OFFICE_DOMAINS)
def test_real_office_domains_match_manifest(real_root, manifest, domain):
    data = load_office_caltech10(domain, root=real_root, size=32)  # pixels_sha256 verified inside
    entry = manifest[f"office_caltech10/{domain}"]
    assert data.images.shape == (entry["n"], 32, 32, 3) and data.images.dtype == np.uint8
    assert np.bincount(data.labels, minlength=10).tolist() == entry["class_counts"]
    assert len(data.class_names) == 10 and data.labels.min() == 0 and data.labels.max() == 9


def test_real_digit_domains(real_root):
    sizes = {"mnist": (8000, 2000), "usps": (7291, 2007), "mnistm": (20000, 9001), "sklearn_digits": (1200, 597)}
    for name in DIGIT_DOMAINS:
        for split, n in zip(("train", "test"), sizes[name]):
            data = load_digit_domain(name, split, root=real_root)
            assert data.images.shape == (n, 32, 32, 3) and data.images.dtype == np.uint8, (name, split)
            assert data.labels.min() == 0 and data.labels.max() == 9 and len(np.unique(data.labels)) == 10
            if name != "mnistm":  # gray domains expanded to 3 equal channels
                assert np.array_equal(data.images[..., 0], data.images[..., 2])
    assert load_digit_domain("usps", "test", size=16, root=real_root).images.shape == (2007, 16, 16, 3)
    assert load_digit_domain("mnist", "test", size=28, root=real_root).images.shape == (2000, 28, 28, 3)


def test_mnist_split_is_deterministic_stratified_and_complete(real_root):
    train = load_digit_domain("mnist", "train", root=real_root)
    again = load_digit_domain("mnist", "train", root=real_root)
    test = load_digit_domain("mnist", "test", root=real_root)
    np.testing.assert_array_equal(train.images, again.images)
    counts = np.bincount(train.labels) + np.bincount(test.labels)
    assert counts.tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]  # the MNIST test set
    assert np.all(np.abs(np.bincount(train.labels) - 0.8 * counts) <= 1)


# ---------------------------------------------------------------- splits and the embedded default


def test_stratified_split_properties():
    labels = np.repeat(np.arange(4), [10, 7, 5, 3])
    tr, te = stratified_split(labels, 15, 0, "split", "x")
    tr2, te2 = stratified_split(labels, 15, 0, "split", "x")
    assert np.array_equal(tr, tr2) and np.array_equal(te, te2)
    assert len(tr) == 15 and len(te) == 10 and not set(tr) & set(te)
    assert np.array_equal(np.sort(np.concatenate([tr, te])), np.arange(labels.size))
    assert np.all(np.diff(tr) > 0)
    assert np.all(np.abs(np.bincount(labels[tr]) - np.bincount(labels) * 15 / 25) < 1)
    other, _ = stratified_split(labels, 15, 1, "split", "x")
    assert not np.array_equal(tr, other)


def test_embedded_digits():
    train, test, everything = (load_embedded_digits(s) for s in ("train", "test", "all"))
    assert train.images.shape == (1200, 16, 16, 3) and test.images.shape == (597, 16, 16, 3)
    assert everything.images.shape == (1797, 16, 16, 3) and everything.images.dtype == np.uint8
    assert everything.images.max() == 255 and everything.images.min() == 0
    assert (np.bincount(train.labels) + np.bincount(test.labels)).tolist() == np.bincount(everything.labels).tolist()
    np.testing.assert_array_equal(load_embedded_digits("train").images, train.images)
    assert load_embedded_digits("test", size=8).images.shape == (597, 8, 8, 3)
    with pytest.raises(ValueError):
        load_embedded_digits("val")
