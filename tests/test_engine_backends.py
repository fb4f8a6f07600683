"""The vectorized backend agrees with the per-client loop backend (the specification)."""
import pytest
import torch

from ftta_core.engine.bank import OptimizerSpec, make_bank
from ftta_core.loop import Engine
from ftta_core.models import build_model
from ftta_core.strategies import STRATEGIES, build_strategy
from ftta_core.tta import LOCAL_METHODS, build_local, select_parameters

from conftest import assert_runs_agree, shifted_batches

LOCAL_CONFIGS = {
    "source": {},
    "bn": {},
    "tent": {"params": "all", "optimizer": "sgd", "lr": 1e-3},
    "tent_bn_affine": {"params": "bn_affine", "optimizer": "adam", "lr": 1e-3},
    "pl": {"params": "all", "optimizer": "adam", "lr": 1e-4},
    "tent_running": {"params": "all", "optimizer": "adam", "lr": 1e-4, "bn": "running"},
    "pl_running": {"params": "all", "optimizer": "sgd", "lr": 1e-3, "bn": "running"},
    "eata": {"fisher_source": "digits_cnn_embedded", "fisher_samples": 48, "fisher_batch": 16},
    "cotta": {"optimizer": "sgd", "lr": 1e-3, "n_augmentations": 2},
    "roid": {},
    "rotta": {"memory_size": 8, "update_frequency": 4},
    "bbn": {"bn_momentum": 0.1},
    "tentprox": {"params": "all", "optimizer": "sgd", "lr": 1e-3, "mu": 10.0},
    "rdumb": {"params": "all", "optimizer": "adam", "lr": 1e-4, "bn": "running", "reset_every": 2},
    "tentrestore": {"params": "all", "optimizer": "adam", "lr": 1e-4, "p": 0.2},
}
# the paper's options of EATA (skip_empty) and ROID (augment_kept_only) are checked on both backends with FedAvg in
# tests/test_tta_methods.py (test_paper_options_backends_agree_with_fedavg): every strategy again would cost minutes


# keep the server-side training short in these agreement tests
STRATEGY_PARAMS = {"fedtsa": {"server_steps": 5}}


def method_name(key):
    """The local method a LOCAL_CONFIGS key configures (keys add a variant after an underscore)."""
    return key.split("_")[0]


def local_for(key):
    return build_local(method_name(key), **LOCAL_CONFIGS[key])


def run(model, local_key, strategy, backend, batches):
    """Step results and the clients' shared state (what they upload next) after every step."""
    torch.manual_seed(0)
    eng = Engine(model, local_for(local_key), build_strategy(strategy, **STRATEGY_PARAMS.get(strategy, {})),
                 n_clients=4, backend=backend)
    out = []
    for b in batches:
        res = eng.step(b)
        out.append((res, eng.local.shared_state(eng.bank)))
    return out


def test_every_local_method_has_a_backend_case():
    assert set(LOCAL_METHODS) <= {method_name(k) for k in LOCAL_CONFIGS}


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("local_key", sorted(LOCAL_CONFIGS))
def test_backends_agree(digits_model, local_key, strategy):
    """Same predictions (exactly), W (atol 1e-5) and uploads (atol 1e-4) for every local method x strategy.

    Tolerance: the two backends sum the same products in different orders (grouped conv vs per-client conv),
    so values differ at float32 rounding level (~1e-6); predictions of the trained model are not that close.
    """
    batches = shifted_batches()
    loop = run(digits_model, local_key, strategy, "loop", batches)
    vec = run(digits_model, local_key, strategy, "vectorized", batches)
    assert_runs_agree(loop, vec)


@pytest.mark.parametrize("params", ["bn_affine", "all"])
@pytest.mark.parametrize("opt", [OptimizerSpec("sgd", 1e-3, momentum=0.9), OptimizerSpec("adam", 1e-3)])
def test_banks_agree_on_outputs_stats_and_parameters(params, opt):
    """Logits, BN statistics and updated parameters of a ResNet-8 after 3 steps agree to 1e-9 in float64.

    In float64 the backends agree to ~1e-13: they compute the same function, summing in different orders.
    (In float32 Adam amplifies rounding-level gradient differences into lr-sized steps after a few updates,
    so a float32 comparison would test rounding, not the backends.)
    """
    torch.manual_seed(0)
    model = build_model("resnet8").eval().double()
    x = torch.rand(3, 4, 3, 32, 32, dtype=torch.float64)

    def ent(out, p, x, clients):
        return -(out.logits.softmax(-1) * out.logits.log_softmax(-1)).sum(-1).mean(1)

    trainable = select_parameters(model, params)
    banks = [make_bank(b, model, 3, trainable, opt) for b in ("loop", "vectorized")]
    outs = [[bank.adapt(x, ent) for _ in range(3)] for bank in banks]
    for a, b in zip(*outs):
        assert torch.allclose(a.logits, b.logits, atol=1e-9)
        assert torch.allclose(a.features, b.features, atol=1e-9)
    pa, pb = (bank.get_params() for bank in banks)
    assert set(pa) == set(trainable)
    assert all(torch.allclose(pa[k], pb[k], atol=1e-9) for k in pa)
    assert not all(torch.equal(pa[k][0], pa[k][1]) for k in pa)  # clients adapted differently
    sa, sb = (bank.bn_stats() for bank in banks)
    assert all(torch.allclose(sa[k], sb[k], atol=1e-9) for k in sa)
    mixed = {k: v.mean(0, keepdim=True).expand_as(v) for k, v in sa.items()}
    for bank in banks:
        bank.set_bn_stats(mixed)
    ga, gb = (bank.forward(x, "given").logits for bank in banks)
    assert torch.allclose(ga, gb, atol=1e-9)
    sr, sv = (bank.forward(x, "source").logits for bank in banks)
    assert torch.allclose(sr, sv, atol=1e-9)
