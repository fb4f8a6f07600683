"""The server's upload checks beyond NaN (``engine.uploads``): shape, dtype, BN variances and magnitude.

One client (1 of 4) uploads finite garbage: it must be rejected (no weight, its own model) and the others must
get exactly what they get when that client's upload is NaN (the rejection path that already worked), on both
backends, with the same rejections; honest clients on real streams are never rejected.
"""
import logging
import math
from functools import lru_cache

import numpy as np
import pytest
import torch

from ftta_core.corruptions import CORRUPTIONS, corrupt
from ftta_core.data import load_embedded_digits
from ftta_core.loop import Engine
from ftta_core.engine.mixing import validate_uploads as validate_per_client
from ftta_core.engine.uploads import (UploadGate, UploadPolicy, UploadSchema, by_name, reference_values,
                                      validate_uploads)
from ftta_core.strategies import build_strategy
from ftta_core.stream import StreamBatch
from ftta_core.training import load_source_model
from ftta_core.tta import build_local

from conftest import shifted_batches

BAD, KEEP = 1, [0, 2, 3]
LOCALS = {"bn": ("bn", {}), "tent": ("tent", {"params": "all", "lr": 1e-3}),
          "tent_running": ("tent", {"params": "all", "lr": 1e-3, "bn": "running"}),
          # the Table 1 TTA-grad configuration whose honest FedCTTA clients the former probe_mean bound rejected
          "tent_adam_running": ("tent", {"params": "all", "optimizer": "adam", "lr": 3e-4, "bn": "running"}),
          "rotta": ("rotta", {"memory_size": 8, "update_frequency": 4})}
