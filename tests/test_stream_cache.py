"""The corrupted-image cache of CorruptedDomains: checksummed, self-repairing, safe for concurrent writers."""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from ftta_core.data import load_embedded_digits
from ftta_core.data.cache import atomic_write, checksum_path, save_checked
from ftta_core.stream import CorruptedDomains

NAMES = ["gaussian_noise", "contrast", "fog", "brightness"]


def tiny_base():
    """24 embedded digits (16x16): every domain is generated in milliseconds."""
    return load_embedded_digits("test").subset(np.arange(24), name="tiny_digits")


@pytest.fixture(scope="module")
def base():
    return tiny_base()


def domains(base, cache_dir):
    return CorruptedDomains(base, NAMES, 5, seed=3, cache_dir=cache_dir)


def reference(base, domain=0):
    """The domain generated without any cache."""
    return CorruptedDomains(base, NAMES, 5, seed=3).domain_images(domain)


def cache_file(base, cache_dir, domain=0) -> Path:
    path = domains(base, cache_dir)._cache_path(NAMES[domain])
    assert path is not None and path.parent == Path(cache_dir)
    return path


def fill(base, cache_dir, domain=0) -> Path:
    """Fill the cache for one domain (no warnings allowed) and return its file."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        domains(base, cache_dir).domain_images(domain)
    return cache_file(base, cache_dir, domain)


def load_quietly(base, cache_dir, domain=0) -> np.ndarray:
    """A fresh instance's domain, failing on any warning (i.e. the file passed its check)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return domains(base, cache_dir).domain_images(domain)


def rebuilt(base, cache_dir, path: Path, reason: str, domain=0) -> np.ndarray:
    """A fresh instance's domain, expecting one warning that names ``path`` and matches ``reason``."""
    with pytest.warns(UserWarning, match=re.escape(str(path)) + ".*" + reason):
        return domains(base, cache_dir).domain_images(domain)


def test_cache_writes_array_and_checksum_and_reads_them_back(base, tmp_path):
    path = fill(base, tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted([path.name, checksum_path(path).name])
    facts = json.loads(checksum_path(path).read_text())
    assert facts["shape"] == list(base.images.shape) and facts["dtype"] == "uint8" and len(facts["sha256"]) == 64
    np.testing.assert_array_equal(load_quietly(base, tmp_path), reference(base))


def test_truncated_file_is_rebuilt_with_a_warning_and_identical_content(base, tmp_path):
    path = fill(base, tmp_path)
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    arr = rebuilt(base, tmp_path, path, "unreadable")
    np.testing.assert_array_equal(arr, reference(base))  # generation is seeded per image: same pixels
    assert path.read_bytes() == good  # repaired on disk
    np.testing.assert_array_equal(load_quietly(base, tmp_path), arr)


@pytest.mark.parametrize("zeroed", ["all_zero_bytes", "zero_pixels_valid_npy", "zeroed_checksum_file"])
def test_zeroed_file_is_rebuilt(base, tmp_path, zeroed):
    path = fill(base, tmp_path)
    good = path.read_bytes()
    if zeroed == "all_zero_bytes":
        path.write_bytes(bytes(len(good)))
        reason = "unreadable"
    elif zeroed == "zero_pixels_valid_npy":
        np.save(path, np.zeros_like(base.images))
        reason = "sha256"
    else:
        sidecar = checksum_path(path)
        sidecar.write_bytes(bytes(len(sidecar.read_bytes())))
        reason = "unreadable"
    arr = rebuilt(base, tmp_path, path, reason)
    np.testing.assert_array_equal(arr, reference(base))
    assert path.read_bytes() == good
    load_quietly(base, tmp_path)


def test_wrong_shape_and_foreign_checksum_are_rebuilt(base, tmp_path):
    path = fill(base, tmp_path)
    save_checked(path, reference(base)[:5])  # self-consistent file and sidecar, but not this base set's shape
    np.testing.assert_array_equal(rebuilt(base, tmp_path, path, "shape"), reference(base))
    np.save(path, reference(base, domain=1))  # another domain's pixels under this name: right shape, wrong hash
    np.testing.assert_array_equal(rebuilt(base, tmp_path, path, "sha256"), reference(base))
    load_quietly(base, tmp_path)


def test_file_written_by_the_old_code_without_checksum_is_rebuilt(base, tmp_path):
    path = cache_file(base, tmp_path)
    np.save(path, np.zeros_like(base.images))  # the old cache trusted any .npy under the name
    arr = rebuilt(base, tmp_path, path, "no checksum file")
    np.testing.assert_array_equal(arr, reference(base))
    assert checksum_path(path).is_file()
    load_quietly(base, tmp_path)


def test_writers_of_the_same_file_never_share_a_temporary_name(tmp_path):
    """A second writer starts and finishes while the first is mid-write: with one fixed temporary name it would
    truncate the first one's file and the first rename would fail."""
    path = tmp_path / "x.npy"

    def outer(fh):
        fh.write(b"outer-part-1 ")
        atomic_write(path, lambda inner: inner.write(b"inner"))
        fh.write(b"outer-part-2")

    atomic_write(path, outer)
    assert path.read_bytes() == b"outer-part-1 outer-part-2"
    assert os.listdir(tmp_path) == ["x.npy"]


def _fill_in_process(cache_dir: str, barrier, out: str) -> None:
    """Worker: fill every domain of a cold cache after the other worker is ready; no warning is allowed."""
    warnings.simplefilter("error")
    d = CorruptedDomains(tiny_base(), NAMES, 5, seed=3, cache_dir=Path(cache_dir))
    barrier.wait(timeout=300)
    np.save(out, np.stack([d.domain_images(i) for i in range(len(NAMES))]))


@pytest.mark.slow  # starts real processes: make test, not make test-fast
def test_two_processes_filling_a_cold_cache_both_succeed_with_identical_arrays(base, tmp_path):
    cache = tmp_path / "cache"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    outs = [tmp_path / f"out{i}.npy" for i in range(2)]
    procs = [ctx.Process(target=_fill_in_process, args=(str(cache), barrier, str(o))) for o in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    assert [p.exitcode for p in procs] == [0, 0]
    a, b = (np.load(o) for o in outs)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a[0], reference(base))
    files = {cache_file(base, cache, i) for i in range(len(NAMES))}
    assert sorted(os.listdir(cache)) == sorted([p.name for p in files] + [checksum_path(p).name for p in files])
    for i in range(len(NAMES)):  # every stored file passes its check and holds the same pixels
        np.testing.assert_array_equal(load_quietly(base, cache, i), a[i])
