"""Streams: per-step batches [N,B,C,H,W], same indices under every corruption, reproducible, cached."""
import numpy as np
import pytest
import torch

from ftta_core.data import load_embedded_digits
from ftta_core.scenarios import client_image_pools, fedtsa_scenario
from ftta_core.stream import CLEAN, CorruptedDomains, Stream


@pytest.fixture(scope="module")
def digits():
    return load_embedded_digits("test")


def make_stream(digits, tmp_path=None, seed=0):
    names = ["fog", "contrast", "frost", CLEAN]
    sc = fedtsa_scenario(names, niid=True, n_clients=4, batch_size=5, images_per_domain=20, slot_steps=4)
    domains = CorruptedDomains(digits, names, 5, seed=seed, cache_dir=tmp_path)
    return Stream(sc, domains, client_image_pools(len(digits), 4, 20, seed))


def test_batches_shape_labels_and_domains(digits):
    st = make_stream(digits)
    assert len(st) == 16
    b = st.batch(5)
    assert b.images.shape == (4, 5, 3, 16, 16) and b.images.dtype == torch.float32
    assert 0 <= float(b.images.min()) and float(b.images.max()) <= 1
    assert (b.labels.numpy() == digits.labels[b.indices]).all()
    assert list(b.domains) == list(st.scenario.domains_at(5))


def test_each_client_walks_its_pool_with_the_same_indices_under_every_domain(digits):
    st = make_stream(digits)
    seen = {}
    for t in range(len(st)):
        idx = st.indices_at(t)
        for i, d in enumerate(st.scenario.domains_at(t)):
            seen.setdefault((i, int(d)), []).extend(idx[i].tolist())
    for i in range(4):
        per_domain = [sorted(seen[(i, d)]) for d in range(4)]
        assert all(p == sorted(st.pools[i].tolist()) for p in per_domain)


def test_same_seed_same_pixels_and_cache_roundtrip(digits, tmp_path):
    a = make_stream(digits, tmp_path, seed=1).batch(3).images
    assert list(tmp_path.glob("*.npy"))
    b = make_stream(digits, tmp_path, seed=1).batch(3).images  # read back from the cache
    c = make_stream(digits, None, seed=1).batch(3).images  # regenerated
    assert torch.equal(a, b) and torch.equal(a, c)
    assert not torch.equal(a, make_stream(digits, None, seed=2).batch(3).images)


def test_clean_domain_is_the_base_images(digits):
    st = make_stream(digits)
    t = next(t for t in range(len(st)) if (st.scenario.domains_at(t) == 3).any())
    b = st.batch(t)
    i = int(np.flatnonzero(b.domains == 3)[0])
    expected = torch.from_numpy(digits.images[b.indices[i]]).permute(0, 3, 1, 2).float() / 255
    assert torch.equal(b.images[i], expected)


def test_bad_inputs(digits):
    with pytest.raises(ValueError, match="unknown corruption"):
        CorruptedDomains(digits, ["smog"], 5)
    with pytest.raises(ValueError, match="severity"):
        CorruptedDomains(digits, ["fog"], 6)
    st = make_stream(digits)
    with pytest.raises(IndexError):
        st.batch(len(st))
