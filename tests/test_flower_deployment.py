"""The ftta engine adapter on a real Flower deployment over 127.0.0.1: one ``flower-superlink --insecure``, one
``flower-supernode`` per client (``--node-config client=i``), the app (``ftta_core/flower/app``) submitted with
``flwr run``. The same app also runs on Flower's simulation engine
(a ``--simulation`` SuperLink, Ray). The deployed run's per-step per-client correct counts must equal ``run_experiment``'s on the loop
backend (same seed and stream), W and the mixed models' logits must agree to ``TOLERANCE``.

The processes are started and stopped by ``ftta_core.flower.loopback.Loopback`` (each in its own session; its
whole process group terminated, then killed, in ``finally``; see its docstring for the SuperNode flags).
The ServerApp rewrites its record after every step; the test waits for its ``status`` to leave ``running``.
"""
from __future__ import annotations

import json
import time
from typing import Dict, Optional

import numpy as np
import pytest
import torch

from ftta_core.loop import Engine
from ftta_core.experiment import ExperimentConfig, build_stream, local_params, run_experiment, strategy_params
from ftta_core.flower import run_inprocess
from ftta_core.flower.deploy import client_app, run_config_of, server_app
from ftta_core.flower.loopback import Loopback, cli_available, read_record
from ftta_core.rng import derive_seed
from ftta_core.strategies import build_strategy
from ftta_core.training import load_source_model
from ftta_core.tta import build_local

TOLERANCE = 1e-5  # max |W| and |logit| difference; correct counts must be equal. Observed: 0.
CLIENTS, STEPS = 2, 2
RUN_TIMEOUT = 900.0  # the whole run (each message starts a fresh ClientApp process: ~10 s each on a busy CPU)

needs_cli = pytest.mark.skipif(not cli_available(),
                                reason="flwr's flower-superlink / flower-supernode not installed next to python")


def engine_reference(cfg: ExperimentConfig, stream, steps: int, absent_from: Optional[Dict[int, int]] = None):
    """The loop engine step by step: W [T, N, N], correct counts after mixing [T, N] and the mixed models' logits
    [T, N, B, K]. ``absent_from`` {client: step}: that client is absent (partial participation: no weight in W,
    keeps its own model) from that step on."""
    torch.manual_seed(derive_seed(cfg.seed, "engine"))
    engine = Engine(load_source_model(cfg.model_name), build_local(cfg.local, **local_params(cfg)),
                    build_strategy(cfg.strategy, **strategy_params(cfg)), cfg.clients, "loop", "cpu")
    if absent_from:
        def present(step: int) -> torch.Tensor:
            return torch.tensor([step < absent_from.get(i, steps + 1) for i in range(cfg.clients)])

        engine.present = present
    weights, correct, logits = [], [], []
    for t in range(steps):
        batch = stream.batch(t)
        res = engine.step(batch)
        weights.append(res.weights)
        correct.append(res.correct_mixed)
        logits.append(engine.local.predict(engine.bank, batch.images).logits)
    return np.stack(weights), np.stack(correct), torch.stack(logits)


def _engine_logits(cfg: ExperimentConfig, stream, steps: int) -> torch.Tensor:
    """The loop engine's mixed models' logits per step [T, N, B, K]."""
    return engine_reference(cfg, stream, steps)[2]


def wait_for_end(net: Loopback, out, run_id: int, timeout: float, expect_dead: tuple = ()) -> dict:
    """Wait until the record at ``out`` leaves status 'running' and Flower's run is finished; returns the record
    with Flower's run status under 'flower_status'."""
    def ended() -> bool:
        record = read_record(out)
        if record is not None and record["status"] != "running":
            return True
        if "Traceback" in net.log("superlink"):  # the ServerApp failed before writing its record: fail now
            raise AssertionError(f"run {run_id}: the ServerApp raised\n{net.report()}")
        return False

    net.wait(f"run {run_id} to end (record {out})", ended, timeout, interval=1, expect_dead=expect_dead)
    record = read_record(out)
    status: dict = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # Flower records the ServerApp's outcome once its process exits
        status = net.run_status(run_id)
        if str(status.get("status", "")).startswith("finished"):
            break
        time.sleep(1)
    record["flower_status"] = status
    return record


