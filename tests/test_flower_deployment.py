"""The ftta engine adapter on a real Flower deployment over 127.0.0.1: one ``flower-superlink --insecure``, one
``flower-supernode`` per client (``--node-config client=i``), the app (``ftta_core/flower/app``) submitted with
``flwr run``. The same app also runs on Flower's simulation engine
(a ``--simulation`` SuperLink, Ray). The deployed run's per-step per-client correct counts must equal ``run_experiment``'s on the loop
backend (same seed and stream), W and the mixed models' logits must agree to ``TOLERANCE``.

Every process the test starts is started in its own session and its whole process group (the SuperExec, ServerApp
and ClientApp processes Flower spawns beneath it) is terminated, then killed, in ``finally``.
Flower 1.41's ``flower-supernode`` has no ``--disable-runtime-dependency-installation`` flag (it rejects it): on the
SuperNode runtime installation is off unless ``--allow-runtime-dependency-installation`` is given, so the test
passes the disable flag to the SuperLink only and never the allow flag to the SuperNodes.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import torch

from ftta_core.engine.loop import Engine
from ftta_core.experiment import ExperimentConfig, build_stream, local_params, run_experiment, strategy_params
from ftta_core.flower import run_inprocess
from ftta_core.flower.deploy import APP_DIR, client_app, run_config_of, server_app
from ftta_core.rng import derive_seed
from ftta_core.strategies import build_strategy
from ftta_core.training import load_source_model
from ftta_core.tta import build_local

BIN = Path(sys.executable).parent
TOLERANCE = 1e-5  # max |W| and |logit| difference; correct counts must be equal. Observed: 0.
CLIENTS, STEPS = 2, 2
START_TIMEOUT = 120.0  # SuperLink listening / SuperNodes registered
RUN_TIMEOUT = 900.0  # the whole run (each message starts a fresh ClientApp process: ~10 s each on a busy CPU)

needs_cli = pytest.mark.skipif(not (BIN / "flower-superlink").exists() or not (BIN / "flower-supernode").exists(),
                                reason="flwr's flower-superlink / flower-supernode not installed next to python")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return "(no output)"


class Processes:
    """Started processes with their logs; ``stop`` terminates then kills each one's process group."""

    def __init__(self, workdir: Path, env: Dict[str, str]) -> None:
        self.workdir, self.env = workdir, env
        self.procs: List[tuple] = []

    def start(self, name: str, args: List[str]) -> subprocess.Popen:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as fh:
            proc = subprocess.Popen([str(BIN / args[0]), *args[1:]], stdout=fh, stderr=subprocess.STDOUT,
                                    cwd=self.workdir, env=self.env, start_new_session=True)
        self.procs.append((name, proc, log))
        return proc

    def report(self) -> str:
        return "\n".join(f"--- {name} (pid {p.pid}, exit {p.poll()}) last lines of {log}:\n{_tail(log)}"
                         for name, p, log in self.procs)

    def check_alive(self) -> None:
        dead = [name for name, p, _ in self.procs if p.poll() is not None]
        if dead:
            pytest.fail(f"{dead} exited early\n{self.report()}")

    def stop(self) -> None:
        for _, proc, _ in reversed(self.procs):
            self._signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for _, proc, _ in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self._signal(proc, signal.SIGKILL)  # the group: children that outlived their parent too
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # start_new_session: the group id is the started process's id
        except (ProcessLookupError, PermissionError):
            pass


def _wait(what: str, cond, timeout: float, procs: Processes, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        procs.check_alive()
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{procs.report()}")
        time.sleep(interval)


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _toml_value(v) -> str:
    return json.dumps(v) if isinstance(v, str) else repr(v)  # a JSON string is a TOML basic string


def _engine_logits(cfg: ExperimentConfig, stream, steps: int) -> torch.Tensor:
    """The loop engine's mixed models' logits per step [T, N, B, K]."""
    torch.manual_seed(derive_seed(cfg.seed, "engine"))
    engine = Engine(load_source_model(cfg.model_name), build_local(cfg.local, **local_params(cfg)),
                    build_strategy(cfg.strategy, **strategy_params(cfg)), cfg.clients, "loop", "cpu")
    out = []
    for t in range(steps):
        batch = stream.batch(t)
        engine.step(batch)
        out.append(engine.local.predict(engine.bank, batch.images).logits)
    return torch.stack(out)


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
    home, out = tmp_path / "flwr-home", tmp_path / "result.json"
    home.mkdir()
    env = dict(os.environ, FLWR_HOME=str(home), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")  # Flower spawns flower-superexec etc. by name
    link = _free_port()
    node_ports = [_free_port() for _ in range(CLIENTS)]
    # the connection `flwr run` uses (the SuperLink serves its Control, Fleet and Runtime APIs on one HTTP port)
    (home / "config.toml").write_text(f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
                                      f'address = "127.0.0.1:{link}"\ninsecure = true\n')
    overrides = dict(run_config_of(cfg, STEPS), timeout=RUN_TIMEOUT, out=str(out))
    (tmp_path / "run-config.toml").write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in overrides.items()))

    procs = Processes(tmp_path, env)
    t0 = time.monotonic()
    try:
        procs.start("superlink", ["flower-superlink", "--insecure", "--disable-runtime-dependency-installation",
                                  "--port", str(link)] + (["--simulation"] if simulation else []))
        _wait(f"the SuperLink to listen on 127.0.0.1:{link}", lambda: _listening(link), START_TIMEOUT, procs)
        for i, port in enumerate([] if simulation else node_ports):
            procs.start(f"supernode{i}", ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{link}",
                                          "--port", str(port), "--node-config", f"client={i}"])
        link_log = tmp_path / "superlink.log"
        if not simulation:
            _wait(f"{CLIENTS} SuperNodes to register",
                  lambda: link_log.read_text(errors="replace").count("Activated node_id") >= CLIENTS, START_TIMEOUT,
                  procs)
        sim = ["--federation-config", f"num-supernodes={CLIENTS}"] if simulation else []
        run = subprocess.run([str(BIN / "flwr"), "run", str(APP_DIR), "loopback", "--run-config",
                              str(tmp_path / "run-config.toml"), "--format", "json", *sim],
                             capture_output=True, text=True, env=env, cwd=tmp_path, timeout=START_TIMEOUT)
        if run.returncode != 0 or '"success": true' not in run.stdout:
            pytest.fail(f"flwr run failed (exit {run.returncode}):\n{run.stdout}\n{run.stderr}\n{procs.report()}")
        run_id = json.loads(run.stdout[run.stdout.index("{"):])["run-id"]

        def finished() -> bool:
            if out.exists():
                return True
            if "Traceback" in link_log.read_text(errors="replace"):  # the ServerApp failed: fail now, not at timeout
                pytest.fail(f"run {run_id}: the ServerApp raised\n{procs.report()}")
            return False

        _wait(f"run {run_id} to write {out}", finished, RUN_TIMEOUT, procs, interval=2)
        record = json.loads(out.read_text())
    finally:
        procs.stop()
    wall = time.monotonic() - t0
    alive = [name for name, p, _ in procs.procs if p.poll() is None]
    assert not alive, f"still running after stop: {alive}"

    assert record["nodes"] == CLIENTS and record["messages"] == 2 * STEPS * CLIENTS
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