STRATEGY_PARAMS = {"fedtsa": {"server_steps": 5}}
UPLOAD_OF = {"fedtsa": "indicator", "fedamp": "indicator", "fedctta": "probe_mean"}


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one thread (and FedTSA's rounds are single-threaded anyway)."""


def _scale_row(v: torch.Tensor, factor: float) -> torch.Tensor:
    f = torch.where(torch.arange(v.shape[0]) == BAD, factor, 1.0).to(v.dtype).view(-1, *[1] * (v.dim() - 1))
    return v * f


def _nan_row(v: torch.Tensor) -> torch.Tensor:
    v = v.clone()
    v[BAD] = float("nan")
    return v


def _negative_variance(v: torch.Tensor) -> torch.Tensor:
    v = v.clone()
    v[BAD, 1] = -1.0
    return v


def _per_client(change):
    """Return one name as N per-client tensors (as a network server receives them), client 1's changed."""
    def apply(v: torch.Tensor):
        rows = list(v.unbind(0))
        rows[BAD] = change(rows[BAD])
        return rows
    return apply


# fault -> (local method, 'state' or 'uploads', which names, change of the stacked value)
FAULTS = {
    "params_x1e30": ("tent", "state", "all", lambda v: _scale_row(v, 1e30)),
    "negative_variance": ("bn", "state", "all", _negative_variance),
    "upload_x10": ("bn", "uploads", "all", lambda v: _scale_row(v, 10.0)),
    "upload_x1e15": ("bn", "uploads", "all", lambda v: _scale_row(v, 1e15)),
    "wrong_shape": ("bn", "state", "one", _per_client(lambda r: torch.cat([r, r[..., :1]], -1))),
    "wrong_dtype": ("bn", "state", "one", _per_client(lambda r: r.double())),
}


def faulty(local_key: str, strategy: str, where: str = "", names: str = "", change=None, policy=None,
           backend: str = "vectorized", n_clients: int = 4) -> Engine:
    """An engine whose local method's ``shared_state`` or strategy's ``client_uploads`` passes through ``change``
    (on every name, or on the second name only)."""
    name, params = LOCALS[local_key]
    local, strat = build_local(name, **params), build_strategy(strategy, **STRATEGY_PARAMS.get(strategy, {}))
    if change is not None:
        obj, attr = (local, "shared_state") if where == "state" else (strat, "client_uploads")
        original = getattr(obj, attr)

        def changed(*args):
            out = dict(original(*args))
            targets = sorted(out) if names == "all" else sorted(out)[1:2]
            return {k: change(v) if k in targets else v for k, v in out.items()}

        setattr(obj, attr, changed)
    torch.manual_seed(0)
    return Engine(_source_model(), local, strat, n_clients, backend, upload_policy=policy)


@lru_cache(maxsize=1)
def _source_model():
    return load_source_model("digits_cnn_embedded")


@lru_cache(maxsize=None)
def _batches(n_clients=4, steps=2):
    return shifted_batches(n_clients=n_clients, batch=8, steps=steps)


def run(engine: Engine, keep=None):
    out = []
    for b in _batches():
        if keep is not None:
            b = StreamBatch(b.step, b.images[keep], b.labels[keep], b.domains[keep], b.indices[keep])
        out.append(engine.step(b))
    return out


# FedCTTA's probe logits x10 are within its 100x bound (``UploadPolicy``): the liar isolates itself instead
# (test_fedctta_probe_scale_lie_isolates_the_liar); x1e15 is still rejected
CASES = [(s, f) for s in ("fedavg", "fedtsa", "fedamp", "fedctta") for f in FAULTS
         if not (s == "fedavg" and FAULTS[f][1] == "uploads") and (s, f) != ("fedctta", "upload_x10")]


@pytest.mark.parametrize("strategy,fault", CASES, ids=[f"{s}-{f}" for s, f in CASES])
def test_one_faulty_client_is_rejected_and_the_others_are_unaffected(strategy, fault, caplog):
    local_key, where, names, change = FAULTS[fault]
    results = {}
    for backend in ("loop", "vectorized"):
        with caplog.at_level(logging.WARNING, logger="ftta_core.loop"):
            caplog.clear()
            results[backend] = run(faulty(local_key, strategy, where, names, change, backend=backend))
            lines = [r.getMessage() for r in caplog.records if "rejected uploads" in r.getMessage()]
        assert len(lines) == len(_batches()) and all("client 1:" in line and "client 0" not in line for line in lines)
        # the same fault as NaN: the rejection that already worked is the reference for everyone else
        nan_names = names if fault not in ("wrong_shape", "wrong_dtype") else "one"
        reference = run(faulty(local_key, strategy, where, nan_names, _nan_row, backend=backend))
        for got, ref in zip(results[backend], reference):
            assert got.rejected.tolist() == [False, True, False, False]
            assert ref.rejected.tolist() == [False, True, False, False]
            assert got.weights[BAD, BAD] == 1 and (got.weights[KEEP, BAD] == 0).all()
            assert np.array_equal(got.weights, ref.weights)
            assert (got.correct_mixed[KEEP] == ref.correct_mixed[KEEP]).all()
        if strategy != "fedtsa":  # FedTSA's server memory still holds client 1's last accepted row (zeros)
            alone = run(faulty(local_key, strategy, backend=backend, n_clients=3), keep=KEEP)
            for got, ref in zip(results[backend], alone):
                assert (got.correct_mixed[KEEP] == ref.correct_mixed).all()
                assert np.allclose(got.weights[np.ix_(KEEP, KEEP)], ref.weights, atol=1e-6)
    for a, b in zip(results["loop"], results["vectorized"]):  # both backends reject the same clients
        assert a.rejected.tolist() == b.rejected.tolist()
        assert np.allclose(a.weights, b.weights, atol=1e-5)


def test_fedctta_probe_scale_lie_isolates_the_liar():
    """A client sending its probe logits x10 is not rejected, and W gives it ~no weight in the others' rows: a
    scale lie on the statistic that only sets W moves the liar away from everyone (why ``probe_mean`` has 100x)."""
    for backend in ("loop", "vectorized"):
        honest = run(faulty("bn", "fedctta", backend=backend))
        lied = run(faulty("bn", "fedctta", "uploads", "all", lambda v: _scale_row(v, 10.0), backend=backend))
        for got, ref in zip(lied, honest):
            assert not got.rejected.any()
            assert (got.weights[KEEP, BAD] < 1e-6).all() and got.weights[BAD, BAD] > 0.999
            # with the liar's weight moved to the honest clients, they stay at least as close to each other
            assert (got.weights[np.ix_(KEEP, KEEP)].sum(1) >= ref.weights[np.ix_(KEEP, KEEP)].sum(1) - 1e-6).all()


def test_probe_mean_bound_admits_a_confident_honest_client_and_rejects_a_blow_up():
    """The scales of the honest FedCTTA TTA-grad client the former 8x bound rejected (stored run 61bd0146a53079ba,
    step 740: 43.4 against a median of ~4.65, 9.3x) pass for ``probe_mean`` and are still caught for a mixed
    statistic; 150x is caught for both."""
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(20, 10, generator=gen, dtype=torch.float64)
    base = base / base.norm(dim=1, keepdim=True) * math.sqrt(10)  # every row RMS 1
    for factor, probe_ok in ((9.3, True), (150.0, False)):
        scales = torch.tensor([4.65] * 19 + [4.65 * factor], dtype=torch.float64)
        rows = base * scales[:, None]
        probe = validate_uploads({}, {"probe_mean": rows})
        mixed = validate_uploads({}, {"feature_mean": rows})
        assert probe.valid[:19].all() and bool(probe.valid[19]) == probe_ok
        assert mixed.valid[:19].all() and not mixed.valid[19]
        if not probe_ok:
            assert "100x" in probe.reasons[19] and "probe_mean" in probe.reasons[19]


HONEST = [(lk, s) for lk in ("bn", "tent", "tent_running", "tent_adam_running", "rotta")
          for s in ("fedavg", "fedtsa", "fedamp", "fedctta", "pfedgraph")]


@pytest.mark.parametrize("local_key,strategy", HONEST, ids=[f"{a}-{b}" for a, b in HONEST])
def test_honest_clients_are_never_rejected(local_key, strategy):
    eng = faulty(local_key, strategy)
    for b in shifted_batches(n_clients=4, batch=8, steps=4):
        assert not eng.step(b).rejected.any()


def test_honest_clients_on_sixteen_domains_are_not_rejected(digits_model):
    """Clean + the 15 corruptions at severity 5, one client each, batches of 4: the widest honest spread of scales
    (FedCTTA's probe logits of TTA-bn clients, ~5.7x) stays within the bounds."""
    data = load_embedded_digits("test")
    domains = ["clean", *CORRUPTIONS]
    n, b = len(domains), 4
    rng = np.random.default_rng(0)
    for local_key, strategy in (("bn", "fedctta"), ("bn", "fedtsa"), ("tent", "fedamp")):
        eng = faulty(local_key, strategy, n_clients=n)
        for t in range(2):
            idx = rng.choice(len(data), (n, b), replace=False)
            x, y = data.tensors(idx.reshape(-1))
            x = x.view(n, b, *x.shape[1:])
            x = torch.stack([x[i] if d == "clean" else corrupt(x[i], d, 5, 100 * t + i) for i, d in enumerate(domains)])
            res = eng.step(StreamBatch(t, x, y.view(n, b), np.arange(n), idx))
            assert not res.rejected.any(), (local_key, strategy, t)


def test_magnitude_check_can_be_turned_off():
    off = UploadPolicy(magnitude=False)
    res = run(faulty("bn", "fedtsa", "uploads", "all", lambda v: _scale_row(v, 10.0), policy=off))
    assert not any(r.rejected.any() for r in res)
    res = run(faulty("bn", "fedavg", "state", "all", _negative_variance, policy=off))
    assert all(r.rejected.tolist() == [False, True, False, False] for r in res)


def test_policy_validation():
    for kwargs in ({"max_ratio": 1.0}, {"max_ratio_by_name": {"indicator": 0.5}}, {"max_source_ratio": 0.1},
                   {"floor": -1.0}, {"min_clients": 1}):
        with pytest.raises(ValueError):
            UploadPolicy(**kwargs)


def test_validate_uploads_rules():
    gen = torch.Generator().manual_seed(0)
    ind = torch.rand(5, 16, generator=gen) + 0.5
    # identical clients, all-zero clients: never rejected
    assert validate_uploads({}, {"indicator": ind[:1].expand(5, 16)}).valid.all()
    assert validate_uploads({}, {"indicator": torch.zeros(5, 16)}).valid.all()
    # x10 indicator rejected with a reason; an absent client is neither checked nor rejected
    bad = ind.clone()
    bad[2] *= 10
    bad[4] *= 1e15
    present = torch.tensor([True, True, True, True, False])
    valid, reasons = validate_uploads({}, {"indicator": bad}, present)
    assert valid.tolist() == [True, True, False, True, False] and set(reasons) == {2}
    assert "indicator" in reasons[2] and "median" in reasons[2]
    # two clients: no median to trust, only the source-model bound (state entries with a namesake)
    two = {"w": torch.stack([torch.ones(3), 1e30 * torch.ones(3)])}
    assert validate_uploads(two, {}).valid.all()
    valid, reasons = validate_uploads(two, {}, reference={"w": torch.ones(3)})
    assert valid.tolist() == [True, False] and "source model" in reasons[1]
    # negative variance in BN statistics [N, 2, C] only (a parameter may be negative)
    stats = torch.rand(4, 2, 3, generator=gen) + 0.1
    stats[3, 1, 0] = -0.01
    valid, reasons = validate_uploads({"bn1": stats, "bn1.weight": -torch.ones(4, 2, 3)}, {})
    assert valid.tolist() == [True, True, True, False] and "negative variance" in reasons[3]
    # per-client uploads: shape and dtype against the majority (first step) or a given schema
    rows = [torch.ones(3), torch.ones(4), torch.ones(3, dtype=torch.float64), None, torch.ones(3)]
    valid, reasons = validate_uploads({"m": rows})
    assert valid.tolist() == [True, False, False, False, True]
    assert "shape" in reasons[1] and "dtype" in reasons[2] and "missing" in reasons[3]
    schema = UploadSchema({"m": ((4,), torch.float32)})
    valid, reasons = validate_uploads({"m": rows}, schema=schema)
    assert valid.tolist() == [False, True, False, False, False]
    # a stacked upload of another shape than the schema's rejects every present client
    valid, reasons = validate_uploads({"m": torch.ones(3, 3)}, schema=schema)
    assert not valid.any() and all("shape" in r for r in reasons.values())


def test_the_per_client_form_is_the_same_checker():
    """``mixing.validate_uploads`` (the per-client form a network server receives) applies the same checks."""
    ups = [{"indicator": torch.full((8,), 1.0 + 0.1 * i)} for i in range(4)] + [{"indicator": torch.full((8,), 30.0)}]
    stacked, valid, reasons = validate_per_client(ups, {"indicator": (8,)})
    assert valid.tolist() == [True] * 4 + [False] and "median" in reasons[4]
    assert (stacked["indicator"][4] == 0).all()
    again = validate_uploads({}, by_name(ups))
    assert torch.equal(again.valid, valid) and again.reasons == reasons


def test_gate_learns_the_schema_and_fills_unreadable_rows_from_the_source(digits_model):
    ref = reference_values(digits_model)
    gate = UploadGate(reference=ref)
    stats = {"block1.1": ref["block1.1"].expand(4, 2, 32).clone()}
    assert gate.check(stats, {}, torch.ones(4, dtype=torch.bool)).valid.all()
    rows = list(stats["block1.1"].unbind(0))
    rows[BAD] = torch.zeros(2, 33)
    state, _, valid, reasons = gate.check({"block1.1": rows}, {}, torch.ones(4, dtype=torch.bool))
    assert valid.tolist() == [True, False, True, True] and "shape" in reasons[BAD]
    assert torch.equal(state["block1.1"][BAD], ref["block1.1"])