def test_deploy_apps_in_process_keep_client_state_in_context(tmp_path):
    """The deployable apps (client state pickled into context.state between messages) on the in-process grid:
    Tent (adapted parameters + optimiser state persist) with FedAMP equals run_experiment."""
    cfg = ExperimentConfig(dataset="embedded_digits", clients=3, local="tent", strategy="fedamp", backend="loop",
                           device="cpu", max_steps=3, seed=0)
    out = tmp_path / "result.json"
    run_inprocess(server_app, client_app, [{"client": i} for i in range(cfg.clients)],
                  dict(run_config_of(cfg, 3), timeout=60.0, out=str(out)))
    record = json.loads(out.read_text())
    stream = build_stream(cfg, "cpu")
    res = run_experiment(cfg, stream=stream)
    expected = res.steps.pivot(index="step", columns="client", values="correct_mixed").to_numpy()
    np.testing.assert_array_equal(np.array(record["correct"]), expected)
    np.testing.assert_allclose(np.array(record["weights"]), res.collaboration, atol=TOLERANCE, rtol=0)
    diff = float((torch.tensor(record["logits"]) - _engine_logits(cfg, stream, 3)).abs().max())
    assert diff <= TOLERANCE, f"max |logit difference| {diff} > {TOLERANCE}"


@needs_cli
def test_engine_adapter_on_loopback_superlink_and_supernodes(tmp_path):
    _deploy_and_compare(tmp_path, simulation=False)


@needs_cli
def test_engine_adapter_on_flower_simulation_engine(tmp_path):
    """A SuperLink with ``--simulation``: Flower's simulation engine (Ray) runs the ClientApps as virtual SuperNodes
    (their node config is ``partition-id``), submitted with ``flwr run --federation-config num-supernodes=N``."""
    pytest.importorskip("ray", reason="Flower's simulation engine needs ray (pip install ray)")
    _deploy_and_compare(tmp_path, simulation=True)


def _deploy_and_compare(tmp_path, simulation: bool) -> None:
    cfg = ExperimentConfig(dataset="embedded_digits", clients=CLIENTS, local="bn", strategy="fedavg",
                           backend="loop", device="cpu", max_steps=STEPS, seed=0)
    out = tmp_path / "result.json"
    t0 = time.monotonic()
    with Loopback(tmp_path) as net:
        net.start_superlink(simulation=simulation)
        if not simulation:
            for i in range(CLIENTS):
                net.start_supernode(f"supernode{i}", i)
            net.wait_registered(CLIENTS)
        run_id = net.submit(dict(run_config_of(cfg, STEPS), timeout=RUN_TIMEOUT, out=str(out)),
                            federation_config=f"num-supernodes={CLIENTS}" if simulation else "")
        record = wait_for_end(net, out, run_id, RUN_TIMEOUT)
    wall = time.monotonic() - t0
    assert not net.alive(), f"still running after stop: {net.alive()}"

    assert record["status"] == "finished", record["status"]
    assert record["flower_status"].get("status") == "finished:completed", record["flower_status"]
    assert record["nodes"] == CLIENTS and record["messages"] == (STEPS + 1) * CLIENTS
    assert record["bytes_up"] > 0 and record["bytes_down"] > 0
    stream = build_stream(cfg, "cpu")
    res = run_experiment(cfg, stream=stream)
    expected = res.steps.pivot(index="step", columns="client", values="correct_mixed").to_numpy()
    np.testing.assert_array_equal(np.array(record["correct"]), expected,
                                  err_msg="deployed per-step per-client correct counts != run_experiment's")
    np.testing.assert_allclose(np.array(record["weights"]), res.collaboration, atol=TOLERANCE, rtol=0)
    logits = _engine_logits(cfg, stream, STEPS)
    diff = float((torch.tensor(record["logits"]) - logits).abs().max())
    assert diff <= TOLERANCE, f"max |logit difference| {diff} > {TOLERANCE}"
    kind = "simulation engine (Ray)" if simulation else "loopback deployment"
    print(f"{kind}: {CLIENTS} SuperNodes x {STEPS} steps in {wall:.0f}s, max |logit diff| {diff}")
