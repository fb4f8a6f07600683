"""Robust mixing (``engine.robust``) and attack injection (``engine.attacks``).

The robust statistics are checked against plain per-row, per-coordinate float64 references written independently
(the weighted median as the midpoint of the minimisers of sum_j w_j |x - v_j|; the trimmed mean by integrating the
weighted quantile function); both backends agree with robust mixing on; W is what the strategy computed; with it
off everything is bit for bit as before; each attack rewrites exactly the attackers' rows; config errors are one
line naming the field; and on a real stream robust mixing limits what one attacker does to the honest clients.
"""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ftta_core.engine.attacks import ATTACKS, Attack, parse_attack
from ftta_core.engine.average import mix_models
from ftta_core.engine.mixing import mix_state
from ftta_core.engine.robust import (RobustMixing, parse_robust_mixing, weighted_median,
                                     weighted_trimmed_mean)
from ftta_core.engine.uploads import reference_values
from ftta_core.experiment import ExperimentConfig, identity_of, run_experiment
from ftta_core.loop import Engine
from ftta_core.strategies import build_strategy
from ftta_core.strategies.base import Strategy, set_robust_mixing, weighted_mean_state
from ftta_core.strategies.basic import FedAvg
from ftta_core.tta import build_local

from conftest import assert_runs_agree, shifted_batches

REPO = Path(__file__).resolve().parents[1]
MODES = ["median", "trimmed:0.1", "trimmed:0.3", "clip:2"]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny tensors: one thread."""


# ---------------------------------------------------------------------------------------------------------------
# float64 references, one coordinate at a time

def median_reference(v: np.ndarray, w: np.ndarray) -> float:
    """Weighted median of values ``v`` with weights ``w``, times sum(w): the midpoint of the interval of minimisers
    of f(x) = sum_j w_j |x - v_j| (its ends are values with a positive weight)."""
    total = w.sum()
    cand = v[w > 0]
    f = np.array([(w * np.abs(x - v)).sum() for x in cand])
    best = cand[f <= f.min() + 1e-12 * max(1.0, abs(f.min()))]
    return (best.min() + best.max()) / 2 * total


def trimmed_reference(v: np.ndarray, w: np.ndarray, beta: float) -> float:
    """(1 / (1 - 2 beta)) x the integral of the weighted quantile function over [beta, 1 - beta], times sum(w)."""
    total = w.sum()
    order = np.argsort(v, kind="stable")
    acc, start = 0.0, 0.0
    for j in order:
        end = start + w[j] / total
        overlap = max(0.0, min(end, 1 - beta) - max(start, beta))
        acc += overlap * v[j]
        start = end
    return acc / (1 - 2 * beta) * total


def rows_reference(values: np.ndarray, weights: np.ndarray, mode: str) -> np.ndarray:
    out = np.zeros((weights.shape[0], values.shape[1]))
    for i, w in enumerate(weights):
        for m in range(values.shape[1]):
            out[i, m] = (median_reference(values[:, m], w) if mode == "median"
                         else trimmed_reference(values[:, m], w, float(mode.split(":")[1])))
    return out


def random_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """Rows of W: uniform, with zeros, peaked on the diagonal, one weight on one client, random."""
    w = rng.random((n, n))
    w[1, [0, 2]] = 0.0
    w[2] = 0.0
    w[2, 2] = 1.0
    w[3] = 1.0
    w[4] = np.where(np.arange(n) == 4, 5.0, 1.0)
    return w / w.sum(1, keepdims=True)


@pytest.mark.parametrize("mode", ["median", "trimmed:0.0", "trimmed:0.1", "trimmed:0.25", "trimmed:0.45"])
@pytest.mark.parametrize("n", [5, 6, 9])
def test_robust_statistics_match_the_float64_reference(mode, n):
    rng = np.random.default_rng(n)
    values = rng.normal(size=(n, 11))
    values[:, 3] = 1.5           # all equal
    values[: n // 2, 4] = -2.0   # a tie block
    values[n - 1, 5] = 1e3       # an outlier
    weights = random_rows(rng, n)
    v, w = torch.from_numpy(values), torch.from_numpy(weights)
    got = (weighted_median(v, w) if mode == "median" else weighted_trimmed_mean(v, w, float(mode.split(":")[1])))
    np.testing.assert_allclose(got.numpy(), rows_reference(values, weights, mode), rtol=1e-10, atol=1e-10)


def test_equal_weights_give_numpys_median_and_ties_at_half_the_midpoint():
    rng = np.random.default_rng(0)
    for n in (4, 7, 20):
        values = rng.normal(size=(n, 30))
        w = torch.full((1, n), 1.0 / n, dtype=torch.float64)
        np.testing.assert_allclose(weighted_median(torch.from_numpy(values), w)[0].numpy(), np.median(values, 0),
                                   rtol=1e-12, atol=1e-12)
    # weights 0.5 / 0.5: the minimisers are [1, 3]; a zero-weight value is never the median
    v = torch.tensor([[1.0], [3.0], [100.0]], dtype=torch.float64)
    assert float(weighted_median(v, torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64))) == 2.0
    assert float(weighted_median(v, torch.tensor([[0.2, 0.2, 0.6]], dtype=torch.float64))) == 100.0
    # an unnormalised row: s times the statistic of the normalised row
    assert float(weighted_median(v, torch.tensor([[0.25, 0.25, 0.0]], dtype=torch.float64))) == 1.0


@pytest.mark.parametrize("mode", ["median", "trimmed:0.2"])
def test_robust_mix_uses_row_i_of_w_for_row_i(mode):
    rng = np.random.default_rng(1)
    n = 6
    weights = torch.from_numpy(random_rows(rng, n)).float()
    state = {"a": torch.randn(n, 2, 3), "b": torch.randn(n, 4, dtype=torch.float64)}
    mixed = parse_robust_mixing(mode).mix(state, weights)
    for k, t in state.items():
        want = rows_reference(t.reshape(n, -1).double().numpy(), weights.double().numpy(), mode)
        assert mixed[k].dtype == t.dtype and mixed[k].shape == t.shape
        np.testing.assert_allclose(mixed[k].reshape(n, -1).double().numpy(), want, rtol=1e-5, atol=1e-6)
    # a common row (FedAvg) is computed once and gives every client the same values
    common = parse_robust_mixing(mode).mix(state, torch.full((n, n), 1.0 / n))
    assert all(bool((v == v[:1]).all()) for v in common.values())


def test_a_nan_row_with_zero_weight_does_not_leak():
    state = {"a": torch.tensor([[1.0, 2.0], [float("nan"), float("inf")], [3.0, 4.0], [5.0, 6.0]])}
    w = torch.tensor([[0.5, 0.0, 0.25, 0.25], [0.0, 1.0, 0.0, 0.0], [1 / 3, 0, 1 / 3, 1 / 3], [1 / 3, 0, 1 / 3, 1 / 3]])
    for mode in MODES:
        out = parse_robust_mixing(mode, reference={"a": torch.zeros(2)}).mix(state, w)["a"]
        assert torch.isfinite(out[[0, 2, 3]]).all(), mode


# ---------------------------------------------------------------------------------------------------------------
# norm clipping

def test_clipping_bounds_each_deviation_by_c_times_the_median_norm_and_keeps_the_own_term():
    ref = torch.zeros(3)
    devs = torch.tensor([[1.0, 0, 0], [0, 2.0, 0], [0, 0, 3.0], [40.0, 0, 0], [0, -0.5, 0]])  # norms 1, 2, 3, 40, .5
    state = {"layer.weight": devs.clone()}
    n = 5
    w = torch.full((n, n), 1.0 / n)
    out = RobustMixing("clip", clip=2.0, reference={"layer.weight": ref}).mix(state, w)["layer.weight"]
    # median norm over the 5 clients: 2 -> bound 4: client 3's deviation becomes (4, 0, 0), the others as they are
    clipped = devs.clone()
    clipped[3] = torch.tensor([4.0, 0, 0])
    want = clipped.mean(0, keepdim=True).expand(n, -1).clone()
    want[3] += (devs[3] - clipped[3]) / n  # client 3's own term is its own value, unclipped
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    # W = I (Local): nobody takes anything from anybody: every client keeps its value exactly
    local = RobustMixing("clip", reference={"layer.weight": ref}).mix(state, torch.eye(n))["layer.weight"]
    assert torch.equal(local, devs)


def test_clipping_without_a_source_namesake_centres_on_the_clients_median():
    state = {"probe": torch.tensor([[1.0], [2.0], [3.0], [100.0]])}
    out = RobustMixing("clip", clip=1.0).mix(state, torch.full((4, 4), 0.25))["probe"]
    # centre: lower median 2; deviations -1, 0, 1, 98; median norm 1 -> 98 clipped to 1: values 1, 2, 3, 3
    assert torch.allclose(out[0], torch.tensor([2.25]))


# ---------------------------------------------------------------------------------------------------------------
# off: as before, bit for bit; W unchanged

def test_off_is_the_plain_kernel_bit_for_bit():
    torch.manual_seed(0)
    n = 5
    state = {"s": torch.randn(n, 2, 7), "p": torch.randn(n, 3, 3), "count": torch.arange(n)}
    for w in (torch.full((n, n), 1.0 / n), torch.softmax(torch.randn(n, n), 1)):
        strategy = set_robust_mixing(FedAvg(), None)
        mixed = strategy.mix(state, w)
        plain = mix_state({k: v for k, v in state.items() if k != "count"}, w)
        assert all(torch.equal(mixed[k], plain[k]) for k in plain)
        assert torch.equal(mixed["count"], mix_models(state, w)["count"])
        assert all(torch.equal(a, b) for a, b in zip(strategy.mean_state(state, w[0]).values(),
                                                     weighted_mean_state(state, w[0]).values()))


def test_new_fields_at_their_defaults_leave_configs_and_keys_as_they_were():
    cfg = ExperimentConfig()
    assert "robust_mixing" not in cfg.to_dict() and "attack" not in cfg.to_dict()
    stored = sorted((REPO / "figures").glob("*/runs/*.json"))[:20]
    assert stored, "no stored run under figures/ to compare with"
    for path in stored:
        config = json.loads(path.read_text()).get("config")
        if not isinstance(config, dict) or "participation" not in config:
            continue
        again = ExperimentConfig.from_dict(config)
        assert again.to_dict() == config, path.name  # the stored config is today's config, field for field
        assert again.identity() == identity_of(config)
    on = ExperimentConfig(robust_mixing="median", attack="bn_x5:3,1")
    assert on.to_dict()["robust_mixing"] == "median" and on.to_dict()["attack"] == "bn_x5:1,3"
    assert on.identity() != cfg.identity()
    assert ExperimentConfig(robust_mixing="trimmed").robust_mixing == "trimmed:0.1"  # one spelling per meaning
    assert ExperimentConfig(robust_mixing="clip:2.0").robust_mixing == "clip:2"
    assert parse_robust_mixing(ExperimentConfig(robust_mixing="trimmed:0.123456789").robust_mixing).trim == 0.123456789


def _engine(model, local, strategy, backend="vectorized", robust=None, attack=None):
    torch.manual_seed(0)
    name, params = local
    return Engine(model, build_local(name, **params), set_robust_mixing(strategy, robust), n_clients=4,
                  backend=backend, attack=attack)


def _run(engine, batches):
    out = []
    for b in batches:
        res = engine.step(b)
        out.append((res, engine.local.shared_state(engine.bank)))
    return out


LOCALS = {"bn": ("bn", {}), "tent": ("tent", {"params": "all", "lr": 1e-3})}


@pytest.mark.parametrize("strategy", ["fedavg", "fedamp", "fedavgm", "ldawa", "fedavg_localstats"])
@pytest.mark.parametrize("local", sorted(LOCALS))
@pytest.mark.parametrize("mode", MODES[:2] + MODES[3:])
def test_backends_agree_with_robust_mixing_on(digits_model, local, strategy, mode):
    robust = parse_robust_mixing(mode, reference=reference_values(digits_model))
    batches = shifted_batches(steps=3)
    runs = [_run(_engine(digits_model, LOCALS[local], build_strategy(strategy), backend, robust,
                         Attack("mean_shift", (1,))), batches) for backend in ("loop", "vectorized")]
    assert_runs_agree(*runs, what=f"{local} + {strategy} with robust mixing {mode}")


class Watched(FedAvg):
    """FedAvg that keeps every mixed state it hands out."""

    def reset(self, n_clients):
        super().reset(n_clients)
        self.mixed = []

    def after_mix(self, mixed, inputs):
        self.mixed.append({k: v.clone() for k, v in mixed.items()})


@pytest.mark.parametrize("mode", MODES)
def test_w_is_the_strategys_and_the_mix_changes(digits_model, mode):
    robust = parse_robust_mixing(mode, reference=reference_values(digits_model))
    batches = shifted_batches(steps=3)
    attack = Attack("bn_x5", (1,))
    watched = [Watched(), Watched()]
    off = _run(_engine(digits_model, LOCALS["bn"], watched[0], attack=attack), batches)
    on = _run(_engine(digits_model, LOCALS["bn"], watched[1], robust=robust, attack=attack), batches)
    for (a, _), (b, _) in zip(off, on):
        assert np.array_equal(a.weights, b.weights)  # FedAvg's W: the same with robust mixing on
    for m_off, m_on in zip(*(w.mixed for w in watched)):  # the mix itself differs at every step
        assert any(not torch.allclose(m_off[k], m_on[k]) for k in m_off)
    # a strategy whose W depends on the state: at the first step (same inputs) W is the same
    first_off = _run(_engine(digits_model, LOCALS["bn"], build_strategy("fedamp"), attack=attack), batches[:1])
    first_on = _run(_engine(digits_model, LOCALS["bn"], build_strategy("fedamp"), robust=robust, attack=attack),
                    batches[:1])
    assert np.array_equal(first_off[0][0].weights, first_on[0][0].weights)


def test_a_strategy_with_its_own_mix_is_refused_unless_it_declares_it():
    class Momentum(FedAvg):
        name = "momentum_plugin"

        def mix(self, state, weights):
            return {k: v * 0.5 for k, v in state.items()}

    with pytest.raises(ValueError, match="robust mixing cannot be applied"):
        set_robust_mixing(Momentum(), parse_robust_mixing("median"))
    assert set_robust_mixing(Momentum(), None).robust_mixing is None

    class Declared(Momentum):
        robust_mixing_aware = True

        def mix(self, state, weights):
            return Strategy.mix(self, state, weights)

    assert set_robust_mixing(Declared(), parse_robust_mixing("median")).robust_mixing.mode == "median"


# ---------------------------------------------------------------------------------------------------------------
# attacks

def _step_state(n=5):
    torch.manual_seed(1)
    state = {"bn1": torch.rand(n, 2, 3) + 0.1, "conv.weight": torch.randn(n, 2, 2), "bn1.weight": torch.randn(n, 3),
             "count": torch.arange(n)}
    uploads = {"indicator": torch.randn(n, 4)}
    return state, uploads


@pytest.mark.parametrize("kind", ATTACKS)
@pytest.mark.parametrize("attackers", [(2,), (0, 3)])
def test_each_attack_rewrites_only_the_attackers_rows(kind, attackers):
    state, uploads = _step_state()
    before = {k: v.clone() for k, v in {**state, **uploads}.items()}
    new_state, new_uploads = Attack(kind, attackers).apply(state, uploads)
    assert all(torch.equal(v, before[k]) for k, v in {**state, **uploads}.items())  # inputs untouched
    honest = [i for i in range(5) if i not in attackers]
    got = {**new_state, **new_uploads}
    for k, v in got.items():
        assert torch.equal(v[honest], before[k][honest]), k
    a = list(attackers)
    lie = {
        "bn_x5": {"bn1": before["bn1"][a] * 5},
        "sign_flip": {"conv.weight": -before["conv.weight"][a], "bn1.weight": -before["bn1.weight"][a]},
        "mean_shift": {k: before[k][a] + 5 * before[k][a].abs().flatten(1).mean(1).view(-1, *[1] * (v.dim() - 1))
                       for k, v in before.items() if v.is_floating_point()},
    }[kind]
    for k, v in got.items():
        want = lie.get(k, before[k][a])
        torch.testing.assert_close(v[a], want, rtol=0, atol=0, msg=f"{kind} {k}")
    changed = {k for k, v in got.items() if not torch.equal(v, before[k])}
    assert changed == set(lie)


def test_attack_on_per_client_uploads_rewrites_the_same_rows():
    state, uploads = _step_state()
    attack = Attack("mean_shift", (1, 4))
    stacked, _ = attack.apply(state, uploads)
    per_client, _ = attack.apply({k: list(v.unbind(0)) for k, v in state.items()}, {})
    for k, rows in per_client.items():
        assert torch.equal(torch.stack(rows), stacked[k]), k


def test_attackers_outside_the_federation_are_refused(digits_model):
    with pytest.raises(ValueError, match=r"attacker id\(s\) \[4\]"):
        _engine(digits_model, LOCALS["bn"], build_strategy("fedavg"), attack=Attack("bn_x5", (4,)))


# ---------------------------------------------------------------------------------------------------------------
# config and command line

@pytest.mark.parametrize("field,value,says", [
    ("robust_mixing", "mean", "must be 'off', 'median', 'trimmed[:BETA]'"),
    ("robust_mixing", "trimmed:0.5", "in [0, 0.5)"),
    ("robust_mixing", "trimmed:nan", "in [0, 0.5)"),
    ("robust_mixing", "clip:0", "must be > 0"),
    ("robust_mixing", "clip:inf", "must be > 0"),
    ("robust_mixing", "median:3", "must be 'off', 'median'"),
    ("robust_mixing", 1, "must be a string"),
    ("attack", "bn_x5", "must be 'none' or 'KIND:IDS'"),
    ("attack", "flip:1", "attack kind must be one of"),
    ("attack", "sign_flip:1,1", "distinct client ids"),
    ("attack", "sign_flip:-1", "must be 'none' or 'KIND:IDS'"),
    ("attack", "bn_x5:3", "attacker id(s) [3] are not clients 0..2"),
    ("attack", None, "must be a string"),
])
def test_config_errors_are_one_line_naming_the_field(field, value, says):
    with pytest.raises(ValueError) as err:
        ExperimentConfig(clients=3, **{field: value})
    text = str(err.value)
    assert text.startswith(f"config field {field!r}: ") and "\n" not in text and says in text, text


def test_a_plugin_strategy_that_would_ignore_robust_mixing_is_refused_by_the_config(monkeypatch):
    from ftta_core import strategies

    class OwnMix(FedAvg):
        name = "own_mix_test"

        def mix(self, state, weights):
            return dict(state)

    monkeypatch.setitem(strategies.STRATEGIES, "own_mix_test", OwnMix)
    ExperimentConfig(strategy="own_mix_test")  # fine without robust mixing
    with pytest.raises(ValueError, match=r"^config field 'robust_mixing': strategy 'own_mix_test' mixes by its own"):
        ExperimentConfig(strategy="own_mix_test", robust_mixing="median")


def test_command_line_flags_reach_the_config():
    from ftta_core.cli_config import CommandParser, add_config_options, config_values

    parser = CommandParser()
    add_config_options(parser)
    args = parser.parse_args(["--robust-mixing", "clip:3", "--attack", "sign_flip:0,2"])
    assert config_values(args) == {"robust_mixing": "clip:3", "attack": "sign_flip:0,2"}
    assert "--robust-mixing" in parser.format_help() and "--attack" in parser.format_help()


# ---------------------------------------------------------------------------------------------------------------
# a real run

def _digits(**kw):
    return ExperimentConfig(dataset="embedded_digits", clients=8, corruptions="gaussian_noise,contrast",
                            images_per_client=40, batch_size=10, local="tent", local_params={"lr": 1e-3},
                            strategy="fedavg", device="cpu", smoke=True, **kw)


def test_robust_mixing_limits_a_sign_flipping_attacker_on_a_real_stream():
    honest = run_experiment(_digits()).summary
    off = run_experiment(_digits(attack="sign_flip:1")).summary
    on_run = run_experiment(_digits(attack="sign_flip:1", robust_mixing="median"))
    on = on_run.summary
    assert "accuracy_honest" not in honest and off["attackers"] == [1]
    # accuracy_honest: the clients other than the attacker, after mixing
    kept = on_run.steps[on_run.steps["client"] != 1]
    assert on["accuracy_honest"] == pytest.approx(100 * kept["correct_mixed"].sum() / kept["n"].sum())
    damage_off = honest["accuracy"] - off["accuracy_honest"]
    damage_on = honest["accuracy"] - on["accuracy_honest"]
    assert damage_off > 20, (honest["accuracy"], off["accuracy_honest"])  # the attack hurts without it
    assert damage_on < damage_off / 4, (honest["accuracy"], off["accuracy_honest"], on["accuracy_honest"])
    assert on["rejected_uploads"] == 0  # robust mixing's doing, not the gate's


def test_a_flower_server_refuses_a_simulated_attack_rather_than_ignoring_it():
    pytest.importorskip("flwr")
    from ftta_core.flower.engine_app import FlowerServer

    with pytest.raises(ValueError, match=r"^config field 'attack': 'bn_x5:0' is simulated by the engine"):
        FlowerServer(ExperimentConfig(clients=3, attack="bn_x5:0"), steps=2)
